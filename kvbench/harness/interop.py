"""Results that travel to and from kvpress's evaluation (and its leaderboard): `export_kvpress` writes a
kvbench results folder as kvpress's output folders, `import_kvpress` reads such folders into kvbench rows.

The format, as read from NVIDIA/kvpress (github, `evaluation/`):

- `evaluation/evaluate.py`: `EvaluationConfig.get_results_dir` names one folder per run
  `{dataset}__{data_dir}__{model with / as --}__{press_name}__{compression_ratio:.2f}`, then
  `__max_context{N}` when a maximum context length is set and `__query_aware` when the question is
  compressed with the context (empty parts left out); a folder that exists gets a numbered subfolder (`/1`,
  `/2`). `run_evaluation` writes in it `predictions.csv` (every column of the dataset but `context`, plus
  `predicted_answer` and `compression_ratio`; pandas' `to_csv`, list cells as numpy prints them, e.g.
  `['a' 'b']`), `metrics.json` (the dataset's scorer's output, `json.dump(..., indent=4)`) and
  `config.yaml` (`EvaluationConfig.save_config`: the dataclass's fields in order, `yaml.dump(...,
  default_flow_style=False, indent=2, sort_keys=False)`, `threshold` and `head_compression_ratio` left out
  when unset, `compression_ratio` left out when either is set; `press_init_command` is `str(press)`).
  `no_press` runs at compression ratio 0.0.
- `evaluation/evaluate_config.yaml`: the fields a user sets (ruler's `data_dir` is its context length,
  "4096"); `evaluation/leaderboard.sh`: the leaderboard's runs (ruler at 4096, ratios 0.25 to 0.875, a
  query-aware loop).
- `evaluation/evaluate_registry.py`: the datasets (`ruler`, `longbench`, `longbench-e`, ...).
- `evaluation/benchmarks/ruler/calculate_metrics.py`: metrics.json is `{task: {"string_match": score}}`,
  per RULER task (`niah_single_1`, ..., `qa_2`; string_match_part for `qa_*`, string_match_all otherwise,
  mean x 100 rounded to 2 decimals); `benchmarks/ruler/create_huggingface_dataset.py` and `generate.sh`:
  the columns (`question`, `answer_prefix`, `answer`, `task`, `max_new_tokens`) and the tasks.
- `evaluation/benchmarks/longbench/calculate_metrics.py`: for `longbench`, metrics.json is one number (the
  dataset's official metric, mean x 100 rounded to 2); for `longbench-e`, `{"0-4k": .., "4-8k": ..,
  "8k+": ..}` by the row's `length`; `benchmarks/longbench/create_huggingface_dataset.py`: one `data_dir`
  per LongBench dataset (`narrativeqa`; LongBench-E's `qasper_e`), columns `question`, `answers`,
  `all_classes`, `length`, `_id`, `answer_prefix`, `task`, `max_new_tokens`.

The correspondence: kvbench's RULER task T at length L is kvpress's `ruler`, data_dir L, task T;
`longbench/NAME` is `longbench`, data_dir NAME (with `max_context_length` the kvbench length);
`longbench-e/NAME` is `longbench-e`, data_dir `NAME_e`. Protocols: query-agnostic is `query_aware: false`,
query-aware is `query_aware: true`. kvbench's `none` is kvpress's `no_press`. Everything else (other
tasks and datasets, other protocols, memory or absolute budgets, presses set by a threshold) has no
counterpart and is refused, in one line, before anything is written.

Export writes one kvpress folder per (config, dataset, data_dir); a config's press is named by its report
label (press and arguments) and its kvbench identity (config id, learned state) is in
`press_init_command`. Its metrics.json holds kvbench's scores in kvpress's shape (the mean of the rows'
scores, rounded to 2 decimals). `fraction` stays 1.0: the leaderboard's own runs have 500 samples per
RULER task, a kvbench export as many as kvbench ran.

Import makes one row per line of predictions.csv, scored again with kvbench's implementation of the same
official metric (the per-sample scores kvpress does not write), and marks it imported twice: its press is
named `PRESS (kvpress)` (`no_press` is `none (kvpress)`), so a report keeps it apart from kvbench's own
press of that name, and `meta.imported` is "kvpress" (with `meta.kvpress_folder` and the published
`meta.kvpress_score`). A published score that its predictions do not give back (more than rounding apart)
is said in a warning. The imported config's `press_state` is a digest of `press_init_command`, so two runs
of one press name that differ in their arguments stay two configs.

Both write their OUT folder whole: built in a temporary folder beside it, then renamed into place; an OUT
that exists is refused.
"""

