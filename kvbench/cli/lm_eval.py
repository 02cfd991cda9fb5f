"""`kvbench lm-eval` (lm-eval tasks answered under a press), and `lm-eval-kvbench`: lm-eval's own command
line, with kvbench's model type `kvbench` registered and kvbench's lm-eval tasks (`kvbench_*`) findable.

    lm-eval-kvbench --model kvbench --model_args press=snapkv,compression_ratio=0.5 --tasks kvbench_vt ...

lm-eval 0.4 (through 0.4.13) finds a model type only in its own table (lm_eval.models
.MODEL_MAPPING) or when something has imported the module that registers it: it reads no entry points and
has no flag that imports a module, so a plain `lm_eval --model kvbench` cannot see a model another package
defines. This script imports kvbench.harness.lmeval, which registers the model, then runs lm-eval's own entry
point on the command line as given: every lm-eval flag and subcommand (`run`, `ls`, `validate`) works
unchanged. Without `--include_path` it adds kvbench's own task folder (shipped in the wheel), so the
`kvbench_*` tasks resolve from any install; lm-eval takes one include path, so a user who gives their own
reaches kvbench's tasks through it (e.g. a folder holding both). From Python, `import kvbench.lmeval`
before
`lm_eval.simple_evaluate(model="kvbench", ...)` does the same.
"""

import sys
from datetime import datetime, timezone
from pathlib import Path

import click

from kvbench.bridge.models import EMBEDDED
from kvbench.cli.types import Folder, Whole

HELP = {"-h", "--help"}


def with_kvbench_tasks(argv: list[str]) -> list[str]:
    """`argv` with kvbench's lm-eval task folder as `--include_path`, unless it names one or asks for help."""
    if not argv or HELP & set(argv) or any(arg.split("=")[0] == "--include_path" for arg in argv):
        return argv
    from kvbench.core.resources import lm_eval_tasks_dir

    return [*argv, "--include_path", str(lm_eval_tasks_dir())]


def given_options(argv: list[str]) -> tuple[str | None, list[str], list[str]]:
    """--model, and every --model_args and --metadata value, as lm-eval's command line would read them
    (`-M`, `-a`, `--option=value`, several values after one option); the rest of `argv` is lm-eval's."""
    import argparse

    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--model", "-M")
    parser.add_argument("--model_args", "-a", nargs="+", action="extend", default=[])
    parser.add_argument("--metadata", nargs="+", action="extend", default=[])
    parser.add_argument("--config", "-C")
    known, _ = parser.parse_known_args(argv)
    if known.config is not None:  # a config file may name the model's arguments: lm-eval reads it
        return None, [], []
    return known.model, known.model_args, known.metadata


def main() -> None:
    """lm-eval's command line; kvbench's own errors (a bad `--model_args` value: an unknown press, a ratio
    out of range, a missing model, a bad press argument) are one line and their exit code, as in `kvbench`.
    What can be checked on the command line alone is, before lm-eval, torch and kvpress are imported."""
    from kvbench.bridge.models import first_line
    from kvbench.core.errors import KvbenchError
    from kvbench.harness.lmeval_checks import check_model_args

    try:
        if not HELP & set(sys.argv[1:]):
            check_model_args(*given_options(sys.argv[1:]))
        from lm_eval.__main__ import cli_evaluate

        import kvbench.harness.lmeval  # noqa: F401 (registers the model type `kvbench`)

        sys.argv = [sys.argv[0], *with_kvbench_tasks(sys.argv[1:])]
        cli_evaluate()
    except KvbenchError as error:
        print(f"Error: {first_line(error)}", file=sys.stderr)
        sys.exit(error.exit_code)


