"""One config of a run, and the protocol vocabulary every layer shares (planning, engine, results, report).

The lowest layer of kvbench: it imports nothing of kvbench, so the results store and the report can name
protocols without importing the engine. Building a config's press is `presses.config_press(config)`.
"""

from dataclasses import dataclass
from typing import Any

DEFAULT_PROTOCOL = "query-agnostic"  # also what rows written before protocols were recorded mean


@dataclass(frozen=True)
class Protocol:
    """A protocol: what the engine prefills, compresses, asks and decodes, said by its flags, which every
    layer asks instead of comparing names. `option` is its one argument (also its command-line option and
    Python keyword), with its `default` and `option_help`; `description` is its sentence in --help."""

    name: str
    description: str
    option: str | None = None
    default: int | None = None
    option_help: str = ""
    question_prefilled: bool = False  # the question is prefilled and compressed with the context
    context_streamed: bool = False  # the context arrives `option` tokens at a time, compressed after each
    compresses_decoding: bool = False  # the cache is compressed again every `option` decoding steps
    several_questions: bool = False  # a context carries `option` questions: one row per question
    answers_stay: bool = False  # each question and its answer stay in the cache, compressed after each turn

    @property
    def compresses_again(self) -> bool:
        """Whether the cache is compressed again after the prefill (the press compresses a live cache)."""
        return self.context_streamed or self.compresses_decoding or self.answers_stay

    @property
    def arguments(self) -> tuple[str, ...]:
        return (self.option,) if self.option else ()


# In the order reports show their sections.
PROTOCOLS: dict[str, Protocol] = {
    protocol.name: protocol
    for protocol in (
        Protocol("query-agnostic", "compress the context once, then ask (kvpress's pipeline)"),
        Protocol(
            "query-aware",
            "the question is prefilled and compressed with the context (kvpress's query_aware)",
            question_prefilled=True,
        ),
        Protocol(
            "decode-time",
            "also compress every --interval decoding steps back to the budget",
            "interval",
            16,
            "decode-time: decoding steps between compressions [16].",
            compresses_decoding=True,
        ),
        Protocol(
            "streaming",
            "feed the context --chunk tokens at a time, compressing back under the budget after each, "
            "then ask",
            "chunk",
            256,
            "streaming: context tokens per chunk [256].",
            context_streamed=True,
        ),
        Protocol(
            "multi-question",
            "compress once, answer --questions questions from that cache, each answer removed after "
            "(kvpress's pipeline with a list of questions; SCBench's multi-request)",
            "questions",
            4,
            "multi-question: questions per context [4] (from as many samples of the tasks, one context).",
            several_questions=True,
        ),
        Protocol(
            "multi-turn",
            "--turns turns whose questions and answers stay in the cache, compressed back to the budget "
            "after each (SCBench's multi-turn)",
            "turns",
            4,
            "multi-turn: turns per context [4].",
            several_questions=True,
            answers_stay=True,
        ),
    )
}
# Every protocol rows may record, in the order reports show them (lm-eval's own tasks write query-aware;
# `kvbench perplexity` writes perplexity).
RECORDED_PROTOCOLS = (*PROTOCOLS, "perplexity")


def protocol_of(config: "Config") -> Protocol:
    """The Protocol of a config (KeyError for a name that is none: `engine.check_protocol` says so first)."""
    return PROTOCOLS[config.protocol]


def protocol_by_option() -> dict[str, Protocol]:
    """Each protocol argument's option name -> its protocol."""
    return {protocol.option: protocol for protocol in PROTOCOLS.values() if protocol.option}


@dataclass(frozen=True)
class Config:
    """One point of a sweep. `press_args` and `protocol_args` are sorted tuples of (key, value) so configs
    are hashable; `press_state` is the digest of the learned state the press loads (`presses.press_state`);
    `memory` is the budget asked for (fraction of the 16-bit full cache) when the config was given one;
    `budget` the absolute number of KV entries kept per head (and per layer) when given one instead: each
    sample's ratio is then 1 - budget / its context length (`ratio` holds 0.0)."""

    press: str
    ratio: float
    press_args: tuple[tuple[str, Any], ...] = ()
    press_state: str | None = None
    memory: float | None = None
    protocol: str = DEFAULT_PROTOCOL
    protocol_args: tuple[tuple[str, int], ...] = ()
    budget: int | None = None


def budget_label(ratio: float, memory: float | None = None, budget: int | None = None) -> str:
    """How a config's budget reads in tables: `budget=64`, `memory=0.25`, or its ratio (a frame's missing
    values, NaN, count as not given)."""
    if budget is not None and budget == budget:
        return f"budget={int(budget)}"
    if memory is not None and memory == memory:
        return f"memory={memory:g}"
    return f"{ratio:g}"