import ast
import csv
import hashlib
import io
import json
import math
import os
import re
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kvbench.core.config import DEFAULT_PROTOCOL
from kvbench.core.errors import BadInput, DataFileError, KvbenchWarning
from kvbench.core.validation import check_fields, check_json, load_yaml
from kvbench.store.results import ROWS_FILE, Row, check_folder_writable, config_id, load_rows, results_files
from kvbench.tasks import ruler

PREDICTIONS = "predictions.csv"
METRICS = "metrics.json"
CONFIG = "config.yaml"
IMPORTED = "kvpress"  # meta.imported of an imported row
SUFFIX = " (kvpress)"  # ... and its press name's suffix
NO_PRESS = "no_press"  # kvpress's name of kvbench's "none"
RULER_TASKS = tuple(ruler.TASKS)  # kvpress scores RULER per task, under the same 13 names
PROTOCOL_OF = {False: "query-agnostic", True: "query-aware"}  # kvpress's query_aware -> kvbench protocol
ROUNDING = 0.005 + 1e-9  # how far a published score (2 decimals) may be from its predictions' mean


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
        return "__".join(part for part in parts if part)


@dataclass
class Target:
    """Where a kvbench task goes in kvpress: its dataset, data_dir and the name in its `task` column."""

    dataset: str
    data_dir: str
    task: str


@dataclass
class Summary:
    """What an export or import wrote: folders (kvpress folders, or 1 results folder) and rows."""

    folders: int
    rows: int


# ---- the correspondence ----


def kvpress_target(task: str, length: int | None) -> Target:
    """kvpress's dataset, data_dir and task name of kvbench's `task` at `length`; BadInput if it has none."""
    from kvbench.tasks import longbench

    if task in RULER_TASKS:
        if length is None:
            raise BadInput(f"task {task!r} has no context length: kvpress's ruler is named by it")
        return Target("ruler", str(length), task)
    family, _, name = task.partition("/")
    if family == "longbench" and name in longbench.DATASETS:
        return Target("longbench", name, name)
    if family == "longbench-e" and name in longbench.E_DATASETS:
        return Target("longbench-e", f"{name}_e", name)
    raise BadInput(
        f"task {task!r} has no counterpart in kvpress's evaluation (export takes RULER, longbench/NAME "
        "and longbench-e/NAME)"
    )


def kvbench_task(config: KvpressConfig, task: str, where: str) -> str:
    """kvbench's task of a predictions.csv `task` value in a folder of `config`; DataFileError if none."""
    from kvbench.tasks import longbench

    if config.dataset == "ruler" and task in RULER_TASKS:
        return task
    if config.dataset == "longbench" and task in longbench.DATASETS:
        return f"longbench/{task}"
    if config.dataset == "longbench-e" and task in longbench.E_DATASETS:
        return f"longbench-e/{task}"
    raise DataFileError(f"{where}: field 'task': {task!r} has no kvbench task in dataset {config.dataset!r}")


# ---- numpy's and pandas' cells ----

QUOTED = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"")


def list_cell(values: list[str]) -> str:
    """A list of strings as pandas writes a numpy array cell (numpy's `str`, what kvpress's CSV holds)."""
    import numpy as np

    return str(np.array(values, dtype=object))


def parse_list_cell(text: str) -> list[str]:
    """The strings of a list cell: numpy's `['a' 'b']` (kvpress's) or Python's `['a', 'b']`; empty: []."""
    return [ast.literal_eval(token) for token in QUOTED.findall(text)]


