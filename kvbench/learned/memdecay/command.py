"""`kvbench memdecay`: calibrate the MemDecay press of a model from measured attention lifetimes."""

import click

from kvbench.learned.common.command import device_option, model_option, out_option
from kvbench.validation import Number

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
@click.option("--length", type=int, default=None, help="Context length in tokens (default: the suite's).")
@click.option(
    "--samples",
    type=click.IntRange(min=1),
    default=None,
    help="Samples per task (default: the suite's).",
)
@click.option("--seed", default=CALIBRATION_SEED, show_default=True, type=click.IntRange(min=1000))
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
    from kvbench.learned.memdecay.calibration import measure, write_calibration
    from kvbench.models import check_device, load_model, resolve
    from kvbench.planning import DEFAULT_LENGTH, plan_tasks
    from kvbench.results import check_folder_writable

    suite = suite or (None if task_list else DEFAULT_SUITE)
    plan = plan_tasks(suite, task_list, length, samples)
    suite_name, names, samples = plan.suite, plan.tasks, plan.samples
    length = plan.length or DEFAULT_LENGTH  # tasks named without a suite, as `kvbench run` does
    check_folder_writable(out, "--out folder")  # what can fail after the measurement fails before it
    check_device(device)
    resolve(model)
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
