"""kvpress's evaluation (NVIDIA/kvpress, `evaluation/`, at commit 8bb29b9) as a task family declares its
datasets: config.yaml's schema (`KvpressConfig`), where a kvbench row goes (`Target`), numpy's list cells, and
`Dataset`, which each family's kvpress datasets subclass in its module (`Family.kvpress`).
kvbench.harness.interop writes and reads the folders."""

import ast
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kvbench.core.errors import DataFileError
from kvbench.tasks.base import Sample

NEEDLE = "needle_in_haystack"  # the one dataset whose folders are named by needle depth too


@dataclass
class KvpressConfig:
    """kvpress's `EvaluationConfig` as `save_config` writes it to config.yaml (evaluation/evaluate.py), in
    its field order; the fields import reads are checked, the others kept as written."""

    dataset: str = "ruler"
    data_dir: str | int | None = None
    model: str = "meta-llama/Meta-Llama-3.1-8B-Instruct"
    device: str | None = None
    press_name: str = "knorm"
    compression_ratio: float | None = 1.0
    key_channel_compression_ratio: float | None = None
    head_compression_ratio: float | None = None
    threshold: float | None = None
    fraction: float = 1.0
    max_new_tokens: int | None = None
    max_context_length: int | None = None
    query_aware: bool = False
    needle_depth: int | list[int] | None = None
    compression_interval: int | None = None
    target_size: int | None = None
    hidden_states_buffer_size: int | None = None
    output_dir: str = "./results"
    log_level: str = "INFO"
    model_kwargs: dict[str, Any] | None = field(default_factory=dict)
    press_init_command: str | None = None
    seed: int = 42
    fp8: bool = False

    def to_yaml(self) -> str:
        """config.yaml's text, as `save_config` writes it."""
        import yaml

        data = asdict(self)
        if self.threshold is not None or self.head_compression_ratio is not None:
            data.pop("compression_ratio")
        if self.threshold is None:
            data.pop("threshold")
        if self.head_compression_ratio is None:
            data.pop("head_compression_ratio")
        return yaml.dump(data, default_flow_style=False, indent=2, sort_keys=False)

    def folder_name(self) -> str:
        """`get_results_dir`'s folder name of this config."""
        ratio = self.threshold if self.threshold is not None else self.head_compression_ratio
        ratio = self.compression_ratio if ratio is None else ratio
        parts = [
            self.dataset,
            str(self.data_dir) if self.data_dir else "",
            self.model.replace("/", "--"),
            self.press_name,
            f"{ratio:.2f}",
        ]
        if self.fraction < 1.0:
            parts.append(f"fraction{self.fraction:.3f}")
        if self.max_context_length is not None:
            parts.append(f"max_context{self.max_context_length}")
        if self.query_aware:
            parts.append("query_aware")
        if self.key_channel_compression_ratio is not None:
            parts.append(f"key_channel_cr{self.key_channel_compression_ratio:.2f}")
        if self.needle_depth is not None and self.dataset == NEEDLE:
            parts.append(f"needle_depth{self.needle_depth}")
        return "__".join(part for part in parts if part)


@dataclass
class Target:
    """Where a kvbench row goes in kvpress: its dataset, data_dir, the name in its `task` column, and the
    folder's `max_context_length` and `needle_depth`."""

    dataset: str
    data_dir: str
    task: str
    max_context_length: int | None = None
    needle_depth: int | None = None


QUOTED = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"")


def list_cell(values: list[str]) -> str:
    """A list of strings as pandas writes a numpy array cell (numpy's `str`, what kvpress's CSV holds)."""
    import numpy as np

    return str(np.array(values, dtype=object))


def parse_list_cell(text: str) -> list[str]:
    """The strings of a list cell: numpy's `['a' 'b']` (kvpress's) or Python's `['a', 'b']`; empty: []."""
    return [ast.literal_eval(token) for token in QUOTED.findall(text)]


def mean(scores: list[float]) -> float:
    return sum(scores) / len(scores) if scores else float("nan")


def mean2(scores: list[float]) -> float:
    """kvpress's `round(mean, 2)` of scores already x 100; NaN for none."""
    return round(mean(scores), 2)


