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
    "decode-time": ("interval", 16),
    "streaming": ("chunk", 256),
}
PROTOCOLS = {name: (arg[0],) if arg else () for name, arg in PROTOCOL_ARGS.items()}  # name: its arguments
# Protocols that rows may record but `run`/`sweep` do not plan: lm-eval compresses a non-RULER prompt whole.
RECORDED_PROTOCOLS = (*PROTOCOLS, "query-aware")


@dataclass(frozen=True)
class Config:
    """One point of a sweep. `press_args` and `protocol_args` are sorted tuples of (key, value) so configs
    are hashable; `press_state` is the digest of the learned state the press loads (`presses.press_state`);
    `memory` is the budget asked for (fraction of the 16-bit full cache) when the config was given one."""

    press: str
    ratio: float
    press_args: tuple[tuple[str, Any], ...] = ()
    press_state: str | None = None
    memory: float | None = None
    protocol: str = DEFAULT_PROTOCOL
    protocol_args: tuple[tuple[str, int], ...] = ()