def number_cell(value: float) -> str:
    return repr(float(value))


# ---- export ----


def present(value: Any) -> bool:
    """Whether a cell of load_rows' frame holds a value (not None, not NaN)."""
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def press_label(press: str, press_args: dict) -> str:
    """kvpress's press_name of a kvbench press: `none` is `no_press`, arguments as the report writes them."""
    if press == "none" and not press_args:
        return NO_PRESS
    args = ", ".join(f"{key}={value}" for key, value in sorted(press_args.items()))
    return (f"{press}({args})" if args else press).replace("/", "--")


def export_rows(results: Path) -> list[dict]:
    """The rows of the results folder `results` (load_rows: the last written of a config on a sample), each
    checked to have a kvpress counterpart; BadInput naming the first that has none."""
    files = results_files([Path(results)])
    if not files:
        raise BadInput(f"{results} holds no results (no rows.jsonl or rows.jsonl.gz)")
    frame = load_rows(files)
    if frame.empty:
        raise BadInput(f"{results} holds no result rows")
    rows = []
    for record in frame.to_dict("records"):
        row = {key: (value if present(value) else None) for key, value in record.items()}
        protocol = row["protocol"] or DEFAULT_PROTOCOL
        where = f"{results}: {row['press']} at {row['ratio']} on {row['task']}"
        if protocol not in PROTOCOL_OF.values() or row["protocol_args"]:
            raise BadInput(f"{where}: protocol {protocol!r} has no counterpart in kvpress's evaluation")
        if row["memory"] is not None or row["budget"] is not None:
            raise BadInput(f"{where}: a memory or absolute budget has no counterpart in kvpress's evaluation")
        if row["score"] is None:
            raise BadInput(f"{where}: a row without a score has no counterpart in kvpress's evaluation")
        length = None if row["length"] is None else int(row["length"])
        rows.append(
            {**row, "protocol": protocol, "length": length, "target": kvpress_target(row["task"], length)}
        )
    return rows


def export_config(row: dict, out: Path) -> KvpressConfig:
    target = row["target"]
    state = f", state {row['press_state']}" if row["press_state"] else ""
    return KvpressConfig(
        dataset=target.dataset,
        data_dir=target.data_dir,
        model=row["model"],
        press_name=press_label(row["press"], row["press_args"] or {}),
        compression_ratio=float(row["ratio"]),
        max_context_length=None if target.dataset == "ruler" else row["length"],
        query_aware=row["protocol"] == "query-aware",
        output_dir=str(out),
        press_init_command=f"kvbench {row['press']} (config {row['config_id']}{state})",
    )


