"""Results that travel to and from kvpress's evaluation (and its leaderboard): `export_kvpress` writes a
kvbench results folder as kvpress's output folders, `import_kvpress` reads such folders into kvbench rows.

The format, as read from NVIDIA/kvpress (github, `evaluation/`, at commit 8bb29b9):

- `evaluation/evaluate.py`: `EvaluationConfig.get_results_dir` names one folder per run
  `{dataset}__{data_dir}__{model with / as --}__{press_name}__{compression_ratio:.2f}`, then
  `__max_context{N}` when a maximum context length is set, `__query_aware` when the question is compressed
  with the context and, for needle_in_haystack, `__needle_depth{D}` (empty parts left out); a folder that
  exists gets a numbered subfolder (`/1`, `/2`). `run_evaluation` writes in it `predictions.csv` (every
  column of the dataset but `context`, plus `predicted_answer` and, but for a DecodingPress,
  `compression_ratio`; pandas' `to_csv`, list cells as numpy prints them, e.g. `['a' 'b']`),
  `metrics.json` (the dataset's scorer's output, `json.dump(..., indent=4)`) and `config.yaml`
  (`EvaluationConfig.save_config`: the dataclass's fields in order, `yaml.dump(..., default_flow_style=False,
  indent=2, sort_keys=False)`, `threshold` and `head_compression_ratio` left out when unset,
  `compression_ratio` left out when either is set; `press_init_command` is `str(press)`), config.yaml last:
  a scorer that raises leaves a folder without it. `no_press` runs at compression ratio 0.0.
- `evaluation/evaluate_config.yaml`: the fields a user sets (ruler's `data_dir` is its context length,
  "4096"); `evaluation/leaderboard.sh`: the leaderboard's runs (ruler at 4096, ratios 0.25 to 0.875, a
  query-aware loop).
- `evaluation/evaluate_registry.py`: the datasets (`DATASET_REGISTRY`, `SCORER_REGISTRY`) and presses
  (`decoding_*` are DecodingPress).

The datasets, each from its `evaluation/benchmarks/<dir>/calculate_metrics.py` (the metrics.json shape) and
`create_huggingface_dataset.py` (the `data_dir` values, one per `config_name`, and the columns), are those
the task families declare (`Family.kvpress`: kvbench.tasks.ruler's `KvpressRuler`, ...); each class's
docstring says how kvbench's tasks map to it. A family whose name kvpress gives another dataset says why in
`Family.not_kvpress` (ZeroSCROLLS: kvpress's is the test split), and is refused both ways.

Protocols: query-agnostic is `query_aware: false`, query-aware is `query_aware: true`. kvbench's `none` is
kvpress's `no_press`. Everything else (other tasks, other protocols, memory or absolute budgets, presses set
by a threshold, kvpress's DecodingPress runs) has no counterpart and is refused, in one line, before
anything is written.

Export writes one kvpress folder per (config, dataset, data_dir, context length, needle depth); a config's
press is named by its report label (press and arguments) and its kvbench identity (config id, learned
state) is in `press_init_command`. Its metrics.json holds kvbench's scores in kvpress's shape (as its scorer
rounds and scales them; only the metrics kvbench computes). `question` and `answer_prefix` are the rows'
own (empty for rows written before kvbench recorded them); `max_new_tokens` is empty. A text cell that
would start a spreadsheet formula (`=`, `+`, `-`, `@`, a tab or a carriage return; a number such as `-0.5`
is none) is written after a single quote (OWASP's advice against CSV injection); import takes the quote
off again in the folders kvbench wrote (`press_init_command` "kvbench ..."). `fraction` stays 1.0: the
leaderboard's own runs have 500 samples per RULER task, a kvbench export as many as kvbench ran.

Import makes one row per line of predictions.csv, scored again with kvbench's implementation of the same
official metric (the per-sample scores kvpress does not write), and marks it imported twice: its press is
named `PRESS (kvpress)` (`no_press` is `none (kvpress)`), so a report keeps it apart from kvbench's own
press of that name, and `meta.imported` is "kvpress" (with `meta.kvpress_folder` and `meta.kvpress_score`,
the published figure, x 100, the row is part of). A published figure that its predictions do not give back
(more than rounding apart) is said in a warning. The imported config's `press_state` is a digest of
`press_init_command`, so two runs of one press name that differ in their arguments stay two configs.

Both write their OUT folder whole: built in a temporary folder beside it, then renamed into place; an OUT
that exists is refused.
"""

