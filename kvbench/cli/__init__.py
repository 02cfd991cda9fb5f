"""The `kvbench` command line: thin commands that turn options into calls of the library.

Errors: a KvbenchError (bad input, a missing model or data file; kvbench.core.errors) and click's usage
errors are one line on stderr and exit code 2 (1 for a results folder that cannot be written), raised before
any work or any write. Any other exception is a bug: it keeps its traceback (exit code 1).
"""

import contextlib
import errno
import importlib
import logging
import signal
import sys
import warnings
from pathlib import Path

import click

from kvbench.bridge.models import EMBEDDED, first_line
from kvbench.cli.types import Folder, Names, Number, Whole
from kvbench.core.config import DEFAULT_PROTOCOL, PROTOCOLS, protocol_by_option, usable_protocols
from kvbench.core.errors import BadInput, KvbenchError, KvbenchWarning
from kvbench.core.validation import MAX_COUNT

# Commands whose modules are heavy to import (plots, lm-eval, training) load only when called; their one-line
# help is here so that `kvbench --help` lists them without importing torch.
LAZY_COMMANDS = {
    "export": ("kvbench.cli.interop:export_command", "Write results as kvpress evaluation's output folders."),
    "import": ("kvbench.cli.interop:import_command", "Read kvpress evaluation's output folders as results."),
    "report": (
        "kvbench.cli.report:report",
        "Leaderboards, per-task tables and plots from one or more results folders.",
    ),
    "kvp": (
        "kvbench.cli.kvp:kvp",
        "Make KVP eviction agents for a model: datagen, then train; report shows how good they are.",
    ),
    "distillcache": (
        "kvbench.cli.distillcache:distillcache",
        "Make a DistillCache eviction policy for a model: datagen, then train; report shows how good it is.",
    ),
    "memdecay": (
        "kvbench.cli.memdecay:memdecay",
        "MemDecay's per-region half-lives and base priorities, measured on a model (see `calibrate`).",
    ),
    "gate": (
        "kvbench.cli.gate:gate",
        "Learned sigmoid gates per (layer, KV head): trained soft on the frozen model, evicting hard.",
    ),
    "fit": (
        "kvbench.cli.fit:fit",
        "Fit offline, for any model, the state kvpress downloads for qfilter, kvzap, duo_attention, ...",
    ),
    "lm-eval": (
        "kvbench.cli.lm_eval:lm_eval_command",
        "Run lm-eval tasks with every request answered under a press.",
    ),
    "perplexity": (
        "kvbench.cli.perplexity:perplexity",
        "Perplexity of long texts with each press's KV cache held at its budget as the text is read.",
    ),
    "models": (
        "kvbench.cli.models:models",
        "List the built-in models: name, size, shape, where the GGUF comes from, and whether it is here.",
    ),
    "compare-models": (
        "kvbench.cli.compare_models:compare_models",
        "Whether the order of presses on one model (a results folder) carries to another.",
    ),
    "check-press": (
        "kvbench.cli.check_press:check_press_command",
        "Whether PRESS does what it claims: budget, memory, cache order, determinism, isolation, parity.",
    ),
    "speed": (
        "kvbench.cli.speed:speed",
        "What each press costs run alone: prefill overhead, decode tokens/s, allocated vs accounted bytes.",
    ),
}


