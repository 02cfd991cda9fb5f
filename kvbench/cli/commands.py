"""The `kvbench` group and its main commands (run, sweep, presses, tasks, prefix-cache): thin commands that
turn options into calls of the library. The other commands live in modules of their own, loaded on first
use (`group.LAZY_COMMANDS`); errors become one line in `group.Group`."""

import logging
import sys
import warnings
from pathlib import Path

import click

from kvbench.cli.group import Group
from kvbench.cli.options import model_options, protocol_options, ray_executor, ray_options, task_options
from kvbench.cli.types import Folder, Number, Whole
from kvbench.core.validation import MAX_COUNT


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="kvbench")
@click.option("-v", "--verbose", is_flag=True, help="Log what the engine does (fallback presses, timings).")
def main(verbose):
    """Benchmark KV-cache compression presses (KVP, H2O, SnapKV, ...) on RULER and LongBench.

    \b
    Quick start (offline, embedded SmolLM2-135M on CPU):
      kvbench run --press kvp --ratio 0.5             # one press, one ratio, default suite
      kvbench sweep --presses kvp,snapkv,h2o --ratios 0.25,0.5,0.75
      kvbench report results/ --out reports/mine      # leaderboard, plots
      kvbench presses / kvbench tasks / kvbench models  # what can be run
    """
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(message)s"
    )
    warnings.filterwarnings("ignore", module="transformers")


# What the summary's setting columns mean (kvbench.harness.runner.summarize).
_SETTINGS = {
    "ratio": "fraction of KV entries removed",
    "memory": "fraction of the 16-bit full cache kept",
    "budget": "KV entries kept per head and layer",
}


def _print_summary(frame, out: Path) -> None:
    from kvbench.harness.runner import press_versions, summarize

    table = summarize(frame)
    if table.empty:
        click.echo("no results")
    else:
        click.echo(table.round(1).to_string())
        click.echo(
            "; ".join(f"{name}: {_SETTINGS[name]}" for name in table.index.names[1:]) + "; scores 0-100"
        )
        for line in press_versions(frame):
            click.echo(f"version of {line}")
    click.echo(f"results: {out}/rows.jsonl  (kvbench report {out} --out reports/NAME)")


@main.command()
@click.option(
    "--press",
    required=True,
    help="Press name (see `kvbench presses`), or your own: module:Class, path/to/file.py:Class, NAME=target.",
)
@click.option("--ratio", default=None, help="Fraction of KV entries removed, in [0, 1).")
@click.option(
    "--memory",
    default=None,
    help="Instead of --ratio: the fraction of the 16-bit full cache the press may store, in (0, 1].",
)
@click.option(
    "--budget",
    default=None,
    help="Instead of --ratio: KV entries kept per head (and per layer), whatever the context length.",
)
@click.option(
    "--press-arg",
    "press_args",
    multiple=True,
    metavar="KEY=VALUE",
    help="Press parameter (repeatable), e.g. window_size=32 or inner=tova (PRESS.KEY=VALUE works too).",
)
@protocol_options
@task_options
@model_options
def run(press, ratio, memory, budget, press_args, **options):
    """Score one press at one compression ratio (or memory budget) on a suite or tasks.

    The context is prefilled and compressed, then the question is answered greedily on top of the
    compressed cache (kvpress's protocol; see --protocol for the others). Writes one row per sample to
    OUT/rows.jsonl and a run record (config, versions, git commit, scores) to OUT/runs/.

    \b
    Examples:
      kvbench run --press snapkv --ratio 0.5 --task niah_single_1 --samples 4
      kvbench run --press quant --memory 0.25                 # a codec at a quarter of the cache's bytes
      kvbench run --press knorm --ratio 0.75 --protocol streaming --chunk 128
      kvbench run --press snapkv --budget 128 --protocol query-aware   # KVP's paper's protocol
    """
    from kvbench.harness.runner import run as run_press
    from kvbench.presses import parse_press_args

    frame = run_press(
        press, ratio, memory=memory, budget=budget, press_args=parse_press_args(press_args), **options
    )
    _print_summary(frame, options["out"])


