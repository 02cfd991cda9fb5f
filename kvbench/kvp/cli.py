"""`kvbench kvp`: make KVP agents for a model (datagen, then train) and look at how good they are (report)."""

from pathlib import Path

import click

from kvbench.kvp.agent import ARCHS
from kvbench.kvp.train import TrainConfig
from kvbench.models import EMBEDDED
from kvbench.tasks.mixture import MIXTURES, RULER_TRAINING_TASKS

DEFAULT_LENGTH, DEFAULT_SAMPLES = 1024, 12  # with RULER_TRAINING_TASKS: the "ruler" mixture
DEFAULT_TASKS = ",".join(RULER_TRAINING_TASKS)  # DistillCache's datagen takes the same default
EVALUATION_SEEDS = 1000  # evaluation draws its samples with seeds 0..999
DEFAULTS = TrainConfig()


def int_list(ctx, param, value: str | None) -> list[int] | None:
    if value is None:
        return None
    try:
        return [int(item) for item in value.split(",")]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {value!r}") from None


def seedless_reason(task: str) -> str | None:
    """Why a task's samples are known not to change with the seed (None if not known): such a task would
    train on evaluation's samples. Datagen also checks every task by drawing a sample at two seeds."""
    from kvbench.tasks import longbench, ruler

    if task in ruler.TASKS and ruler.family(task) == "qa":
        return "RULER's qa samples are the datasets' questions in order"
    if task in longbench.TASKS:
        return "LongBench samples are the dataset's rows in order"
    return None


def check_training_task(task: str, length: int | None = None) -> None:
    """A task datagen can draw training prompts from, at `length` if given; click.BadParameter if not."""
    from kvbench import tasks

    if task not in tasks.task_names():
        raise click.BadParameter(f"{task!r} is not a task (see `kvbench tasks`)")
    if seedless_reason(task):
        raise click.BadParameter(
            f"{task} samples do not change with the seed: they would overlap evaluation "
            f"({seedless_reason(task)})"
        )
    minimum = tasks.family_of(task).min_length(task)
    if length is not None and length < minimum:
        raise click.BadParameter(f"{length} is below the minimum of task {task!r} ({minimum})")


def task_list(ctx, param, value: str | None) -> list[str] | None:
    if value is None:
        return None
    names = [name.strip() for name in value.split(",") if name.strip()]
    if not names:
        raise click.BadParameter("name at least one task")
    for name in names:
        check_training_task(name)
    return names


def mixture_name(ctx, param, value: str | None) -> str | None:
    if value is not None and value not in MIXTURES:
        raise click.BadParameter(f"unknown mixture {value!r} (choose one of: {', '.join(MIXTURES)})")
    return value


@click.group("kvp")
def kvp():
    """Make KVP eviction agents for a model: datagen, then train; report shows how good they are.

    \b
    kvbench kvp datagen --out data/kvp/smollm2-135m [--mixture broad]
    kvbench kvp train --data data/kvp/smollm2-135m --out presses/kvp/smollm2-135m [--arch apple]
    kvbench kvp report presses/kvp/smollm2-135m --plot kvp.png
    """