@click.command(name="lm-eval")
@click.option("--press", required=True, help="Press name (see `kvbench presses`).")
@click.option("--ratio", required=True, help="Fraction of KV entries removed, in [0, 1).")
@click.option(
    "--press-arg", "press_args", multiple=True, metavar="KEY=VALUE", help="Press parameter (repeatable)."
)
@click.option("--tasks", "task_names", required=True, help="Comma-separated lm-eval tasks or groups.")
@click.option("--limit", type=Whole(1), default=None, help="Evaluate only the first N docs per task.")
@click.option("--length", type=Whole(1), default=None, help="Context length of RULER tasks (tokens).")
@click.option(
    "--include-path",
    "include_paths",
    multiple=True,
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="Extra folder of lm-eval task YAMLs (repeatable); tasks/lm_eval is always included.",
)
@click.option(
    "--model",
    default=EMBEDDED,
    show_default=True,
    help="A built-in model (`kvbench models`), a GGUF file, a Hugging Face model id, or a local folder.",
)
@click.option("--device", default="cpu", show_default=True, help="torch device, e.g. cuda.")
@click.option(
    "--dtype", default="float32", show_default=True, type=click.Choice(["float32", "bfloat16", "float16"])
)
@click.option(
    "--out",
    type=Folder(),
    default=Path("results"),
    show_default=True,
    help="Results folder (appended to, as `kvbench run`).",
)
def lm_eval_command(
    press, ratio, press_args, task_names, limit, length, include_paths, model, device, dtype, out
):
    """Run lm-eval tasks with every request answered under a press.

    Generation prefills the prompt's context under the press and decodes on top of the compressed cache;
    loglikelihoods are scored against the compressed cache. kvbench's own RULER tasks are in tasks/lm_eval
    (kvbench_niah_single_1, ..., group kvbench_ruler). Rows land in OUT/rows.jsonl as task
    "lm-eval/<task>", so `kvbench report` shows them next to `kvbench run`'s. lm-eval's responses are
    cached per config under the kvbench cache ($KVBENCH_CACHE/lm_eval), so a rerun only computes what is new.

    \b
    Example: kvbench lm-eval --press snapkv --ratio 0.5 --tasks niah_single_1,ruler_vt --length 1024
    """
    from kvbench.bridge.models import check_device, context_limit, first_line, resolve, usable_cache_dir
    from kvbench.core.config import Config
    from kvbench.core.errors import BadInput, TaskUnavailable
    from kvbench.harness.lmeval_checks import check_length
    from kvbench.harness.planning import check_configs, parse_ratio
    from kvbench.presses import check_press_runnable, parse_press_args, resolve_press
    from kvbench.store.results import ResultsStore, check_writable

    started = datetime.now(timezone.utc).isoformat()
    ratio = parse_ratio(ratio)
    names = [name.strip() for name in task_names.split(",") if name.strip()]
    if not names:
        raise BadInput("--tasks must name at least one task")
    # Cheap checks first, so that a typo fails in a second, not after torch and lm-eval import (15-20 s) or
    # the model loads; the press's own checks (check_configs) need the engine, so they come after them.
    press = resolve_press(press)  # a registered name, or a user's press given by its target
    config = Config(press, ratio, tuple(sorted(parse_press_args(press_args).items())))
    check_press_runnable(press)
    check_writable(out)
    check_device(device)
    resolve(model)
    check_length(length, names, context_limit(model), model)
    usable_cache_dir()  # lm-eval's request cache and the tokenizer its tasks read go there
    check_configs([config], length)
    from kvbench.harness.lmeval import (
        KVBenchLM,
        check_tasks,
        evaluate,
        needs_hub,
        rows_from_results,
        run_record,
        store_rows,
        task_manager,
        task_metadata,
    )

    try:
        manager = task_manager(include_paths, task_metadata(model, limit=limit, length=length))
        check_tasks(manager, names)
        lm = KVBenchLM(model, press, ratio, parse_press_args(press_args), device=device, dtype=dtype)
        results = evaluate(lm, manager, names, limit=limit)
    except Exception as error:
        if needs_hub(error):
            hub = "an lm-eval task needs the Hugging Face hub, which is not reachable"
            raise TaskUnavailable(f"{hub}: {first_line(error)}") from error
        raise
    rows = rows_from_results(results, lm)
    with ResultsStore(out) as store:
        new = store_rows(rows, store)
        store.write_run(run_record(lm, rows, limit=limit, length=length, started=started))
    for task in sorted({row.task for row in rows}):
        scores = [row.score for row in rows if row.task == task and row.score is not None]
        mean = f"{sum(scores) / len(scores):.1f}" if scores else "n/a"
        click.echo(f"{task:<40} {mean:>6}  ({len(scores)} samples)")
    click.echo(f"results: {out}/rows.jsonl ({new} new rows)")


if __name__ == "__main__":
    main()
