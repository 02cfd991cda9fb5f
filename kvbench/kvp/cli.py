"""`kvbench kvp`: make KVP agents for a model (datagen, then train) and look at how good they are (report)."""

from pathlib import Path

import click

from kvbench.kvp.train import TrainConfig
from kvbench.models import EMBEDDED

# Not qa_1/qa_2: their samples are the datasets' questions in order whatever the seed (overlap evaluation).
DEFAULT_TASKS = (
    "niah_single_1,niah_single_2,niah_single_3,niah_multikey_1,niah_multikey_2,niah_multikey_3,"
    "niah_multivalue,niah_multiquery,vt,cwe,fwe"
)
EVALUATION_SEEDS = 1000  # evaluation draws its samples with seeds 0..999
DEFAULTS = TrainConfig()


def int_list(ctx, param, value: str | None) -> list[int] | None:
    if value is None:
        return None
    try:
        return [int(item) for item in value.split(",")]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {value!r}") from None


def task_list(ctx, param, value: str) -> list[str]:
    from kvbench.tasks import ruler

    names = [name.strip() for name in value.split(",") if name.strip()]
    for name in names:
        if name not in ruler.TASKS:
            raise click.BadParameter(f"{name!r} is not a RULER task (see `kvbench tasks`)")
        if ruler.family(name) == "qa":
            raise click.BadParameter(
                f"{name} samples do not change with the seed: they would overlap evaluation"
            )
    return names


@click.group("kvp")
def kvp():
    """Make KVP eviction agents for a model: datagen, then train; report shows how good they are.

    \b
    kvbench kvp datagen --out data/kvp/smollm2-135m
    kvbench kvp train --data data/kvp/smollm2-135m --out presses/kvp/smollm2-135m
    kvbench kvp report presses/kvp/smollm2-135m --plot kvp.png
    """


@kvp.command()
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path), help="Data folder.")
@click.option("--model", default=EMBEDDED, show_default=True, help="Embedded alias, hub id or local folder.")
@click.option("--device", default="cpu", show_default=True, help="torch device, e.g. cuda.")
@click.option("--tasks", default=DEFAULT_TASKS, show_default=True, callback=task_list, help="RULER tasks.")
@click.option("--length", default=1024, show_default=True, type=click.IntRange(min=1), help="Prompt tokens.")
@click.option(
    "--samples", default=12, show_default=True, type=click.IntRange(min=1), help="Prompts per task."
)
@click.option(
    "--seed",
    default=10_000,
    show_default=True,
    type=click.IntRange(min=EVALUATION_SEEDS),
    help="Sample seed; evaluation uses 0..999, so training data starts at 1000.",
)
@click.option(
    "--gen-tokens",
    default=32,
    show_default=True,
    type=click.IntRange(min=1),
    help="Greedy continuation whose attention defines utility (capped by the task's answer length).",
)
@click.option(
    "--val-fraction",
    default=0.1,
    show_default=True,
    type=click.FloatRange(0, 1, max_open=True),
    help="Share of each task's prompts kept for validation.",
)
def datagen(out, model, device, tasks, length, samples, seed, gen_tokens, val_fraction):
    """Store the keys, values and future utility of every (layer, KV head) on RULER training prompts.

    Resumable: rerun the same command to continue a stopped run.
    """
    from kvbench.kvp.datagen import DatagenConfig, generate_data, read_manifest
    from kvbench.models import check_device, context_limit, load_model, resolve
    from kvbench.results import check_writable
    from kvbench.tasks import ruler

    for task in tasks:
        if length < ruler.min_length(task):
            raise click.BadParameter(
                f"{length} is below the minimum of task {task!r} ({ruler.min_length(task)})"
            )
    if out.exists() and not out.is_dir():
        raise click.BadParameter(f"{str(out)!r} is a file", param_hint="--out")
    check_writable(out)
    read_manifest(out)  # a corrupt manifest of an earlier run fails now, not after the model loads
    check_device(device)
    resolve(model)
    limit = context_limit(model)
    if limit is not None and length > limit:
        raise click.BadParameter(
            f"{length} exceeds the {limit}-token context of model {model!r}", param_hint="--length"
        )
    config = DatagenConfig(tasks, length, samples, seed, gen_tokens, val_fraction)
    llm, tokenizer = load_model(model, device=device)
    manifest = generate_data(llm, tokenizer, out, config)
    click.echo(f"{len(manifest['shards'])} prompts in {out}")


@kvp.command()
@click.option(
    "--data", required=True, type=click.Path(file_okay=False, path_type=Path), help="Datagen folder."
)
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path), help="Agents folder.")
@click.option("--layers", callback=int_list, help="Comma-separated layers to train (default: all).")
@click.option("--heads", callback=int_list, help="Comma-separated KV heads of each layer (default: all).")
@click.option("--steps", default=DEFAULTS.steps, show_default=True, type=click.IntRange(min=1))
@click.option(
    "--prompts", default=DEFAULTS.prompts, show_default=True, type=click.IntRange(min=1), help="Per step."
)
@click.option(
    "--tokens",
    default=DEFAULTS.tokens,
    show_default=True,
    type=click.IntRange(min=2),
    help="Drawn per prompt.",
)
@click.option(
    "--rankings",
    default=DEFAULTS.rankings,
    show_default=True,
    type=click.IntRange(min=2),
    help="K per prompt.",
)
@click.option("--lr", default=DEFAULTS.lr, show_default=True, type=click.FloatRange(min=0, min_open=True))
@click.option(
    "--hidden", default=DEFAULTS.hidden, show_default=True, type=click.IntRange(min=1), help="MLP width."
)
@click.option("--eval-every", default=DEFAULTS.eval_every, show_default=True, type=click.IntRange(min=1))
@click.option("--seed", default=DEFAULTS.seed, show_default=True)
def train(data, out, layers, heads, steps, prompts, tokens, rankings, lr, hidden, eval_every, seed):
    """Train one agent per (layer, KV head) on datagen output and save the best (by validation) to --out."""
    from kvbench.kvp.train import KVPData
    from kvbench.kvp.train import train as train_agents
    from kvbench.results import check_writable

    KVPData(data)  # a missing or corrupt manifest fails before any work
    check_writable(out)
    config = TrainConfig(
        steps=steps,
        prompts=prompts,
        tokens=tokens,
        rankings=rankings,
        lr=lr,
        warmup=min(DEFAULTS.warmup, steps // 10),
        eval_every=eval_every,
        hidden=hidden,
        seed=seed,
    )
    train_agents(data, out, config, layers=layers, kv_heads=heads, log=click.echo)


@kvp.command()
@click.argument("agents", type=click.Path(file_okay=False, path_type=Path))
@click.option("--plot", type=click.Path(dir_okay=False, path_type=Path), help="Write a PNG plot per layer.")
def report(agents, plot):
    """Validation cost per head of the agents in AGENTS vs oracle, random, knorm and recency (1 = oracle)."""
    from kvbench.kvp.checkpoint import load_card, plot_validation, validation_table

    card = load_card(agents)
    table = validation_table(card)
    click.echo(table.to_string(index=False, float_format="{:.3f}".format))
    means = table.drop(columns=["layer", "kv_head"]).mean()
    click.echo("mean   " + "  ".join(f"{name} {value:.3f}" for name, value in means.items()))
    if plot:
        plot_validation(card, plot)
        click.echo(f"plot: {plot}")