class Group(click.Group):
    """Loads heavy commands lazily; the one place where errors become one line and an exit code."""

    def list_commands(self, ctx):
        return sorted([*super().list_commands(ctx), *LAZY_COMMANDS])

    def get_command(self, ctx, cmd_name):
        if cmd_name in LAZY_COMMANDS:
            module, attribute = LAZY_COMMANDS[cmd_name][0].split(":")
            return getattr(importlib.import_module(module), attribute)
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx, formatter):
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(map(len, names))
        rows = [
            (name, LAZY_COMMANDS[name][1])
            if name in LAZY_COMMANDS
            else (name, self.commands[name].get_short_help_str(limit))
            for name in names
        ]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def invoke(self, ctx):
        with warnings.catch_warnings(), terminate_as_interrupt():
            warnings.showwarning = one_line_warnings(warnings.showwarning)
            try:
                return super().invoke(ctx)
            except click.UsageError as error:  # click's own: one line too, without the usage block
                click.echo(f"Error: {error.format_message()}", err=True)
                ctx.exit(2)
            except KvbenchError as error:
                click.echo(f"Error: {first_line(error)}", err=True)
                ctx.exit(error.exit_code)
            except Terminated:
                click.echo("terminated", err=True)
                ctx.exit(128 + signal.SIGTERM)
            except KeyboardInterrupt:
                click.echo("interrupted", err=True)
                ctx.exit(130)
            except OSError as error:
                if error.errno != errno.ENAMETOOLONG:
                    raise
                # Looking a path up (is_file, exists) raises for a name longer than the file system takes,
                # wherever a command first looks: the path is the user's input, so one line and exit 2.
                named = str(error.filename or "")
                click.echo(f"Error: a path is too long for the file system: {named[:60]!r}...", err=True)
                ctx.exit(2)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the command is, as Ctrl-C raises KeyboardInterrupt."""


@contextlib.contextmanager
def terminate_as_interrupt():
    """While a command runs, SIGTERM (a `kill`, a job scheduler's time limit) unwinds it as Ctrl-C does:
    what it was writing is finished or rolled back (a half-made report's staging folder, a sweep's claims)
    rather than left behind by an abrupt exit. The previous handler is restored after."""

    def terminate(signum, frame):
        raise Terminated

    try:
        previous = signal.signal(signal.SIGTERM, terminate)
    except ValueError:  # not the main thread: signals cannot be handled here
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def one_line_warnings(show):
    """A warnings.showwarning that prints kvbench's warnings as one `Warning:` line, others as `show` does."""

    def show_warning(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, KvbenchWarning):
            click.echo(f"Warning: {message}", err=True)
        else:
            show(message, category, filename, lineno, file, line)

    return show_warning


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


def model_options(command):
    command = click.option(
        "--model",
        default=EMBEDDED,
        show_default=True,
        help="A built-in model (`kvbench models`), a GGUF file, a Hugging Face model id, or a local folder.",
    )(command)
    command = click.option("--device", default="cpu", show_default=True, help="torch device, e.g. cuda.")(
        command
    )
    command = click.option(
        "--dtype", default="float32", show_default=True, type=click.Choice(["float32", "bfloat16", "float16"])
    )(command)
    return command


def task_options(command):
    options = [
        click.option(
            "--suite",
            default=None,
            help="Suite name (default ruler-smoke; see `kvbench tasks`) or a suite YAML's path (its folder's "
            "task YAMLs are included).",
        ),
        click.option(
            "--task", "tasks", multiple=True, help="Task name (repeatable); overrides the suite's tasks."
        ),
        click.option(
            "--data",
            multiple=True,
            metavar="PATH",
            help="Your own samples as a task named after the file (repeatable): a .jsonl of {context, "
            "question, answers, id?}, a .parquet file or a datasets folder; overrides the suite's tasks.",
        ),
        click.option(
            "--metric",
            default=None,
            help="Metric of the --data tasks [qa_f1]: exact_match, contains, qa_f1, rouge, string_match_all, "
            "... or module:function / file.py:function returning a score in [0, 1].",
        ),
        click.option(
            "--include-path",
            multiple=True,
            metavar="DIR",
            help="Folder of task YAMLs (task, data, metric, fields, templates, ...) and suite YAMLs to add "
            "to the registry (repeatable).",
        ),
        click.option(
            "--length",
            type=Whole(),
            default=None,
            help="Context length in tokens (default: the suite's; LongBench: the model's own limit as THUDM"
            "'s pred.py sets it, 7500 for an 8k model; RULER without a suite: 1024).",
        ),
        click.option(
            "--samples", type=Whole(), default=None, help="Samples per task (default: the suite's)."
        ),
        click.option(
            "--seed", type=Whole(), default=0, show_default=True, help="Seed of the generated samples."
        ),
        click.option(
            "--data-dir",
            type=click.Path(path_type=Path),
            default=None,
            help="Folder of local task data (SQuAD/HotpotQA JSON, LongBench JSONL).",
        ),
        click.option(
            "--tokenizer",
            default=None,
            metavar="NAME_OR_PATH",
            help="Size and generate the samples with this tokenizer instead of the model's (default: the "
            "suite's, else the model's): a Hugging Face id (offline: from the local cache), a folder or "
            "the embedded alias. The model still reads them with its own.",
        ),
        click.option(
            "--out",
            type=Folder(),
            default=Path("results"),
            show_default=True,
            help="Results folder (appended to; finished rows are never recomputed; processes may share it).",
        ),
        click.option("--force", is_flag=True, help="Recompute rows that are already in --out."),
        click.option(
            "--batch-configs",
            type=Whole(1),
            default=16,
            show_default=True,
            help="Configs decoded together per sample (bounds memory).",
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def protocol_options(command):
    """--protocol, and each protocol's argument as an option of its own, from the protocols' registry
    (`config.PROTOCOLS`, plugins' included): a protocol registered there gets its options here. A plugin
    that fails to load has none, and says why in one line where it is named."""
    protocols = usable_protocols()
    options = [
        click.option(
            "--protocol",
            type=Names(PROTOCOLS),
            default=DEFAULT_PROTOCOL,
            show_default=True,
            help=" ".join(f"{name}: {protocol.description}." for name, protocol in protocols.items()),
        ),
        *(
            click.option(f"--{option}", type=Whole(), default=None, help=protocol.option_help)
            for option, protocol in protocol_by_option().items()
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def ray_options(command):
    """`sweep --ray [ADDRESS]`: the sweep's units spread over Ray workers (kvbench/harness/ray_sweep.py)."""
    options = [
        click.option(
            "--ray",
            "ray_address",
            is_flag=False,
            flag_value=LOCAL_RAY,
            default=None,
            metavar="[ADDRESS]",
            help="Spread the sweep over Ray workers that each load the model once: a local cluster, or the "
            "running cluster at ADDRESS (e.g. auto, ray://head:10001). Needs kvbench[ray].",
        ),
        click.option(
            "--ray-workers",
            type=Whole(1),
            default=None,
            help="Ray workers [as many as the cluster's CPUs (or GPUs) hold].",
        ),
        click.option("--ray-cpus", type=Whole(1), default=None, help="CPU threads per worker [1]."),
        click.option("--ray-gpus", type=Number(0), default=None, help="GPUs per worker [0]."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


LOCAL_RAY = "local"


def ray_executor(ray_address, ray_workers, ray_cpus, ray_gpus):
    """The sweep's executor on Ray, or None for one process."""
    if ray_address is None:
        for name, value in (("workers", ray_workers), ("cpus", ray_cpus), ("gpus", ray_gpus)):
            if value is not None:
                raise BadInput(f"--ray-{name} applies to a sweep with --ray")
        return None
    from kvbench.harness.ray_sweep import RayExecutor

    return RayExecutor(
        address=None if ray_address == LOCAL_RAY else ray_address,
        workers=ray_workers,
        cpus=ray_cpus or 1,
        gpus=ray_gpus or 0.0,
    )


# What the summary's setting columns mean (kvbench.harness.runner.summarize).
SETTINGS = {
    "ratio": "fraction of KV entries removed",
    "memory": "fraction of the 16-bit full cache kept",
    "budget": "KV entries kept per head and layer",
}


def print_summary(frame, out: Path) -> None:
    from kvbench.harness.runner import press_versions, summarize

    table = summarize(frame)
    if table.empty:
        click.echo("no results")
    else:
        click.echo(table.round(1).to_string())
        click.echo(
            "; ".join(f"{name}: {SETTINGS[name]}" for name in table.index.names[1:]) + "; scores 0-100"
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
    print_summary(frame, options["out"])


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
    print_summary(frame, options["out"])


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
    from kvbench.harness.serving.bench import run, table
    from kvbench.presses import parse_press_args

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
    from kvbench.reporting.prefix_cache import render

    plots = render(out)
    click.echo(table(summaries))
    click.echo(f"rows: {out}/requests.jsonl  summary: {out}/summary.json, summary.md")
    click.echo("plots: " + ", ".join(str(path) for path in plots))


if __name__ == "__main__":
    sys.exit(main())