@main.command()
@click.option(
    "--presses",
    required=True,
    help="Comma-separated presses, e.g. kvp,snapkv,h2o,tova; your own as module:Class, path/to/file.py:Class "
    "or NAME=target.",
)
@click.option("--ratios", default=None, help="Comma-separated ratios in [0, 1), e.g. 0.25,0.5,0.75,0.9.")
@click.option(
    "--memory",
    default=None,
    help="Instead of --ratios: comma-separated memory budgets in (0, 1] (fractions of the 16-bit full "
    "cache), e.g. 0.5,0.25,0.1. Evictors run at ratio 1 - memory, codecs solve their own knobs.",
)
@click.option(
    "--budget",
    default=None,
    help="Instead of --ratios: comma-separated absolute budgets, KV entries kept per head (and per layer), "
    "e.g. 64,128,256,512.",
)
@click.option(
    "--press-arg",
    "press_args",
    multiple=True,
    metavar="KEY=VALUE",
    help="Press parameter (repeatable): KEY=VALUE for every press of the sweep, PRESS.KEY=VALUE for one, "
    "e.g. kvp.agents=agents/broad snapkv.window_size=16.",
)
@protocol_options
@task_options
@model_options
@ray_options
def sweep(
    presses, ratios, memory, budget, press_args, ray_address, ray_workers, ray_cpus, ray_gpus, **options
):
    """Score every press at every ratio or memory budget (plus no compression) on a suite or tasks.

    One uncompressed prefill per sample serves every config that compresses inside kvpress's hook;
    decoding runs for all of them as one batch. Resumable: rerun the same command after an interruption
    and only the missing rows are computed.

    \b
    Examples:
      kvbench sweep --presses kvp,snapkv,h2o,tova --ratios 0.25,0.5,0.75,0.9 --suite ruler-1k
      kvbench sweep --presses kvp,snapkv,quant,varrate --memory 0.5,0.25,0.1 --suite ruler-1k
      kvbench sweep --presses kvp,snapkv --ratios 0.5 --suite ruler-4k --ray auto --ray-gpus 1 --device cuda
      kvbench sweep --presses kvp,snapkv,tova --budget 64,128,256 --protocol query-aware --suite ruler-1k
      kvbench sweep --presses kvp,knorm --ratios 0.5 --protocol multi-question --suite heldout --length 2048
      kvbench sweep --presses my_press.py:MyPress,snapkv --ratios 0.5 --data mine.jsonl --metric exact_match
    """
    from kvbench.harness.runner import sweep as sweep_presses
    from kvbench.presses import parse_press_args

    executor = ray_executor(ray_address, ray_workers, ray_cpus, ray_gpus)
    frame = sweep_presses(
        presses,
        ratios,
        memory=memory,
        budget=budget,
        press_args=parse_press_args(press_args),
        executor=executor,
        **options,
    )
    _print_summary(frame, options["out"])


@main.command(name="presses")
def list_presses():
    """List every press: name, what it does, what it needs."""
    from kvbench.presses import NOT_REGISTERED, PRESSES, list_presses

    specs = list_presses()
    for error in PRESSES.broken():
        click.echo(f"Warning: {error}", err=True)
    width = max(len(spec.name) for spec in specs)
    for spec in specs:
        needs = f"  [needs: {', '.join(spec.needs)}]" if spec.needs else ""
        source = spec.source
        origin = f"  [from {source.package} {source.version}]" if source and source.package else ""
        caveat = f"  [conformance: {spec.caveat}]" if spec.caveat else ""
        click.echo(f"{spec.name:<{width}}  {spec.description}{needs}{origin}{caveat}")
    click.echo("kvpress presses not in the registry:")
    for name, reason in NOT_REGISTERED.items():
        click.echo(f"  {name}: {reason}")


@main.command(name="tasks")
@click.option(
    "--include-path", multiple=True, metavar="DIR", help="Folder of your task and suite YAMLs to list too."
)
def list_tasks(include_path):
    """List task families, tasks and suites."""
    from kvbench.tasks import TASK_FAMILIES, list_suites, list_tasks
    from kvbench.tasks import include_path as include

    for folder in include_path:
        include(folder)

    tasks = list_tasks()
    for error in TASK_FAMILIES.broken():
        click.echo(f"Warning: {error}", err=True)
    family = None
    for task in tasks:
        if task.family != family:
            family = task.family
            click.echo(f"{family}:")
        click.echo(f"  {task.name:<28} {task.description}")
    click.echo("suites (tasks/*.yaml and --include-path):")
    for suite in list_suites():
        length = f"{suite.length} tokens" if suite.length else "the model's limit"
        click.echo(
            f"  {suite.name:<28} {len(suite.tasks)} tasks x {suite.samples} samples at {length}"
            f"  {suite.description}"
        )