import csv
import hashlib
import io
import json
import math
import os
import re
import shutil
import tempfile
import unicodedata
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvbench.core.config import DEFAULT_PROTOCOL
from kvbench.core.errors import BadInput, DataFileError, KvbenchWarning, WriteError
from kvbench.core.registry import first_line
from kvbench.core.validation import check_fields, check_json, load_yaml, open_plain, read_text
from kvbench.store.results import (
    ROWS_FILE,
    Row,
    check_folder_writable,
    check_results_path,
    config_id,
    load_rows,
    results_files,
)
from kvbench.tasks import score_sample
from kvbench.tasks.kvpress import Dataset, KvpressConfig, Target
from kvbench.tasks.registry import BUILT_IN

PREDICTIONS = "predictions.csv"
METRICS = "metrics.json"
CONFIG = "config.yaml"
IMPORTED = "kvpress"  # meta.imported of an imported row
EXPORTED = "kvbench "  # how press_init_command starts in the folders kvbench writes
SUFFIX = " (kvpress)"  # ... and its press name's suffix
NO_PRESS = "no_press"  # kvpress's name of kvbench's "none"
DECODING = "decoding_"  # the names of kvpress's DecodingPress runs (evaluate_registry.py)
PROTOCOL_OF = {False: "query-agnostic", True: "query-aware"}  # kvpress's query_aware -> kvbench protocol
ROUNDING = 0.005 + 1e-9  # how far a published figure (x 100, rounded to 2) may be from kvbench's


@dataclass
class Summary:
    """What an export or import wrote: folders (kvpress folders, or 1 results folder) and rows."""

    folders: int
    rows: int


# ---- numpy's and pandas' cells ----


def number_cell(value: float) -> str:
    return repr(float(value))


# What starts a formula in a spreadsheet cell (OWASP, "CSV Injection").
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def opens_as_formula(text: str) -> bool:
    """Whether a spreadsheet would read `text` as a formula, or `text` is such text quoted (so that a
    quote of the user's own survives the round trip)."""
    text = text.lstrip("'")
    return text.startswith(FORMULA_START) and not is_number(text)


def spreadsheet_safe(cell: object) -> str:
    """`cell` as text a spreadsheet opens as text: a single quote before text that would start a formula
    (OWASP's advice against CSV injection); a number (-0.5 is no formula) and other text as they are."""
    text = str(cell)
    return f"'{text}" if opens_as_formula(text) else text


def unquoted(text: str) -> str:
    """A cell `spreadsheet_safe` wrote, as it was."""
    return text[1:] if text.startswith("'") and opens_as_formula(text[1:]) else text


# ---- the datasets ----


DATASETS: dict[str, Dataset] = {
    dataset.name: dataset for module in BUILT_IN for dataset in module.FAMILY.kvpress
}
NOT_KVPRESS = {module.FAMILY.name: module for module in BUILT_IN if module.FAMILY.not_kvpress}


# ---- the correspondence ----


def kvpress_target(row: dict) -> Target:
    """kvpress's dataset, data_dir and task name of a kvbench row; BadInput if it has none."""
    task = row["task"]
    for module in NOT_KVPRESS.values():
        if task in module.TASKS:
            raise BadInput(
                f"task {task!r} has no counterpart in kvpress's evaluation: {module.FAMILY.not_kvpress}"
            )
    for dataset in DATASETS.values():
        target = dataset.target(row)
        if target is not None:
            return target
    *others, last = [dataset.exports for dataset in DATASETS.values()]
    takes = f"{', '.join(others)} and {last}"
    raise BadInput(f"task {task!r} has no counterpart in kvpress's evaluation (export takes {takes})")


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
    check_results_path(Path(results))
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
        row = {**row, "protocol": protocol, "length": None if row["length"] is None else int(row["length"])}
        rows.append({**row, "target": kvpress_target(row)})
    return rows


def export_config(row: dict, out: Path) -> KvpressConfig:
    target = row["target"]
    state = f", state {row['press_state']}" if row["press_state"] else ""
    return KvpressConfig(
        dataset=target.dataset,
        data_dir=target.data_dir or None,
        model=row["model"],
        press_name=press_label(row["press"], row["press_args"] or {}),
        compression_ratio=float(row["ratio"]),
        max_context_length=target.max_context_length,
        query_aware=row["protocol"] == "query-aware",
        needle_depth=target.needle_depth,
        output_dir=str(out),
        press_init_command=f"{EXPORTED}{row['press']} (config {row['config_id']}{state})",
        seed=int(row["seed"]),  # the seed kvbench's samples were made with, not kvpress's default
    )


