"""One config of a run, and the protocol vocabulary every layer shares (planning, engine, results, report).

The lowest layer of kvbench: it imports nothing of kvbench, so the results store and the report can name
protocols without importing the engine. Building a config's press is `presses.config_press(config)`.
"""

from dataclasses import dataclass
from typing import Any

DEFAULT_PROTOCOL = "query-agnostic"  # also what rows written before protocols were recorded mean
# Each protocol's own argument and its default, in the order reports show their sections.
PROTOCOL_ARGS: dict[str, tuple[str, int] | None] = {
    "query-agnostic": None,
    "query-aware": None,  # the question is prefilled and compressed with the context (kvpress's query_aware)
    "decode-time": ("interval", 16),
    "streaming": ("chunk", 256),
    # One context, several questions: compressed once, each question answered from that cache, its answer
    # removed after (kvpress's pipeline with a list of questions; SCBench's multi-request).
    "multi-question": ("questions", 4),
    # One context, several turns: each question and its answer stay in the cache, which is compressed back
    # to its budget after every turn (SCBench's multi-turn).
    "multi-turn": ("turns", 4),
}
PROTOCOLS = {name: (arg[0],) if arg else () for name, arg in PROTOCOL_ARGS.items()}  # name: its arguments
# Protocols whose samples carry several questions (`Sample.parts`): one row per (config, sample, question).
MULTI_QUESTION_PROTOCOLS = ("multi-question", "multi-turn")
# Every protocol rows may record, in the order reports show them (lm-eval's own tasks write query-aware;
# `kvbench perplexity` writes perplexity).
RECORDED_PROTOCOLS = (*PROTOCOLS, "perplexity")


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
