"""The `kvbench` command line: thin commands that validate input, then call the library.

Every user error (unknown press/task/suite/model, ratio outside [0, 1), unwritable output, ...) is one line
on stderr and exit code 2, raised before any work or any write.
"""

import dataclasses
import importlib
import logging
import sys
import warnings
from pathlib import Path

import click

from kvbench import tasks
from kvbench.models import EMBEDDED, ModelNotFound
from kvbench.presses import (
    PRESSES,
    UnknownPress,
    build_press,
    check_press_runnable,
    parse_press_args,
    press_state,
)
from kvbench.tasks import TaskUnavailable

USER_ERRORS = (ValueError, KeyError, ModelNotFound, TaskUnavailable, UnknownPress, FileNotFoundError)


class UserError(click.ClickException):
    exit_code = 2


# Commands whose modules are heavy to import (plots, lm-eval, training) load only when called.
LAZY_COMMANDS = {
    "report": "kvbench.report:report",
    "kvp": "kvbench.kvp.cli:kvp",
    "distillcache": "kvbench.distillcache.cli:distillcache",
    "memdecay": "kvbench.memdecay_cli:memdecay",
    "lm-eval": "kvbench.lmeval:lm_eval_command",
}


class Group(click.Group):
    """Loads heavy commands lazily; turns user-facing exceptions into one-line errors with exit code 2."""

    def list_commands(self, ctx):
        return sorted([*super().list_commands(ctx), *LAZY_COMMANDS])

    def get_command(self, ctx, name):
        if name in LAZY_COMMANDS:
            module, attribute = LAZY_COMMANDS[name].split(":")
            return getattr(importlib.import_module(module), attribute)
        return super().get_command(ctx, name)

    def invoke(self, ctx):
        from kvbench.results import ResultsWriteError

        try:
            return super().invoke(ctx)
        except click.UsageError as error:  # click's own: one line too, without the usage block
            raise UserError(error.format_message()) from None
        except ResultsWriteError as error:  # disk full: not the user's input, exit 1, still one line
            raise click.ClickException(str(error)) from None
        except USER_ERRORS as error:
            message = error.args[0] if isinstance(error, KeyError) and error.args else error
            raise UserError(
                str(message).strip().splitlines()[0] if str(message).strip() else repr(error)
            ) from None
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            ctx.exit(130)


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
      kvbench presses / kvbench tasks                 # what can be run
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
        help="Embedded alias, Hugging Face model id, or local folder.",
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
            help="Suite from tasks/*.yaml (default ruler-smoke; see `kvbench tasks`).",
        ),
        click.option(
            "--task", "task_list", multiple=True, help="Task name (repeatable); overrides the suite's tasks."
        ),
        click.option(
            "--length",
            type=int,
            default=None,
            help="Context length in tokens (default: the suite's; LongBench: the model's own limit as THUDM"
            "'s pred.py sets it, 7500 for an 8k model; RULER without a suite: 1024).",
        ),
        click.option("--samples", type=int, default=None, help="Samples per task (default: the suite's)."),
        click.option("--seed", type=int, default=0, show_default=True, help="Seed of the generated samples."),
        click.option(
            "--data-dir",
            type=click.Path(path_type=Path),
            default=None,
            help="Folder of local task data (SQuAD/HotpotQA JSON, LongBench JSONL).",
        ),
        click.option(
            "--out",
            type=click.Path(path_type=Path),
            default=Path("results"),
            show_default=True,
            help="Results folder (appended to; finished rows are never recomputed).",
        ),
        click.option("--force", is_flag=True, help="Recompute rows that are already in --out."),
        click.option(
            "--batch-configs",
            type=click.IntRange(min=1),
            default=16,
            show_default=True,
            help="Configs decoded together per sample (bounds memory).",
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def protocol_options(command):
    options = [
        click.option(
            "--protocol",
            type=click.Choice(list(PROTOCOL_NAMES)),
            default="query-agnostic",
            show_default=True,
            help="query-agnostic: compress the context once, then ask. decode-time: also compress every "
            "--interval decoding steps back to the budget. streaming: feed the context --chunk tokens at a "
            "time, compressing back under the budget after each, then ask.",
        ),
        click.option(
            "--interval",
            type=int,
            default=None,
            help="decode-time: decoding steps between compressions [16].",
        ),
        click.option("--chunk", type=int, default=None, help="streaming: context tokens per chunk [256]."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


PROTOCOL_NAMES = {"query-agnostic": None, "decode-time": ("interval", 16), "streaming": ("chunk", 256)}


def ray_options(command):
    """`sweep --ray [ADDRESS]`: the sweep's units spread over Ray workers (kvbench/ray_sweep.py)."""
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
            type=click.IntRange(min=1),
            default=None,
            help="Ray workers [as many as the cluster's CPUs (or GPUs) hold].",
        ),
        click.option(
            "--ray-cpus", type=click.IntRange(min=1), default=None, help="CPU threads per worker [1]."
        ),
        click.option("--ray-gpus", type=click.FloatRange(min=0), default=None, help="GPUs per worker [0]."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


LOCAL_RAY = "local"


def ray_executor(ray_address, ray_workers, ray_cpus, ray_gpus, options: dict):
    """The sweep's executor on Ray, or None for one process."""
    if ray_address is None:
        for name, value in (("workers", ray_workers), ("cpus", ray_cpus), ("gpus", ray_gpus)):
            if value is not None:
                raise UserError(f"--ray-{name} applies to a sweep with --ray")
        return None
    from kvbench.ray_sweep import RayExecutor

    return RayExecutor(
        model=options["model"],
        device=options["device"],
        dtype=options["dtype"],
        address=None if ray_address == LOCAL_RAY else ray_address,
        workers=ray_workers,
        cpus=ray_cpus or 1,
        gpus=ray_gpus or 0.0,
    )


def protocol_of(protocol: str, interval: int | None, chunk: int | None) -> tuple[str, tuple]:
    """(protocol, protocol_args) after validation: each argument belongs to its protocol."""
    given = {name: value for name, value in (("interval", interval), ("chunk", chunk)) if value is not None}
    wanted = PROTOCOL_NAMES[protocol]
    for name in given:
        if wanted is None or wanted[0] != name:
            owner = next(key for key, arg in PROTOCOL_NAMES.items() if arg and arg[0] == name)
            raise UserError(f"--{name} applies to --protocol {owner}, not {protocol}")
    if wanted is None:
        return protocol, ()
    name, default = wanted
    value = given.get(name, default)
    if value < 1:
        raise UserError(f"--{name} must be at least 1, got {value}")
    return protocol, ((name, value),)


def parse_memory(value) -> float:
    try:
        memory = float(value)
    except ValueError:
        raise UserError(f"memory must be a number in (0, 1], got {value!r}") from None
    if not 0 < memory <= 1:
        raise UserError(f"memory must be in (0, 1] (a fraction of the 16-bit full cache), got {value}")
    return memory


def budget_configs(press: str, ratios, memories, protocol: tuple[str, tuple], press_args=()) -> list:
    """The configs of one press: one per ratio, or one per memory budget (evictors at ratio 1 - memory,
    codecs solving their own knobs for it)."""
    from kvbench.engine import Config

    name, protocol_args = protocol
    if memories:
        codec = PRESSES[press].codec if press in PRESSES else False
        return [
            Config(press, 0.0 if codec else round(1 - m, 10), press_args, None, m, name, protocol_args)
            for m in memories
        ]
    return [Config(press, r, press_args, protocol=name, protocol_args=protocol_args) for r in ratios]


DEFAULT_SUITE = "ruler-smoke"


def plan_tasks(suite, task_list, length, samples):
    """(suite name, tasks, length, samples) after validation against the registry."""
    suite_spec = None
    if suite or not task_list:
        name = suite or DEFAULT_SUITE
        if name not in tasks.suite_names():
            raise UserError(f"unknown suite {name!r} (see `kvbench tasks`)")
        suite_spec = tasks.load_suite(name)
    names = list(task_list) or suite_spec.tasks
    for name in names:
        if name not in tasks.task_names():
            raise UserError(f"unknown task {name!r} (see `kvbench tasks`)")
    if length is not None and length < 1:
        raise UserError(f"--length must be at least 1, got {length}")
    length = length if length is not None else (suite_spec.length if suite_spec else None)
    samples = samples if samples is not None else (suite_spec.samples if suite_spec else 5)
    if samples < 1:
        raise UserError(f"--samples must be at least 1, got {samples}")
    for name in names:
        minimum = tasks.family_of(name).min_length(name)
        if length is not None and length < minimum:
            raise UserError(f"--length {length} is below the minimum of task {name!r} ({minimum})")
    return (suite_spec.name if suite_spec else None), names, length, samples


DEFAULT_LENGTH = 1024  # RULER tasks named without a suite or --length


def task_lengths(names: list[str], length: int | None, limit: int | None, model: str) -> dict[str, int]:
    """Each task's context length, checked against the model's context (`limit`) before any work: the
    one asked for; without one, LongBench's official per-model limit and RULER's 1024."""
    lengths = {}
    for name in names:
        if length is not None:
            lengths[name] = length
        elif name in tasks.longbench.TASKS:
            if limit is None:
                raise UserError(f"give --length: the context length of model {model!r} is unknown")
            lengths[name] = tasks.longbench.official_length(limit)
        else:
            lengths[name] = DEFAULT_LENGTH
        minimum = tasks.family_of(name).min_length(name)
        if lengths[name] < minimum:
            raise UserError(
                f"length {lengths[name]} is below the minimum of task {name!r} ({minimum})"
                + ("" if length is not None else f", from the {limit}-token context of model {model!r}")
            )
        if limit is not None and lengths[name] > limit:
            raise UserError(f"--length {lengths[name]} exceeds the {limit}-token context of model {model!r}")
    return lengths


def parse_ratio(value) -> float:
    try:
        ratio = float(value)
    except ValueError:
        raise UserError(f"ratio must be a number in [0, 1), got {value!r}") from None
    if not 0 <= ratio < 1:
        raise UserError(f"ratio must be in [0, 1), got {value}")
    return ratio + 0.0  # -0.0 is 0.0


def execute(
    configs,
    suite,
    task_list,
    length,
    samples,
    seed,
    data_dir,
    out,
    force,
    batch_configs,
    model,
    device,
    dtype,
    executor=None,
):
    """Shared body of `run` and `sweep`: validate everything (cheap checks first: names, numbers, files,
    press arguments, the device, the lengths against the model's context), load the model, run, print.

    With an `executor` (kvbench.ray_sweep.RayExecutor) the rows are computed by Ray workers: the model loads
    here on the CPU, only to plan (context lengths, learned state), and `device` is the workers'."""
    from kvbench.engine import check_protocol
    from kvbench.models import check_device, context_limit, load_model, resolve
    from kvbench.results import ResultsStore, check_writable
    from kvbench.runner import Plan, run_plan, summarize

    suite_name, names, length, samples = plan_tasks(suite, task_list, length, samples)
    if data_dir is not None and not data_dir.is_dir():
        raise UserError(f"--data-dir {str(data_dir)!r} is not a folder")
    for name in names:  # local data files are read now: a malformed line fails before the model loads
        tasks.check_data(name, data_dir)
    for config in configs:
        check_press_runnable(config.press)
        check_protocol(config)
    # Bad press arguments fail here (`none` takes none), before the model loads.
    presses = [
        build_press(config.press, config.ratio, memory=config.memory, **dict(config.press_args))
        for config in configs
    ]
    check_writable(out)
    if executor is None:
        check_device(device)
    resolve(model)
    limit = context_limit(model)
    lengths = task_lengths(names, length, limit, model) if limit is not None or length is not None else None
    if executor is not None:
        executor.start()  # the Ray cluster joined (or started) and checked before the model loads
    # The engine switches to eager attention itself for the configs that need attention weights.
    model_, tokenizer = load_model(model, device="cpu" if executor else device, dtype=dtype)
    if lengths is None:  # a hub model whose config was not at hand: its context is known now
        lengths = task_lengths(names, length, model_.config.get_text_config().max_position_embeddings, model)
    for press in filter(None, presses):
        press.post_init_from_model(model_)  # e.g. KVP agents made for another model fail here
    # Rows of presses with learned state (KVP agents) are keyed by that state: retrained agents get new rows.
    configs = [
        dataclasses.replace(config, press_state=press_state(press))
        for config, press in zip(configs, presses, strict=True)
    ]
    plan = Plan(
        configs=configs,
        tasks=names,
        length=length,
        lengths={name: value for name, value in lengths.items() if value != length},
        samples=samples,
        seed=seed,
        suite=suite_name,
        data_dir=data_dir,
        batch_configs=batch_configs,
        force=force,
        extra={"device": device, "dtype": dtype},
    )
    frame = run_plan(model_, tokenizer, plan, ResultsStore(out), executor=executor)
    table = summarize(frame)
    click.echo(table.round(1).to_string() if not table.empty else "no results")
    click.echo(f"results: {out}/rows.jsonl  (kvbench report {out} --out reports/NAME)")


@main.command()
@click.option("--press", required=True, help="Press name (see `kvbench presses`).")
@click.option("--ratio", default=None, help="Fraction of KV entries removed, in [0, 1).")
@click.option(
    "--memory",
    default=None,
    help="Instead of --ratio: the fraction of the 16-bit full cache the press may store, in (0, 1].",
)
@click.option(
    "--press-arg",
    "press_args",
    multiple=True,
    metavar="KEY=VALUE",
    help="Press parameter (repeatable), e.g. window_size=32 or inner=tova.",
)
@protocol_options
@task_options
@model_options
def run(press, ratio, memory, press_args, protocol, interval, chunk, **options):
    """Score one press at one compression ratio (or memory budget) on a suite or tasks.

    The context is prefilled and compressed, then the question is answered greedily on top of the
    compressed cache (kvpress's protocol; see --protocol for the others). Writes one row per sample to
    OUT/rows.jsonl and a run record (config, versions, git commit, scores) to OUT/runs/.

    \b
    Examples:
      kvbench run --press snapkv --ratio 0.5 --task niah_single_1 --samples 4
      kvbench run --press quant --memory 0.25                 # a codec at a quarter of the cache's bytes
      kvbench run --press knorm --ratio 0.75 --protocol streaming --chunk 128
    """
    if (ratio is None) == (memory is None):
        raise UserError("give one of --ratio or --memory")
    args = tuple(sorted(parse_press_args(press_args).items()))
    ratios, memories = ([parse_ratio(ratio)], []) if memory is None else ([], [parse_memory(memory)])
    configs = budget_configs(press, ratios, memories, protocol_of(protocol, interval, chunk), args)
    execute(configs, **options)


@main.command()
@click.option("--presses", required=True, help="Comma-separated press names, e.g. kvp,snapkv,h2o,tova.")
@click.option("--ratios", default=None, help="Comma-separated ratios in [0, 1), e.g. 0.25,0.5,0.75,0.9.")
@click.option(
    "--memory",
    default=None,
    help="Instead of --ratios: comma-separated memory budgets in (0, 1] (fractions of the 16-bit full "
    "cache), e.g. 0.5,0.25,0.1. Evictors run at ratio 1 - memory, codecs solve their own knobs.",
)
@protocol_options
@task_options
@model_options
@ray_options
def sweep(
    presses,
    ratios,
    memory,
    protocol,
    interval,
    chunk,
    ray_address,
    ray_workers,
    ray_cpus,
    ray_gpus,
    **options,
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
    """
    from kvbench.engine import Config

    if (ratios is None) == (memory is None):
        raise UserError("give one of --ratios or --memory")
    press_names = [name.strip() for name in presses.split(",") if name.strip()]
    ratio_values = [parse_ratio(value) for value in (ratios or "").split(",") if value.strip()]
    memory_values = [parse_memory(value) for value in (memory or "").split(",") if value.strip()]
    if not press_names or not (ratio_values or memory_values):
        raise UserError("--presses and --ratios (or --memory) must each name at least one value")
    protocol = protocol_of(protocol, interval, chunk)
    configs = [Config("none", 0.0, protocol=protocol[0], protocol_args=protocol[1])] + [
        config
        for name in press_names
        if name != "none"
        for config in budget_configs(name, ratio_values, memory_values, protocol)
    ]
    if len(set(configs)) != len(configs):
        raise UserError("duplicate configs: each press and ratio may appear once")
    executor = ray_executor(ray_address, ray_workers, ray_cpus, ray_gpus, options)
    execute(drop_unreachable_budgets(configs), executor=executor, **options)


def drop_unreachable_budgets(configs: list) -> list:
    """A sweep's grid may ask a codec for a memory it cannot reach (2-bit codes still cost more than 10 %):
    those cells are left out with a note on stderr, the rest runs. (`run` refuses such a budget.)"""
    kept = []
    for config in configs:
        if config.press in PRESSES and PRESSES[config.press].codec:
            try:
                config.build_press()
            except ValueError as error:
                click.echo(f"skipped {config.press} at memory {config.memory}: {error}", err=True)
                continue
        kept.append(config)
    return kept


@main.command(name="presses")
def list_presses():
    """List every press: name, what it does, what it needs."""
    width = max(map(len, PRESSES))
    for spec in PRESSES.values():
        needs = f"  [needs: {', '.join(spec.needs)}]" if spec.needs else ""
        click.echo(f"{spec.name:<{width}}  {spec.description}{needs}")


@main.command(name="tasks")
def list_tasks():
    """List task families, tasks and suites."""
    for family, module in tasks.TASK_FAMILIES.items():
        click.echo(f"{family}:")
        for name, description in module.TASKS.items():
            click.echo(f"  {name:<28} {description}")
    click.echo("suites (tasks/*.yaml):")
    for name in tasks.suite_names():
        suite = tasks.load_suite(name)
        length = f"{suite.length} tokens" if suite.length else "the model's limit"
        click.echo(
            f"  {name:<28} {len(suite.tasks)} tasks x {suite.samples} samples at {length}"
            f"  {suite.description}"
        )


if __name__ == "__main__":
    sys.exit(main())
