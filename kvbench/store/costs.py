"""The costs `kvbench speed` measures (costs.jsonl in its folder): each line's schema, `Cost`, checked where
the file is read (resuming a speed run, the report's `--costs`)."""

import json
from dataclasses import dataclass
from pathlib import Path

from kvbench.core.errors import DataFileError
from kvbench.core.validation import (
    STRICT,
    Count,
    Memory,
    Positive,
    PositiveReal,
    Ratio,
    check_json,
    jsonl_lines,
    read_text,
)

COSTS_FILE = "costs.jsonl"


@dataclass
@dataclass
class Cost:
    """One line of costs.jsonl, its schema (checked when a folder is resumed): a press at one budget on one
    context length and device."""

    __pydantic_config__ = STRICT

    press: str
    ratio: Ratio
    memory: Memory | None
    press_args: dict
    tokens: Positive
    device: str
    prefill_s: PositiveReal
    prefill_none_s: PositiveReal
    prefill_overhead: float  # prefill_s / prefill_none_s - 1
    decode_tokens_per_s: PositiveReal
    decode_none_tokens_per_s: PositiveReal  # the report divides by it, and by the full bytes
    allocated_bytes: Count
    allocated_bytes_full: Positive
    accounted_bytes: Count
    accounted_bytes_full: Positive

    def key(self) -> tuple:
        return cost_key(self.press, self.ratio, self.memory, self.press_args, self.tokens, self.device)


def cost_key(press, ratio, memory, press_args, tokens, device) -> tuple:
    return press, float(ratio), memory, json.dumps(press_args, sort_keys=True), tokens, device


def load_costs(out: Path) -> dict:
    """The costs already measured in `out` by cost_key; a line that does not fit `Cost` is refused (one
    line naming it) before any work, so that a resumed run never appends to a damaged file."""
    path = Path(out) / COSTS_FILE
    if not path.exists():
        return {}
    done = {}
    try:
        lines = jsonl_lines(read_text(path, DataFileError))  # a FIFO is refused, not waited on
    except (OSError, UnicodeDecodeError) as error:
        raise DataFileError(f"{path} is unreadable ({error})") from None
    for number, line in enumerate(lines, 1):
        if line.strip():
            cost = check_json(Cost, line, f"{path} line {number}", DataFileError)
            done[cost.key()] = cost
    return done
