"""From what a user asks (presses, ratios or memory budgets, a protocol, a suite or tasks, lengths) to the
configs and tasks of a run, every value checked before any model loads.

`kvbench run`/`sweep` and the Python API (`kvbench.run`, `kvbench.sweep`) both plan here, so they score the
same rows. Errors are `BadInput`/`UnknownTask`/`UnknownPress`: one line naming the culprit (and the CLI
option that sets it, which is also the keyword of the Python API).
"""

import dataclasses
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

from kvbench import tasks
from kvbench.config import DEFAULT_PROTOCOL, PROTOCOL_ARGS, Config
from kvbench.errors import BadInput, KvbenchWarning
from kvbench.presses import (
    PRESSES,
    build_press,
    check_press_runnable,
    config_press,
    press_state,
    unknown_press,
)

DEFAULT_SUITE = "ruler-smoke"
DEFAULT_LENGTH = 1024  # RULER tasks named without a suite or a length


def parse_ratio(value: float | str) -> float:
    """A compression ratio (fraction of KV entries removed) in [0, 1), from a number or its text."""
    try:
        ratio = float(value)
    except (TypeError, ValueError):
        raise BadInput(f"ratio must be a number in [0, 1), got {value!r}") from None
    if not 0 <= ratio < 1:
        raise BadInput(f"ratio must be in [0, 1), got {value}")
    return ratio + 0.0  # -0.0 is 0.0


def parse_memory(value: float | str) -> float:
    """A memory budget (fraction of the 16-bit full cache) in (0, 1], from a number or its text."""
    try:
        memory = float(value)
    except (TypeError, ValueError):
        raise BadInput(f"memory must be a number in (0, 1], got {value!r}") from None
    if not 0 < memory <= 1:
        raise BadInput(f"memory must be in (0, 1] (a fraction of the 16-bit full cache), got {value}")
    return memory


def protocol_of(protocol: str, interval: int | None = None, chunk: int | None = None) -> tuple[str, tuple]:
    """(protocol, protocol_args) after validation: each argument belongs to its protocol."""
    if protocol not in PROTOCOL_ARGS:
        raise BadInput(f"unknown protocol {protocol!r} (one of {', '.join(PROTOCOL_ARGS)})")
    given = {name: value for name, value in (("interval", interval), ("chunk", chunk)) if value is not None}
    wanted = PROTOCOL_ARGS[protocol]
    for name in given:
        if wanted is None or wanted[0] != name:
            owner = next(key for key, arg in PROTOCOL_ARGS.items() if arg and arg[0] == name)
            raise BadInput(f"--{name} applies to --protocol {owner}, not {protocol}")
    if wanted is None:
        return protocol, ()
    name, default = wanted
    value = given.get(name, default)
    if value < 1:
        raise BadInput(f"--{name} must be at least 1, got {value}")
    return protocol, ((name, value),)


def budget_configs(
    press: str,
    ratios: Sequence[float],
    memories: Sequence[float],
    protocol: tuple[str, tuple] = (DEFAULT_PROTOCOL, ()),
    press_args: tuple = (),
) -> list[Config]:
    """The configs of one press: one per ratio, or one per memory budget (evictors at ratio 1 - memory,
    codecs solving their own knobs for it). An unknown press name fails here, before anything heavy."""
    if press not in PRESSES:
        raise unknown_press(press)
    name, protocol_args = protocol
    if memories:
        codec = PRESSES[press].codec
        return [
            Config(press, 0.0 if codec else round(1 - m, 10), press_args, None, m, name, protocol_args)
            for m in memories
        ]
    return [Config(press, r, press_args, protocol=name, protocol_args=protocol_args) for r in ratios]


def configs_for_run(
    press: str,
    ratio: float | str | None = None,
    memory: float | str | None = None,
    press_args: dict | None = None,
    protocol: str = DEFAULT_PROTOCOL,
    interval: int | None = None,
    chunk: int | None = None,
) -> list[Config]:
    """The one config of `kvbench run`: a press at a ratio or at a memory budget."""
    if (ratio is None) == (memory is None):
        raise BadInput("give one of --ratio or --memory")
    args = tuple(sorted((press_args or {}).items()))
    ratios, memories = ([parse_ratio(ratio)], []) if memory is None else ([], [parse_memory(memory)])
    return budget_configs(press, ratios, memories, protocol_of(protocol, interval, chunk), args)


def configs_for_sweep(
    presses: Sequence[str] | str,
    ratios: Sequence[float | str] | str | None = None,
    memory: Sequence[float | str] | str | None = None,
    protocol: str = DEFAULT_PROTOCOL,
    interval: int | None = None,
    chunk: int | None = None,
    press_args: dict | None = None,
) -> list[Config]:
    """The grid of `kvbench sweep`: no compression, then every press at every ratio (or memory budget).
    `press_args` go to every press of the grid (e.g. another set of KVP agents), never to `none`.

    Each list may also be given as comma-separated text ("knorm,snapkv", "0.25,0.5"). A codec asked for a
    memory it cannot reach (2-bit codes still cost more than 10 %) is left out of the grid with a
    KvbenchWarning; `configs_for_run` refuses such a budget instead.
    """
    if (ratios is None) == (memory is None):
        raise BadInput("give one of --ratios or --memory")
    names = [name.strip() for name in split(presses) if name.strip()]
    ratio_values = [parse_ratio(value) for value in split(ratios) if str(value).strip()]
    memory_values = [parse_memory(value) for value in split(memory) if str(value).strip()]
    if not names or not (ratio_values or memory_values):
        raise BadInput("--presses and --ratios (or --memory) must each name at least one value")
    protocol_ = protocol_of(protocol, interval, chunk)
    configs = [Config("none", 0.0, protocol=protocol_[0], protocol_args=protocol_[1])] + [
        config
        for name in names
        if name != "none"
        for config in budget_configs(
            name, ratio_values, memory_values, protocol_, tuple(sorted((press_args or {}).items()))
        )
    ]
    if len(set(configs)) != len(configs):
        raise BadInput("duplicate configs: each press and ratio may appear once")
    return drop_unreachable_budgets(configs)