@kvp.command()
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path), help="Data folder.")
@click.option("--model", default=EMBEDDED, show_default=True, help="Embedded alias, hub id or local folder.")
@click.option("--device", default="cpu", show_default=True, help="torch device, e.g. cuda.")
@click.option(
    "--mixture",
    callback=mixture_name,
    help=f"A training mixture of kvbench.tasks.mixture: {', '.join(MIXTURES)} (tasks at lengths, prompts "
    "each); instead of --tasks/--length/--samples.",
)
@click.option(
    "--tasks",
    callback=task_list,
    help="Comma-separated tasks of any family, all at --length [default: RULER's 11 seeded tasks].",
)
@click.option("--length", type=click.IntRange(min=1), help=f"Prompt tokens [default: {DEFAULT_LENGTH}].")
@click.option("--samples", type=click.IntRange(min=1), help=f"Prompts per task [default: {DEFAULT_SAMPLES}].")
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
    help="Share of each part's prompts kept for validation.",
)
def datagen(out, model, device, mixture, tasks, length, samples, seed, gen_tokens, val_fraction):
    """Store the keys, values and future utility of every (layer, KV head) on training prompts: a named
    mixture, or --tasks at one --length.

    Resumable: rerun the same command to continue a stopped run.
    """
    from kvbench.kvp.datagen import DatagenConfig, generate_data, plan_shards, read_manifest
    from kvbench.models import check_device, context_limit, load_model, load_tokenizer, resolve
    from kvbench.results import check_writable
    from kvbench.tasks.mixture import Part

    if mixture is not None:
        options = {"--tasks": tasks, "--length": length, "--samples": samples}
        given = [name for name, value in options.items() if value is not None]
        if given:
            raise click.BadParameter(
                f"--mixture {mixture} sets the tasks, lengths and samples: drop {', '.join(given)}"
            )
        parts = list(MIXTURES[mixture])
    else:
        parts = [
            Part(task, length or DEFAULT_LENGTH, samples or DEFAULT_SAMPLES)
            for task in tasks or RULER_TRAINING_TASKS
        ]
    for part in parts:
        check_training_task(part.task, part.length)
    if out.exists() and not out.is_dir():
        raise click.BadParameter(f"{str(out)!r} is a file", param_hint="--out")
    check_writable(out)
    read_manifest(out)  # a corrupt manifest of an earlier run fails now, not after the model loads
    check_device(device)
    resolve(model)
    limit = context_limit(model)
    longest = max(part.length for part in parts)
    if limit is not None and longest > limit:
        raise click.BadParameter(
            f"{longest} exceeds the {limit}-token context of model {model!r}", param_hint="--length"
        )
    config = DatagenConfig(parts, seed, gen_tokens, val_fraction)
    planned = plan_shards(config, load_tokenizer(model))  # every task makes its samples before the model
    llm, tokenizer = load_model(model, device=device)
    manifest = generate_data(llm, tokenizer, out, config, mixture=mixture, planned=planned)
    click.echo(f"{len(manifest['shards'])} prompts in {out}")


@kvp.command()
@click.option(
    "--data",
    required=True,
    multiple=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Datagen folder; repeat to train on several (one model's), e.g. one per mixture part.",
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
    "--arch",
    type=click.Choice(list(ARCHS)),
    default=DEFAULTS.arch,
    show_default=True,
    help="compact: width-64 MLP with length-free position features; apple: Apple's agent (LayerNorm, "
    "width 256, learned position embedding).",
)
@click.option(
    "--hidden",
    type=click.IntRange(min=1),
    help="Scorer width [default: the arch's, compact 64, apple 256].",
)
@click.option("--eval-every", default=DEFAULTS.eval_every, show_default=True, type=click.IntRange(min=1))
@click.option("--seed", default=DEFAULTS.seed, show_default=True)
def train(data, out, layers, heads, steps, prompts, tokens, rankings, lr, arch, hidden, eval_every, seed):
    """Train one agent per (layer, KV head) on datagen output and save the best (by validation) to --out."""
    from kvbench.kvp.train import KVPData
    from kvbench.kvp.train import train as train_agents
    from kvbench.results import check_writable

    KVPData(list(data))  # a missing or corrupt manifest fails before any work
    check_writable(out)
    config = TrainConfig(
        steps=steps,
        prompts=prompts,
        tokens=tokens,
        rankings=rankings,
        lr=lr,
        warmup=min(DEFAULTS.warmup, steps // 10),
        eval_every=eval_every,
        arch=arch,
        hidden=hidden,
        seed=seed,
    )
    train_agents(list(data), out, config, layers=layers, kv_heads=heads, log=click.echo)


@kvp.command()
@click.argument("agents", type=click.Path(file_okay=False, path_type=Path))
@click.option("--plot", type=click.Path(dir_okay=False, path_type=Path), help="Write a PNG plot per layer.")
def report(agents, plot):
    """Validation cost per head of the agents in AGENTS vs oracle, random, knorm and recency (1 = oracle)."""
    from kvbench.kvp.checkpoint import card_arch, load_card, plot_validation, validation_table

    card = load_card(agents)
    agent, training = (
        card.get(key) if isinstance(card.get(key), dict) else {} for key in ("agent", "training")
    )
    click.echo(
        f"{card_arch(card)} agents (hidden {agent.get('hidden', '?')}) of {card['model']['name']}, "
        f"{training.get('steps', '?')} steps in {training.get('seconds', '?')} s"
    )
    table = validation_table(card)
    click.echo(table.to_string(index=False, float_format="{:.3f}".format))
    means = table.drop(columns=["layer", "kv_head"]).mean()
    click.echo("mean   " + "  ".join(f"{name} {value:.3f}" for name, value in means.items()))
    if plot:
        plot_validation(card, plot)
        click.echo(f"plot: {plot}")