@main.command(name="prefix-cache")
@click.option("--out", required=True, type=Folder(), help="Folder for the trace, rows and summary.")
@click.option(
    "--trace",
    "trace_path",
    default=None,
    type=click.Path(path_type=Path),
    help="Replay this trace (JSONL) instead of making one.",
)
@click.option(
    "--policies",
    default="none,prefix,chunk,pegasus",
    show_default=True,
    help="Comma-separated: none, prefix, chunk, pegasus (none always runs: the reference).",
)
@click.option(
    "--budgets",
    default="4",
    show_default=True,
    help="Comma-separated store budgets in MiB (16-bit KV bytes).",
)
@click.option(
    "--requests", type=Whole(1, MAX_COUNT), default=60, show_default=True, help="Requests of a made trace."
)
@click.option("--seed", type=Whole(), default=0, show_default=True, help="Seed of a made trace.")
@click.option(
    "--docs", type=Whole(1, MAX_COUNT), default=12, show_default=True, help="Document chunks of a made trace."
)
@click.option("--k", "k", type=Whole(1), default=3, show_default=True, help="Chunks per RAG request.")
@click.option(
    "--zipf", default=1.1, show_default=True, type=Number(0), help="Zipf exponent of chunk popularity."
)
@click.option(
    "--sessions", type=Whole(0, MAX_COUNT), default=4, show_default=True, help="Multi-turn agent sessions."
)
@click.option(
    "--session-share",
    default=0.4,
    show_default=True,
    type=Number(0, 1),
    help="Fraction of requests that are session turns.",
)
@click.option(
    "--chunk-chars", type=Whole(1), default=200, show_default=True, help="Characters per chunk, about."
)
@click.option("--no-interleave", is_flag=True, help="Sessions after the RAG requests, not interleaved.")
@click.option(
    "--block",
    type=Whole(1),
    default=16,
    show_default=True,
    help="Tokens per block of the exact-prefix radix tree.",
)
@click.option(
    "--transition-tol",
    default=0.05,
    show_default=True,
    type=Number(0),
    help="Pegasus transitions keep KV entries that change by more than this.",
)
@click.option(
    "--answer-tokens",
    type=Whole(0),
    default=4,
    show_default=True,
    help="Greedy tokens after the first, to compare answers.",
)
@click.option(
    "--press",
    default="none",
    show_default=True,
    help="Also run every reusing policy with its stored entries compressed by this press (see `kvbench "
    "presses`; an evictor that scores in kvpress's hook: knorm, snapkv, tova, kvp, ...).",
)
@click.option(
    "--ratio", default=None, help="With --press: fraction of each entry's KV entries removed, [0, 1)."
)
@click.option(
    "--press-arg",
    "press_args",
    multiple=True,
    metavar="KEY=VALUE",
    help="Press parameter (repeatable), e.g. window_size=8 for snapkv on 16-token blocks.",
)
@model_options
def prefix_cache(
    out,
    trace_path,
    policies,
    budgets,
    block,
    transition_tol,
    answer_tokens,
    press,
    ratio,
    press_args,
    model,
    device,
    dtype,
    **made,
):
    """Replay a request trace against a byte-budgeted prefix store, policy by policy: TTFT, hit rate, reuse
    and accuracy against a full recompute (Pegasus's stateful path caching among them), and with --press
    the same policies with compressed entries. Writes the trace, rows, summary.md and its plots to OUT."""
    from kvbench.presses import parse_press_args
    from kvbench.serving.bench import run

    made["interleave"] = not made.pop("no_interleave")
    summaries = run(
        out,
        trace_path,
        made,
        policies,
        budgets,
        block,
        transition_tol,
        answer_tokens,
        press,
        ratio,
        parse_press_args(press_args),
        model,
        device,
        dtype,
    )
    from kvbench.reporting.prefix_cache import render, table

    plots = render(out)
    click.echo(table(summaries))
    click.echo(f"rows: {out}/requests.jsonl  summary: {out}/summary.json, summary.md")
    click.echo("plots: " + ", ".join(str(path) for path in plots))


if __name__ == "__main__":
    sys.exit(main())