def predictions_csv(dataset: Dataset, config: KvpressConfig, rows: list[dict]) -> str:
    """predictions.csv of one folder: the dataset's columns but `context`, then `predicted_answer` and
    `compression_ratio`; the cells kvbench's rows do not hold (an older row's question) are empty, text that
    would start a spreadsheet formula is quoted (`spreadsheet_safe`)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)  # lines end in CRLF (RFC 4180), so a cell holding a CR is quoted
    ratio = number_cell(config.compression_ratio or 0.0)
    writer.writerow([*dataset.columns, "predicted_answer", "compression_ratio"])
    for row in rows:
        asked = {"question": row["question"] or "", "answer_prefix": row["answer_prefix"] or ""}
        cells = {**asked, **dataset.cells(row)}
        line = [*(cells.get(column, "") for column in dataset.columns), row["prediction"] or "", ratio]
        writer.writerow([spreadsheet_safe(cell) for cell in line])
    return buffer.getvalue()


def export_kvpress(results: Path, out: Path) -> Summary:
    """Write the rows of the results folder `results` as kvpress evaluation's output folders under `out`
    (see the module's docstring). BadInput, nothing written, if `out` exists or a row has no counterpart."""
    out = Path(out)
    refuse_existing(out)
    groups: dict[tuple, dict[tuple, dict]] = {}
    for row in export_rows(results):
        target = row["target"]
        key = (
            row["config_id"],
            target.dataset,
            target.data_dir,
            target.max_context_length,
            target.needle_depth,
        )
        # One line per sample: longbench-v2's subsets share its samples.
        groups.setdefault(key, {})[(target.task, row["sample_id"], row["seed"])] = row
    files: dict[Path, str] = {}
    taken: set[Path] = set()
    for group in groups.values():
        rows = list(group.values())
        config = export_config(rows[0], out)
        dataset = DATASETS[config.dataset]
        folder = Path(config.folder_name())
        numbered, number = folder, 0
        while numbered in taken:  # get_results_dir: a folder that exists gets a numbered subfolder
            number += 1
            numbered = folder / str(number)
        taken.add(numbered)
        files[numbered / PREDICTIONS] = predictions_csv(dataset, config, rows)
        files[numbered / METRICS] = json.dumps(dataset.metrics(rows), indent=4)
        files[numbered / CONFIG] = config.to_yaml()
    write_folder(out, files)
    return Summary(len(groups), sum(len(group) for group in groups.values()))


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
    if config.dataset in NOT_KVPRESS:
        raise DataFileError(f"{path}: field 'dataset': {NOT_KVPRESS[config.dataset].FAMILY.not_kvpress}")
    if config.dataset not in DATASETS:
        raise DataFileError(
            f"{path}: field 'dataset': {config.dataset!r} has no kvbench task (import takes "
            f"{', '.join(DATASETS)})"
        )
    if config.press_name.startswith(DECODING) or config.compression_interval or config.target_size:
        raise DataFileError(
            f"{path}: field 'press_name': {config.press_name!r} compresses while decoding (kvpress's "
            "DecodingPress), which has no kvbench counterpart in import"
        )
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
    for name in ("model", "press_name", "dataset"):
        hidden = next(
            (char for char in getattr(config, name) if unicodedata.category(char).startswith("C")), None
        )
        if hidden is not None:  # a NUL or a direction mark: no folder, row or report can carry it
            raise DataFileError(
                f"{path}: field {name!r}: holds U+{ord(hidden):04X}, a character that shows as nothing"
            )
    DATASETS[config.dataset].check_config(config, path)
    return config


def read_metrics(path: Path, dataset: Dataset) -> Any:
    """metrics.json at `path` in the shape of `dataset`'s scorer; DataFileError in one line otherwise."""
    try:
        text = read_text(path, DataFileError)
    except FileNotFoundError:
        raise DataFileError(
            f"{path}: no such file (a kvpress folder holds {PREDICTIONS}, {METRICS}, {CONFIG})"
        ) from None
    except (OSError, UnicodeDecodeError) as error:
        raise DataFileError(f"{path}: not readable ({error})") from None
    text = re.sub(r"\bNaN\b", "null", text)  # json.dump writes an empty length bucket's mean as NaN
    metrics = check_json(dataset.schema, text, str(path), DataFileError)
    dataset.check_metrics(metrics, path)
    return metrics


def read_predictions(path: Path, required: tuple[str, ...]) -> list[dict[str, str]]:
    """The lines of predictions.csv at `path` as dicts; DataFileError naming the file and a missing column."""
    try:
        with io.TextIOWrapper(open_plain(path, DataFileError), encoding="utf-8", newline="") as file:
            reader = csv.DictReader(file)
            for name in required:
                if name not in (reader.fieldnames or []):
                    raise DataFileError(f"{path}: field {name!r}: missing (not kvpress's predictions.csv)")
            lines = []
            for line in reader:
                if None in line or None in line.values():  # more cells than columns, or fewer
                    raise DataFileError(
                        f"{path} line {reader.line_num}: not as many cells as the "
                        f"{len(reader.fieldnames or [])} columns of its header"
                    )
                lines.append(line)
            return lines
    except FileNotFoundError:
        raise DataFileError(
            f"{path}: no such file (a kvpress folder holds {PREDICTIONS}, {METRICS}, {CONFIG})"
        ) from None
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise DataFileError(f"{path}: not readable as CSV ({error})") from None


def folder_rows(folder: Path, root: Path) -> list[Row]:
    """The kvbench rows of one kvpress folder; DataFileError in one line for a file not in its format."""
    config = read_config(folder / CONFIG)
    dataset = DATASETS[config.dataset]
    metrics = read_metrics(folder / METRICS, dataset)
    lines = read_predictions(folder / PREDICTIONS, ("predicted_answer", dataset.answer, *dataset.reads))
    if (config.press_init_command or "").startswith(EXPORTED):  # kvbench's export quoted its formulas
        lines = [{column: unquoted(cell) for column, cell in line.items()} for line in lines]
    ratio = (
        config.compression_ratio if config.compression_ratio is not None else config.head_compression_ratio
    )
    ratio = 0.0 if config.press_name == NO_PRESS else float(ratio or 0.0)
    press = ("none" if config.press_name == NO_PRESS else config.press_name) + SUFFIX
    protocol = PROTOCOL_OF[config.query_aware]
    state = hashlib.sha1((config.press_init_command or "").encode()).hexdigest()[:12]
    identity = config_id(config.model, press, ratio, {}, state, protocol=protocol)
    relative = str(folder.relative_to(root))
    records, counts = [], {}
    for number, line in enumerate(lines, start=2):
        where = f"{folder / PREDICTIONS} line {number}"
        task = dataset.task(config, line)
        if task is None:
            raise DataFileError(
                f"{where}: field 'task': {line.get('task')!r} has no kvbench task in dataset "
                f"{config.dataset!r}"
            )
        sample = dataset.sample(task, line, config, where)
        index = counts[task] = counts.get(task, -1) + 1
        prediction = line["predicted_answer"]
        records.append(
            {
                "task": task,
                "length": dataset.length(config),
                "sample_id": dataset.sample_id(task, line, index, config),
                "prediction": prediction,
                "question": line.get("question") or None,
                "answer_prefix": line.get("answer_prefix") or None,
                "references": sample.references,
                "score": float(score_sample(sample, prediction)),
                "meta": {**sample.meta, "imported": IMPORTED, "kvpress_folder": relative},
            }
        )
    if not records:
        raise DataFileError(f"{folder / PREDICTIONS}: no predictions")
    published = dataset.figures(metrics)
    check_published(folder, published, dataset.figures(dataset.metrics(records)))
    for record in records:
        record["meta"]["kvpress_score"] = published.get(dataset.label(record))
    common = {"config_id": identity, "model": config.model, "press": press, "ratio": ratio, "seed": 0}
    return [Row(**common, press_state=state, protocol=protocol, **record) for record in records]


def check_published(folder: Path, published: dict, recomputed: dict) -> None:
    """Warn when a published figure (metrics.json) is not what its predictions give, rounding aside."""
    for label, value in published.items():
        again = recomputed.get(label)
        if value is None or again is None or math.isnan(value) or math.isnan(again):
            continue
        if abs(again - value) > ROUNDING:
            warnings.warn(
                f"{folder / METRICS}: {label} is published as {round(value, 4)}; its predictions give "
                f"{again:.2f} as kvbench scores them",
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
    check_distinct_runs(rows)
    text = "".join(json.dumps(row.to_dict()) + "\n" for row in rows)
    write_folder(out, {Path(ROWS_FILE): text})
    return Summary(len(folders), len(rows))


def check_distinct_runs(rows: list[Row]) -> None:
    """DataFileError when two kvpress folders hold the same config's same samples: kvpress's rerun layout
    (`X/` and `X/1/`, a run made again) would import as duplicate rows, one run hiding the other."""
    folder_of: dict[tuple, str] = {}
    for row in rows:
        folder = row.meta["kvpress_folder"]
        first = folder_of.setdefault(row.key, folder)
        if first != folder:
            raise DataFileError(
                f"{first} and {folder} hold the same run (config {row.press} at {row.ratio}, sample "
                f"{row.task}/{row.sample_id}): kvpress reran it into a numbered folder; import one of them"
            )


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
    except OSError as error:  # a full disk, a file size limit: one line, nothing left behind
        shutil.rmtree(staging, ignore_errors=True)
        raise WriteError(
            f"{out}: cannot write ({error.strerror or first_line(error)}); nothing was written"
        ) from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
