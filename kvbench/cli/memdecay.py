"""`kvbench memdecay`: calibrate the MemDecay press of a model from measured attention lifetimes."""

import click

from kvbench.cli.learned import device_option, model_option, out_option
from kvbench.cli.types import Number, Whole

CALIBRATION_SEED = 10_000  # evaluation draws its samples with seeds 0..999: calibration never sees them
DEFAULT_SUITE = "agent-trace"  # chat turns with every region: system, user, assistant, tool, scratchpad


@click.group("memdecay")
def memdecay():
    """MemDecay's per-region half-lives and base priorities, measured on a model (see `calibrate`).

    \b
    kvbench memdecay calibrate --samples 2 --out presses/memdecay/smollm2-135m
    """


@memdecay.command()
@out_option("Output folder.")
@model_option()
@device_option
@click.option(
    "--suite",
    default=None,
    help=f"Suite from tasks/*.yaml whose tasks have chat turns [default: {DEFAULT_SUITE}].",
)
@click.option(
    "--task", "task_list", multiple=True, help="Task name (repeatable); overrides the suite's tasks."
)
@click.option("--length", type=Whole(), default=None, help="Context length in tokens (default: the suite's).")
@click.option(
    "--samples",
    type=Whole(1),
    default=None,
    help="Samples per task (default: the suite's).",
)
@click.option("--seed", default=CALIBRATION_SEED, show_default=True, type=Whole(1000))
@click.option(
    "--threshold",
    default=1.0,
    show_default=True,
    type=Number(0, low_open=True),
    help="A token is attended when it gets more than this times its uniform share of a query's attention.",
)
def calibrate(out, model, device, suite, task_list, length, samples, seed, threshold):
    """Measure how long each region's tokens stay attended, fit half-lives and base priorities, write
    calibration.json (read by the memdecay press), card.json and attention_vs_age.png to --out."""
    from kvbench import tasks
    from kvbench.bridge.models import check_device, load_model, resolve
    from kvbench.harness.planning import DEFAULT_LENGTH, plan_tasks
    from kvbench.store.results import check_folder_writable

    suite = suite or (None if task_list else DEFAULT_SUITE)
    plan = plan_tasks(suite, task_list, length, samples)
    suite_name, names, samples = plan.suite, plan.tasks, plan.samples
    length = plan.length or DEFAULT_LENGTH  # tasks named without a suite, as `kvbench run` does
    check_folder_writable(out, "--out folder")  # what can fail after the measurement fails before it
    check_device(device)
    resolve(model)
    from kvbench.learned.memdecay.calibration import measure, write_calibration  # torch: after the checks

    llm, tokenizer = load_model(model, device=device)
    chosen = [
        sample
        for name in names
        for sample in tasks.load_samples(name, length=length, samples=samples, seed=seed, tokenizer=tokenizer)
    ]
    stats = measure(llm, tokenizer, chosen, threshold, log=click.echo)
    task_args = (
        f"--suite {suite_name}" if suite_name and not task_list else " ".join(f"--task {n}" for n in names)
    )
    command = (
        f"kvbench memdecay calibrate --model {model} --out {out} {task_args} --length {length} "
        f"--samples {samples} --seed {seed} --threshold {threshold:g}"
    )
    card = {"tasks": names, "length": length, "samples": len(chosen), "seed": seed, "command": command}
    calibration = write_calibration(out, llm, stats, card)
    for name, region in calibration["regions"].items():
        note = "" if region["measured"] else "  (not in the samples: pooled fit)"
        click.echo(
            f"{name:<10} half-life {region['half_life']:>8.1f} steps  priority {region['priority']:.3f}"
            f"  tokens {region['tokens']}{note}"
        )
    click.echo(f"calibration: {out}")


@memdecay.command()
@out_option("Output folder: curves.csv, fits.csv, lifetimes.png, card.json.")
@model_option()
@device_option
@click.option("--suite", default=DEFAULT_SUITE, show_default=True, help="Suite whose tasks have chat turns.")
@click.option("--length", type=Whole(), default=None, help="Context length in tokens (default: the suite's).")
@click.option("--samples", type=Whole(2), default=4, show_default=True, help="Samples per task.")
@click.option("--new-tokens", type=Whole(0), default=128, show_default=True)
@click.option("--seed", default=CALIBRATION_SEED, show_default=True, type=Whole(1000))
@click.option("--resamples", default=400, show_default=True, type=Whole(10))
def lifetimes(out, model, device, suite, length, samples, new_tokens, seed, resamples):
    """Attention lifetimes per region over long decoding, fitted three ways (the shipped early-drop fit,
    the whole curve, the area under it) with bootstrap intervals over samples (kvbench.learned.memdecay.
    lifetimes); nothing the press reads is written."""
    import json

    from kvbench import tasks
    from kvbench.bridge.models import check_device, load_model, resolve
    from kvbench.harness.planning import plan_tasks
    from kvbench.store.results import check_folder_writable

    plan = plan_tasks(suite, (), length, samples)
    check_folder_writable(out, "--out folder")
    check_device(device)
    resolve(model)
    from kvbench.learned.memdecay.lifetimes import measure_samples, write_results  # torch: after the checks

    llm, tokenizer = load_model(model, device=device)
    chosen = [
        sample
        for name in plan.tasks
        for sample in tasks.load_samples(
            name, length=plan.length, samples=plan.samples, seed=seed, tokenizer=tokenizer
        )
    ]
    counts = measure_samples(llm, tokenizer, chosen, new_tokens=new_tokens, log=click.echo)
    command = (
        f"kvbench memdecay lifetimes --model {model} --out {out} --suite {suite} --length {plan.length} "
        f"--samples {plan.samples} --new-tokens {new_tokens} --seed {seed} --resamples {resamples}"
    )
    card = {
        "model": model,
        "tasks": plan.tasks,
        "length": plan.length,
        "samples": len(chosen),
        "new_tokens": new_tokens,
        "seed": seed,
        "command": command,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "card.json").write_text(json.dumps(card, indent=1) + "\n")
    result = write_results(out, counts, card, resamples)
    for (curve, quantity), (value, low, high) in result["fits"].items():
        click.echo(f"{curve:<24} {quantity:<9} {value:10.4g}  [{low:.4g}, {high:.4g}]")
    click.echo(f"area window: ages 1..{result['window']}; written to {out}")