def split(values: Sequence | str | None) -> Sequence:
    return values.split(",") if isinstance(values, str) else (values or ())


def drop_unreachable_budgets(configs: list[Config]) -> list[Config]:
    """The configs but those of codecs at a memory they cannot reach, each said in a KvbenchWarning."""
    kept = []
    for config in configs:
        if config.press in PRESSES and PRESSES[config.press].codec:
            try:
                config_press(config)
            except BadInput as error:
                message = f"skipped {config.press} at memory {config.memory}: {error}"
                warnings.warn(message, KvbenchWarning, stacklevel=3)
                continue
        kept.append(config)
    return kept


def check_configs(configs: list[Config]) -> list:
    """Fail before any work if a press cannot run here, takes bad arguments, or does not fit its protocol;
    the presses, built (None for `none`). Imports the engine, so kvpress and torch: the checks of names,
    numbers and paths come before it."""
    from kvbench.engine import check_protocol

    for config in configs:
        check_press_runnable(config.press)
        check_protocol(config)
    return [
        build_press(config.press, config.ratio, memory=config.memory, **dict(config.press_args))
        for config in configs
    ]


def check_learned_state(presses: list, model_name: str) -> None:
    """Fail before the model loads if a learned press (or a press it wraps) has no state for `model_name`
    or state made for another model: each such press checks its own files (`check_for_model`)."""
    import kvpress

    for press in filter(None, presses):
        if hasattr(press, "check_for_model"):
            press.check_for_model(model_name)
        check_learned_state([p for p in vars(press).values() if isinstance(p, kvpress.BasePress)], model_name)


def key_by_learned_state(model, configs: list[Config], presses: list) -> list[Config]:
    """The configs with `press_state` set: the digest of the learned state (KVP's agents, DistillCache's
    policy, MemDecay's calibration) each press loads for `model`. Rows are keyed by it, so retrained agents
    get new rows. Presses made for another model fail here, before any work."""
    for press in filter(None, presses):
        press.post_init_from_model(model)
    return [
        dataclasses.replace(config, press_state=press_state(press))
        for config, press in zip(configs, presses, strict=True)
    ]


@dataclass
class TaskPlan:
    """The tasks of a run after validation: the suite named (if any), task names, length, samples."""

    suite: str | None
    tasks: list[str]
    length: int | None  # None: each task's default for the model (`task_lengths`)
    samples: int


def plan_tasks(
    suite: str | None = None,
    task_list: Sequence[str] = (),
    length: int | None = None,
    samples: int | None = None,
) -> TaskPlan:
    """The suite's tasks (the default suite without tasks or suite), or the tasks named; the suite's
    length and samples unless given. Checked against the registry and each task's minimum length."""
    task_list = [task_list] if isinstance(task_list, str) else list(task_list)
    suite_spec = None
    if suite or not task_list:
        name = suite or DEFAULT_SUITE
        if name not in tasks.suite_names():
            raise tasks.unknown_suite(name)
        suite_spec = tasks.load_suite(name)
    names = list(task_list) or suite_spec.tasks
    for name in names:
        if name not in tasks.task_names():
            raise tasks.unknown_task(name)
    if length is not None and length < 1:
        raise BadInput(f"--length must be at least 1, got {length}")
    length = length if length is not None else (suite_spec.length if suite_spec else None)
    samples = samples if samples is not None else (suite_spec.samples if suite_spec else 5)
    if samples < 1:
        raise BadInput(f"--samples must be at least 1, got {samples}")
    for name in names:
        minimum = tasks.family_of(name).min_length(name)
        if length is not None and length < minimum:
            raise BadInput(f"--length {length} is below the minimum of task {name!r} ({minimum})")
    return TaskPlan(suite_spec.name if suite_spec else None, names, length, samples)


def task_lengths(names: list[str], length: int | None, limit: int | None, model: str) -> dict[str, int]:
    """Each task's context length, checked against the model's context (`limit`) before any work: the
    one asked for; without one, LongBench's official per-model limit and RULER's 1024."""
    lengths = {}
    for name in names:
        if length is not None:
            lengths[name] = length
        elif name in tasks.longbench.TASKS:
            if limit is None:
                raise BadInput(f"give --length: the context length of model {model!r} is unknown")
            lengths[name] = tasks.longbench.official_length(limit)
        else:
            lengths[name] = DEFAULT_LENGTH
        minimum = tasks.family_of(name).min_length(name)
        if lengths[name] < minimum:
            raise BadInput(
                f"length {lengths[name]} is below the minimum of task {name!r} ({minimum})"
                + ("" if length is not None else f", from the {limit}-token context of model {model!r}")
            )
        if limit is not None and lengths[name] > limit:
            raise BadInput(f"--length {lengths[name]} exceeds the {limit}-token context of model {model!r}")
    return lengths
