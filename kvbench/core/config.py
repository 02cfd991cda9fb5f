"""One config of a run, and the protocol vocabulary every layer shares (planning, engine, results, report).

In the lowest layer of kvbench, so the results store and the report can name protocols without importing
the engine. Building a config's press is `presses.config_press(config)`.
"""

import contextlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from kvbench.core.errors import BadInput
from kvbench.core.registry import PluginError, Registry, is_target

DEFAULT_PROTOCOL = "query-agnostic"  # also what rows written before protocols were recorded mean


PROTOCOL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*\Z")
OPTION_NAME = re.compile(r"[a-z][a-z0-9_]*\Z")  # a command-line option and a Python keyword at once
# What `kvbench run`/`sweep` and `kvbench.run`/`sweep` take already (options, as keywords too): no
# protocol's option may take one of these names (tests/engine/test_protocol_plugins.py keeps it complete).
RESERVED_OPTIONS = frozenset(
    "batch_configs budget config configs data data_dir device dtype executor force help include_path "
    "length memory metric model out press press_arg press_args presses progress protocol ratio ratios "
    "ray ray_address ray_cpus ray_gpus ray_workers samples seed setup suite task tasks tokenizer".split()
)


@dataclass(frozen=True)
class Protocol:
    """A protocol: what the engine prefills, compresses, asks and decodes. `run` is the function that
    answers a sample's configs under it (`engine.protocols`), or its `module:function` target, loaded
    when the engine first runs it; the flags say what every other layer asks of it, instead of comparing
    names. `option` is its one argument (also its command-line option and Python keyword), with its
    `default` (a whole number >= 1) and `option_help`; `description` is its sentence in --help. BadInput
    for a field that cannot be one of these."""

    name: str
    description: str
    run: str | Callable
    option: str | None = None
    default: int | None = None
    option_help: str = ""
    question_prefilled: bool = False  # the question is prefilled and compressed with the context
    compresses_again: bool = False  # the press compresses the cache again after the prefill, as it grows
    several_questions: bool = False  # a context carries `option` questions: one row per question
    answers_stay: bool = False  # each question and its answer stay in the cache, compressed after each turn

    def __post_init__(self):
        where = f"protocol {self.name!r}"
        if not isinstance(self.name, str) or not PROTOCOL_NAME.match(self.name):
            raise BadInput(f"protocol name {self.name!r}: use letters, digits, _ and -")
        if not isinstance(self.description, str) or not isinstance(self.option_help, str):
            raise BadInput(f"{where}: description and option_help are texts")
        if not callable(self.run) and not (isinstance(self.run, str) and is_target(self.run)):
            raise BadInput(f"{where}: run must be a function or a 'module:function' target, got {self.run!r}")
        if self.option is not None:
            if not isinstance(self.option, str) or not OPTION_NAME.match(self.option):
                raise BadInput(f"{where}: option {self.option!r} must be lower-case letters, digits and _")
            if self.option in RESERVED_OPTIONS:
                raise BadInput(f"{where}: option {self.option!r} is one of kvbench's own options")
            if type(self.default) is not int or self.default < 1:
                raise BadInput(f"{where}: option {self.option!r} needs a default, a whole number >= 1")
        elif self.default is not None:
            raise BadInput(f"{where}: a default ({self.default!r}) without an option")
        flags = (self.question_prefilled, self.compresses_again, self.several_questions, self.answers_stay)
        if not all(isinstance(flag, bool) for flag in flags):
            raise BadInput(f"{where}: its flags are True or False")
        if self.answers_stay and not (self.several_questions and self.compresses_again):
            raise BadInput(f"{where}: answers_stay asks several_questions and compresses_again")
        if self.several_questions and self.option is None:
            raise BadInput(f"{where}: several_questions needs an option (the questions per context)")

    @property
    def arguments(self) -> tuple[str, ...]:
        return (self.option,) if self.option else ()


def protocol_from_plugin(name: str, loaded: object) -> Protocol:
    """What a `kvbench.protocols` entry point loads: a Protocol of that name."""
    if not isinstance(loaded, Protocol):
        raise BadInput(f"loads {type(loaded).__name__}, not a kvbench Protocol")
    if loaded.name != name:
        raise BadInput(f"loads the protocol {loaded.name!r}, not {name!r}")
    return loaded


