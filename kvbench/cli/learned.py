"""`kvbench kvp datagen` and `kvbench distillcache datagen`: one command in both groups, writing the shared
data store (kvbench.learned.common.datagen) that either press's `train` reads."""

from pathlib import Path

import click

from kvbench.bridge.models import EMBEDDED
from kvbench.cli.types import Folder, Number, Whole
from kvbench.learned.common.config import DEFAULT_GEN_TOKENS, TARGETS
from kvbench.tasks.mixture import MIXTURES, RULER_TRAINING_TASKS

DEFAULT_LENGTH, DEFAULT_SAMPLES = 1024, 12  # with RULER_TRAINING_TASKS: the "ruler" mixture
EVALUATION_SEEDS = 1000  # evaluation draws its samples with seeds 0..999


# The option block every learned press's commands share (datagen, train, calibrate).
def out_option(what: str):
    return click.option("--out", required=True, type=Folder(), help=what)


replace_option = click.option(
    "--replace",
    is_flag=True,
    help="Train over the learned state --out already holds (its card and weights; its other files, notes "
    "or logs, stay as they are). Without it such an --out is refused.",
)


def model_option(help: str = "A built-in model (`kvbench models`), a GGUF file, a hub id or a local folder."):
    return click.option("--model", default=EMBEDDED, show_default=True, help=help)


device_option = click.option("--device", default="cpu", show_default=True, help="torch device, e.g. cuda.")
data_option = click.option(
    "--data",
    required=True,
    multiple=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Datagen folder; repeat to train on several (one model's), e.g. one per mixture part.",
)


def check_training(out: Path, replace: bool, device: str, model: str, data: tuple[Path, ...] = ()) -> None:
    """What a command that trains or fits a press's state checks before it loads anything: --out (no data
    store, no learned state there without --replace, writable), --device and --model."""
    from kvbench.bridge.models import check_device, resolve
    from kvbench.learned.common import check_training_out
    from kvbench.store.results import check_folder_writable

    check_training_out(out, replace, data)
    check_folder_writable(out, "--out folder")
    check_device(device)
    resolve(model)


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


@click.command()
@out_option("Data folder.")
@model_option()
@device_option
@click.option(
    "--dtype",
    default="float32",
    show_default=True,
    type=click.Choice(["float32", "bfloat16", "float16"]),
    help="The model's dtype while it runs the prompts (bfloat16: about 2.5x faster on a CPU with AVX-512 "
    "BF16); recorded in the manifest, and a resumed run must use the same.",
)
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
@click.option("--length", type=Whole(1), help=f"Prompt tokens [default: {DEFAULT_LENGTH}].")
@click.option("--samples", type=Whole(1), help=f"Prompts per task [default: {DEFAULT_SAMPLES}].")
@click.option(
    "--seed",
    default=10_000,
    show_default=True,
    type=Whole(EVALUATION_SEEDS),
    help="Sample seed; evaluation uses 0..999, so training data starts at 1000.",
)
@click.option(
    "--gen-tokens",
    type=Whole(1),
    help="Greedy continuation: its attention defines KVP's utility, its next-token distributions "
    "DistillCache's reward (--target kvbench: capped by the task's answer length). [default: kvbench 32, "
    "authors 300]",
)
@click.option(
    "--target",
    type=click.Choice(TARGETS),
    default="kvbench",
    show_default=True,
    help="kvbench: rank the context, its future the question and the answer (a store for both learned "
    "presses); authors: rank the whole prompt (context, question, template, answer prefix), its future the "
    "greedy generation alone, to a stop token or --gen-tokens (KVP's authors' data; KVP only).",
)
@click.option(
    "--val-fraction",
    default=0.1,
    show_default=True,
    type=Number(0, 1, high_open=True),
    help="Share of each part's prompts kept for validation.",
)
@click.option(
    "--reconstruction",
    is_flag=True,
    help="Also store KVZip's score (attention while the model repeats the context), the target of `kvbench "
    "kvp train --utility reconstruction`; one more eager pass over the context a prompt.",
)
def datagen(
    out,
    model,
    device,
    dtype,
    mixture,
    tasks,
    length,
    samples,
    seed,
    gen_tokens,
    target,
    val_fraction,
    reconstruction,
):
    """Store what every learned press trains on: keys, values, KVP's utility, DistillCache's features and
    the full cache's next-token distributions of every training prompt (a named mixture, or --tasks at one
    --length). `kvbench kvp datagen` and `kvbench distillcache datagen` are this one command.

    Resumable: rerun the same command to continue a stopped run.
    """
    from kvbench.bridge.models import check_device, context_limit, load_model, load_tokenizer, resolve
    from kvbench.learned.common import existing_manifest
    from kvbench.learned.common.config import DatagenConfig
    from kvbench.store.results import check_writable
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
    gen_tokens = gen_tokens or DEFAULT_GEN_TOKENS[target]
    config = DatagenConfig(parts, seed, gen_tokens, val_fraction, reconstruction, target)  # no torch yet
    if out.exists() and not out.is_dir():
        raise click.BadParameter(f"{str(out)!r} is a file", param_hint="--out")
    check_writable(out)
    existing_manifest(out)  # a corrupt manifest of an earlier run fails now, not after the model loads
    check_device(device)
    resolve(model)
    limit = context_limit(model)
    longest = max(part.length for part in parts)
    if limit is not None and longest > limit:
        raise click.BadParameter(
            f"{longest} exceeds the {limit}-token context of model {model!r}", param_hint="--length"
        )
    from kvbench.learned.common.datagen import generate_data, plan_shards  # torch: now

    planned = plan_shards(config, load_tokenizer(model))  # every task makes its samples before the model
    llm, tokenizer = load_model(model, device=device, dtype=dtype)
    manifest = generate_data(llm, tokenizer, out, config, mixture=mixture, planned=planned)
    click.echo(f"{len(manifest['shards'])} prompts in {out}")