def predictions_csv(config: KvpressConfig, rows: list[dict]) -> str:
    """predictions.csv of one folder: the dataset's columns but `context`, then `predicted_answer` and
    `compression_ratio`; kvbench has no prompt text in its rows, so `question` and `answer_prefix` are
    empty."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    ratio = number_cell(config.compression_ratio or 0.0)
    if config.dataset == "ruler":
        writer.writerow(
            [
                "question",
                "answer_prefix",
                "answer",
                "task",
                "max_new_tokens",
                "predicted_answer",
                "compression_ratio",
            ]
        )
        for row in rows:
            writer.writerow(
                ["", "", list_cell(row["references"]), row["target"].task, "", row["prediction"] or "", ratio]
            )
    else:
        writer.writerow(
            [
                "question",
                "answers",
                "length",
                "dataset",
                "all_classes",
                "_id",
                "answer_prefix",
                "task",
                "max_new_tokens",
                "predicted_answer",
                "compression_ratio",
            ]
        )
        for row in rows:
            meta = row["meta"] or {}
            classes = meta.get("all_classes") or []
            writer.writerow(
                [
                    "",
                    list_cell(row["references"]),
                    meta.get("length", ""),
                    row["target"].task,
                    list_cell(classes) if classes else "",
                    row["sample_id"],
                    "",
                    row["target"].task,
                    "",
                    row["prediction"] or "",
                    ratio,
                ]
            )
    return buffer.getvalue()


def metrics_json(config: KvpressConfig, rows: list[dict]) -> str:
    """metrics.json of one folder, in the shape of the dataset's kvpress scorer, from kvbench's scores."""
    from kvbench.tasks.longbench import E_BUCKETS, length_bucket

    def mean(scores: list[float]) -> float:
        return round(sum(scores) / len(scores), 2) if scores else float("nan")

    metrics: Any
    if config.dataset == "ruler":
        tasks: dict[str, list[float]] = {}
        for row in rows:
            tasks.setdefault(row["target"].task, []).append(row["score"])
        metrics = {task: {"string_match": mean(tasks[task])} for task in sorted(tasks)}
    elif config.dataset == "longbench":
        metrics = mean([row["score"] for row in rows])
    else:
        buckets: dict[str, list[float]] = {bucket: [] for bucket in E_BUCKETS}
        for row in rows:
            buckets[length_bucket((row["meta"] or {})["length"])].append(row["score"])
        metrics = {bucket: mean(scores) for bucket, scores in buckets.items()}
    return json.dumps(metrics, indent=4)


def export_kvpress(results: Path, out: Path) -> Summary:
    """Write the rows of the results folder `results` as kvpress evaluation's output folders under `out`
    (see the module's docstring). BadInput, nothing written, if `out` exists or a row has no counterpart."""
    out = Path(out)
    refuse_existing(out)
    rows = export_rows(results)
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        target = row["target"]
        groups.setdefault((row["config_id"], target.dataset, target.data_dir), []).append(row)
    files: dict[Path, str] = {}
    taken: set[Path] = set()
    for group in groups.values():
        config = export_config(group[0], out)
        folder = Path(config.folder_name())
        numbered, number = folder, 0
        while numbered in taken:  # get_results_dir: a folder that exists gets a numbered subfolder
            number += 1
            numbered = folder / str(number)
        taken.add(numbered)
        files[numbered / PREDICTIONS] = predictions_csv(config, group)
        files[numbered / METRICS] = metrics_json(config, group)
        files[numbered / CONFIG] = config.to_yaml()
    write_folder(out, files)
    return Summary(len(groups), len(rows))


# ---- import ----


def kvpress_folders(folder: Path) -> Iterator[Path]:
    """The folders at or below `folder` that hold a config.yaml, in path order."""
    for path in sorted(Path(folder).rglob(CONFIG)):
        if path.is_file():
            yield path.parent


def read_config(path: Path) -> KvpressConfig:
    """config.yaml at `path`, checked: DataFileError in one line naming the file and field."""
    data = load_yaml(path, DataFileError)
    if not isinstance(data, dict):
        raise DataFileError(f"{path}: not kvpress's config.yaml (not a mapping)")
    for name in ("dataset", "model", "press_name", "query_aware"):
        if data.get(name) is None:
            raise DataFileError(f"{path}: field {name!r}: missing")
    known = {name: value for name, value in data.items() if name in KvpressConfig.__dataclass_fields__}
    checked = check_fields(
        KvpressConfig, {k: v for k, v in known.items() if v is not None}, str(path), DataFileError
    )
    config = KvpressConfig(**{**{name: None for name in known}, **checked})
    ratio = (
        config.compression_ratio if config.compression_ratio is not None else config.head_compression_ratio
    )
    if ratio is None:
        raise DataFileError(
            f"{path}: field 'compression_ratio': missing (press {config.press_name!r} is set by a threshold, "
            "which has no kvbench counterpart)"
        )
    if not 0.0 <= ratio < 1.0:
        raise DataFileError(f"{path}: field 'compression_ratio': not in [0, 1) (got {ratio})")
    if config.dataset not in ("ruler", "longbench", "longbench-e"):
        raise DataFileError(
            f"{path}: field 'dataset': {config.dataset!r} has no kvbench task (import takes ruler, "
            "longbench, longbench-e)"
        )
    if config.dataset == "ruler" and not str(config.data_dir or "").isdigit():
        raise DataFileError(
            f"{path}: field 'data_dir': ruler's is its context length (got {config.data_dir!r})"
        )
    return config


def read_metrics(path: Path, dataset: str) -> Any:
    """metrics.json at `path` in the shape of `dataset`'s scorer; DataFileError in one line otherwise."""
    schema: Any = {
        "ruler": dict[str, dict[str, float]],
        "longbench": float,
        "longbench-e": dict[str, float | None],
    }[dataset]
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DataFileError(
            f"{path}: no such file (a kvpress folder holds {PREDICTIONS}, {METRICS}, {CONFIG})"
        ) from None
    except (OSError, UnicodeDecodeError) as error:
        raise DataFileError(f"{path}: not readable ({error})") from None
    text = re.sub(r"\bNaN\b", "null", text)  # json.dump writes an empty length bucket's mean as NaN
    metrics = check_json(schema, text, str(path), DataFileError)
    if dataset == "ruler":
        for task, scores in metrics.items():
            if "string_match" not in scores:
                raise DataFileError(f"{path}: field '{task}.string_match': missing")
    return metrics


def read_predictions(path: Path, required: tuple[str, ...]) -> list[dict[str, str]]:
    """The lines of predictions.csv at `path` as dicts; DataFileError naming the file and a missing column."""
    try:
        with open(path, encoding="utf-8", newline="") as file:
            reader = csv.DictReader(file)
            for name in required:
                if name not in (reader.fieldnames or []):
                    raise DataFileError(f"{path}: field {name!r}: missing (not kvpress's predictions.csv)")
            return list(reader)
    except FileNotFoundError:
        raise DataFileError(
            f"{path}: no such file (a kvpress folder holds {PREDICTIONS}, {METRICS}, {CONFIG})"
        ) from None
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise DataFileError(f"{path}: not readable as CSV ({error})") from None


def score_sample(task: str, prediction: str, references: list[str], line: dict[str, str]) -> float:
    """kvbench's score of one prediction: the official metric of its task (kvbench's implementation)."""
    from kvbench.tasks import longbench, ruler
    from kvbench.tasks.base import Sample

    family, _, name = task.partition("/")
    if family in ("longbench", "longbench-e"):
        dataset = longbench.DATASETS[name]
        sample = Sample(
            task=task,
            id="",
            context="",
            question="",
            answer_prefix="",
            references=references,
            max_new_tokens=dataset.max_new_tokens,
            metric=dataset.metric,
            first_line=name in longbench.FIRST_LINE,
            meta={"all_classes": parse_list_cell(line.get("all_classes") or "")},
        )
        return float(longbench.METRICS[dataset.metric](prediction, sample))
    metric = "string_match_part" if task.startswith("qa_") else "string_match_all"
    sample = Sample(
        task=task,
        id="",
        context="",
        question="",
        answer_prefix="",
        references=references,
        max_new_tokens=1,
        metric=metric,
    )
    return float(ruler.METRICS[metric](prediction, sample))


def folder_rows(folder: Path, root: Path) -> list[Row]:
    """The kvbench rows of one kvpress folder; DataFileError in one line for a file not in its format."""
    config = read_config(folder / CONFIG)
    metrics = read_metrics(folder / METRICS, config.dataset)
    answer = "answer" if config.dataset == "ruler" else "answers"
    lines = read_predictions(folder / PREDICTIONS, ("task", "predicted_answer", answer))
    ratio = (
        config.compression_ratio if config.compression_ratio is not None else config.head_compression_ratio
    )
    ratio = 0.0 if config.press_name == NO_PRESS else float(ratio or 0.0)
    press = ("none" if config.press_name == NO_PRESS else config.press_name) + SUFFIX
    protocol = PROTOCOL_OF[config.query_aware]
    length = int(str(config.data_dir)) if config.dataset == "ruler" else config.max_context_length
    state = hashlib.sha1((config.press_init_command or "").encode()).hexdigest()[:12]
    identity = config_id(config.model, press, ratio, {}, state, protocol=protocol)
    relative = str(folder.relative_to(root))
    rows, counts, scores = [], {}, {}
    for number, line in enumerate(lines, start=2):
        where = f"{folder / PREDICTIONS} line {number}"
        task = kvbench_task(config, line["task"], where)
        references = parse_list_cell(line[answer])
        if not references:
            raise DataFileError(f"{where}: field {answer!r}: no reference answer")
        index = counts[task] = counts.get(task, -1) + 1
        score = score_sample(task, line["predicted_answer"], references, line)
        scores.setdefault(task, []).append(score)
        meta: dict[str, Any] = {"imported": IMPORTED, "kvpress_folder": relative}
        if config.dataset == "ruler":
            meta["length"] = length
            meta["kvpress_score"] = metrics.get(line["task"], {}).get("string_match")
        else:
            if not str(line.get("length") or "").isdigit():
                raise DataFileError(f"{where}: field 'length': not a word count (got {line.get('length')!r})")
            meta["length"] = int(line["length"])
            meta["kvpress_score"] = metrics if config.dataset == "longbench" else None
        rows.append(
            Row(
                config_id=identity,
                model=config.model,
                press=press,
                ratio=ratio,
                task=task,
                length=length,
                seed=0,
                sample_id=line.get("_id") or f"{task}-{index}",
                press_state=state,
                protocol=protocol,
                prediction=line["predicted_answer"],
                references=references,
                score=score,
                meta=meta,
            )
        )
    if not rows:
        raise DataFileError(f"{folder / PREDICTIONS}: no predictions")
    check_published(folder, config.dataset, metrics, scores)
    return rows


def check_published(folder: Path, dataset: str, metrics: Any, scores: dict[str, list[float]]) -> None:
    """Warn when a published score (metrics.json) is not what its predictions give, rounding aside."""
    published: dict[str, float] = {}
    if dataset == "ruler":
        published = {task: value["string_match"] for task, value in metrics.items()}
    elif dataset == "longbench":
        published = {task: metrics for task in scores}
    for task, value in published.items():
        task_scores = scores.get(task, [])
        if task_scores and abs(sum(task_scores) / len(task_scores) - value) > ROUNDING:
            warnings.warn(
                f"{folder / METRICS}: {task} is published as {value}; its predictions score "
                f"{sum(task_scores) / len(task_scores):.2f} with kvbench's metric",
                KvbenchWarning,
                stacklevel=3,
            )


def import_kvpress(folder: Path, out: Path) -> Summary:
    """Read the kvpress evaluation folders at or below `folder` into a new kvbench results folder `out`
    (rows.jsonl; see the module's docstring). DataFileError or BadInput in one line, nothing written, if
    `out` exists, `folder` holds no kvpress folder, or a file lacks a field or has another format."""
    out, folder = Path(out), Path(folder)
    refuse_existing(out)
    if not folder.is_dir():
        raise BadInput(f"{folder}: no such folder")
    folders = list(kvpress_folders(folder))
    if not folders:
        raise BadInput(f"{folder}: not kvpress's evaluation output (no {CONFIG} at or below it)")
    rows = [row for each in folders for row in folder_rows(each, folder)]
    text = "".join(json.dumps(row.to_dict()) + "\n" for row in rows)
    write_folder(out, {Path(ROWS_FILE): text})
    return Summary(len(folders), len(rows))


# ---- writing a folder whole ----


def refuse_existing(out: Path) -> None:
    if out.exists() or out.is_symlink():
        raise BadInput(f"{out} exists: give a folder that does not (nothing is written over)")
    check_folder_writable(out, "output folder")


def write_folder(out: Path, files: dict[Path, str]) -> None:
    """Create `out` holding `files` (relative path -> text), whole: written in a temporary folder beside it,
    each file flushed, then the folder renamed to `out`; nothing is left behind on failure."""
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    mask = os.umask(0o022)
    os.umask(mask)
    try:
        staging.chmod(0o777 & ~mask)  # mkdtemp's folder is private; `out` is made as any folder is
        for relative, text in files.items():
            path = staging / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "w", encoding="utf-8", newline="") as file:
                file.write(text)
                file.flush()
                os.fsync(file.fileno())
        os.replace(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