# Built-ins first, in the order reports show their sections; then protocols of installed packages.
PROTOCOLS: Registry[Protocol] = Registry("protocols", protocol_from_plugin)
ENGINE = "kvbench.engine.protocols"
for protocol in (
    Protocol(
        "query-agnostic",
        "compress the context once, then ask (kvpress's pipeline)",
        f"{ENGINE}.query_agnostic:run",
    ),
    Protocol(
        "query-aware",
        "the question is prefilled and compressed with the context (kvpress's query_aware)",
        f"{ENGINE}.query_agnostic:run",
        question_prefilled=True,
    ),
    Protocol(
        "decode-time",
        "also compress every --interval decoding steps back to the budget",
        f"{ENGINE}.decode_time:run",
        "interval",
        16,
        "decode-time: decoding steps between compressions [16].",
        compresses_again=True,
    ),
    Protocol(
        "streaming",
        "feed the context --chunk tokens at a time, compressing back under the budget after each, then ask",
        f"{ENGINE}.streaming:run",
        "chunk",
        256,
        "streaming: context tokens per chunk [256].",
        compresses_again=True,
    ),
    Protocol(
        "multi-question",
        "compress once, answer --questions questions from that cache, each answer removed after "
        "(kvpress's pipeline with a list of questions; SCBench's multi-request)",
        f"{ENGINE}.multi_question:run",
        "questions",
        4,
        "multi-question: questions per context [4] (from as many samples of the tasks, one context).",
        several_questions=True,
    ),
    Protocol(
        "multi-turn",
        "--turns turns whose questions and answers stay in the cache, compressed back to the budget "
        "after each (SCBench's multi-turn)",
        f"{ENGINE}.multi_turn:run",
        "turns",
        4,
        "multi-turn: turns per context [4].",
        compresses_again=True,
        several_questions=True,
        answers_stay=True,
    ),
):
    PROTOCOLS.register(protocol.name, protocol)


def register_protocol(protocol: Protocol, *, replace: bool = False) -> Protocol:
    """Add a protocol of your own (its run a function, or a `module:function` target that Ray workers can
    import); BadInput if it is no Protocol, its name is taken (unless `replace`) or its option is another
    protocol's."""
    if not isinstance(protocol, Protocol):
        raise BadInput(f"register_protocol takes a kvbench Protocol, not {type(protocol).__name__}")
    taken = {option: p.name for option, p in protocol_by_option().items() if p.name != protocol.name}
    if protocol.option in taken:
        owner = taken[protocol.option]
        raise BadInput(f"protocol {protocol.name!r}: --{protocol.option} is the option of protocol {owner!r}")
    return PROTOCOLS.register(protocol.name, protocol, replace=replace)


# kvbench's own protocols rows may record, in the order reports show them (lm-eval's own tasks write
# query-aware; `kvbench perplexity` writes perplexity); a plugin's protocols follow.
RECORDED_PROTOCOLS = (*PROTOCOLS.entries, "perplexity")


def protocol_of(config: "Config") -> Protocol:
    """The Protocol of a config (KeyError for a name that is none: `engine.check_protocol` says so first)."""
    return PROTOCOLS[config.protocol]


def usable_protocols() -> dict[str, Protocol]:
    """The protocols that load, by name: a plugin that fails to is left out here, and fails in one line
    where it is named (`PROTOCOLS[name]`)."""
    usable = {}
    for name in PROTOCOLS:
        with contextlib.suppress(PluginError):
            usable[name] = PROTOCOLS[name]
    return usable


def protocol_by_option() -> dict[str, Protocol]:
    """Each protocol argument's option name -> its protocol."""
    return {protocol.option: protocol for protocol in usable_protocols().values() if protocol.option}


@dataclass(frozen=True)
class Config:
    """One point of a sweep. `press_args` and `protocol_args` are sorted tuples of (key, value) so configs
    are hashable; `press_state` is the digest of the learned state the press loads (`presses.press_state`);
    `memory` is the budget asked for (fraction of the 16-bit full cache) when the config was given one;
    `budget` the absolute number of KV entries kept per head (and per layer) when given one instead: each
    sample's ratio is then 1 - budget / its context length (`ratio` holds 0.0).

    `press` is the registry's name, what rows record and are keyed by; `resolved` is the press resolved
    once where the config was planned (`presses.ResolvedPress`: its factory, arguments, source and what it
    declares), which checks and the engine ask instead of the registry. It is no part of the config's
    identity: not compared, hashed, shown or recorded."""

    press: str
    ratio: float
    press_args: tuple[tuple[str, Any], ...] = ()
    press_state: str | None = None
    memory: float | None = None
    protocol: str = DEFAULT_PROTOCOL
    protocol_args: tuple[tuple[str, int], ...] = ()
    budget: int | None = None
    resolved: Any = field(default=None, compare=False, repr=False)

    def as_record(self) -> dict:
        """The config as run records write it: every field but `resolved`."""
        return {item.name: getattr(self, item.name) for item in fields(self) if item.name != "resolved"}


def budget_label(ratio: float, memory: float | None = None, budget: int | None = None) -> str:
    """How a config's budget reads in tables: `budget=64`, `memory=0.25`, or its ratio (a frame's missing
    values, NaN, count as not given)."""
    if budget is not None and budget == budget:
        return f"budget={int(budget)}"
    if memory is not None and memory == memory:
        return f"memory={memory:g}"
    return f"{ratio:g}"