def grouped(rows: list[dict], key) -> dict[Any, list[dict]]:
    groups: dict[Any, list[dict]] = {}
    for row in rows:
        groups.setdefault(key(row), []).append(row)
    return groups


def scored(task: str, references: list[str], metric: str, meta: dict | None = None, **fields) -> Sample:
    """A Sample as kvbench's metric `metric` reads it: the task, references, meta and scoring flags."""
    return Sample(
        task=task,
        id="",
        context="",
        question="",
        answer_prefix="",
        references=references,
        max_new_tokens=1,
        metric=metric,
        meta=meta or {},
        **fields,
    )


def references_of(line: dict[str, str], column: str, where: str) -> list[str]:
    """The reference answers of a list cell; DataFileError when there are none."""
    references = parse_list_cell(line[column])
    if not references:
        raise DataFileError(f"{where}: field {column!r}: no reference answer")
    return references


def text_of(line: dict[str, str], column: str, where: str) -> str:
    """A one-answer cell; DataFileError when it is empty."""
    if not line[column]:
        raise DataFileError(f"{where}: field {column!r}: no reference answer")
    return line[column]


def is_whole(text) -> bool:
    """Whether `text` is a whole number in ASCII digits (`isdigit` also takes '²', which int() refuses)."""
    return re.fullmatch(r"[0-9]+", str(text or "")) is not None


def whole(text: str, column: str, where: str) -> int:
    if not is_whole(text):
        raise DataFileError(f"{where}: field {column!r}: not a whole number (got {text!r})")
    return int(text)


class Dataset:
    """One kvpress dataset as kvbench writes and reads its folders (a subclass's docstring says how its tasks
    map to them).

    Export: `target` (where a kvbench row goes; None: not in this dataset), `cells` (its predictions.csv
    cells by column), `metrics` (a folder's metrics.json, in kvpress's shape, from kvbench rows). Import:
    `check_config` and `check_metrics` (DataFileError in one line), `task` (a line's kvbench task; None:
    none), `sample` (a line as kvbench's metric reads it), `length` and `sample_id` of its row. Both:
    `figures` (the comparable figures of a metrics.json object, x 100) and `label` (the figure a row is
    part of). Rows are dicts with the fields of `Row` (load_rows' records, or import's before they are
    Rows)."""

    name = ""
    exports = ""  # the kvbench tasks it takes, as a refused export lists them
    columns: tuple[str, ...] = ()  # predictions.csv's columns but predicted_answer and compression_ratio
    answer = "answer"  # the column of the reference answers
    reads: tuple[str, ...] = ()  # the other columns import reads
    schema: Any = float  # metrics.json's

    def target(self, row: dict) -> Target | None:
        raise NotImplementedError

    def named_target(self, row: dict, names) -> Target | None:
        """The target of a row whose task is `FAMILY/NAME` with this dataset's family and a NAME among
        `names`: kvpress's data_dir and task are both NAME. None for any other row."""
        family, _, name = row["task"].partition("/")
        if family != self.name or name not in names:
            return None
        return Target(self.name, name, name, row["length"])

    def cells(self, row: dict) -> dict[str, Any]:
        return {self.answer: list_cell(row["references"])}

    def metrics(self, rows: list[dict]) -> Any:
        raise NotImplementedError

    def check_config(self, config: KvpressConfig, path: Path) -> None:
        """DataFileError if config.yaml lacks what this dataset's runs set."""

    def check_metrics(self, metrics: Any, path: Path) -> None:
        """DataFileError if metrics.json (its schema checked) lacks a figure import reads."""

    def task(self, config: KvpressConfig, line: dict[str, str]) -> str | None:
        raise NotImplementedError

    def sample(self, task: str, line: dict[str, str], config: KvpressConfig, where: str) -> Sample:
        raise NotImplementedError

    def length(self, config: KvpressConfig) -> int | None:
        return config.max_context_length

    def sample_id(self, task: str, line: dict[str, str], index: int, config: KvpressConfig) -> str:
        return line.get("_id") or f"{task}-{index}"

    def figures(self, metrics: Any) -> dict[str, float | None]:
        raise NotImplementedError

    def label(self, row: dict) -> str | None:
        raise NotImplementedError
