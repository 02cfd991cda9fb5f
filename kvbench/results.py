"""Results store: a folder with `rows.jsonl` (one JSON row per (config, sample)) and `runs/*.json`.

Rows are only ever appended, one `write` per line on an O_APPEND file, then fsync'd, so a run killed at any
point (even kill -9) leaves at most one torn last line. Opening the store cuts such a torn tail, and a rerun
computes only the (config, sample) keys that are missing. Run records are written whole (tmp + rename).
"""

import hashlib
import json
import os
import warnings
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

ROWS_FILE = "rows.jsonl"
RUNS_DIR = "runs"
KEY_FIELDS = ("config_id", "task", "length", "seed", "sample_id")


def config_id(
    model: str,
    press: str,
    ratio: float,
    press_args: dict,
    press_state: str | None = None,
    memory: float | None = None,
    protocol: str = "query-agnostic",
    protocol_args: dict | None = None,
) -> str:
    """A short stable id of (model, press, ratio, press arguments) and, for presses that load learned state
    (KVP's agents), that state's digest: rows scored with other agents are other results. A memory budget
    and a protocol other than the default enter the id only when given, so older rows keep their ids."""
    spec = [model, press, float(ratio), press_args] + ([press_state] if press_state else [])
    if memory is not None:
        spec.append({"memory": float(memory)})
    if protocol != "query-agnostic":
        spec.append({"protocol": protocol, **(protocol_args or {})})
    spec = json.dumps(spec, sort_keys=True, default=str)
    return hashlib.sha1(spec.encode()).hexdigest()[:12]


def row_key(row: dict) -> tuple:
    return tuple(row.get(field) for field in KEY_FIELDS)


def check_writable(folder: Path) -> None:
    """Raise if `folder` cannot be created or written, without creating anything."""
    folder = Path(folder)
    probe = folder
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise ValueError(f"results folder {str(folder)!r} is not writable: {str(probe)!r} is a file")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ValueError(f"results folder {str(folder)!r} is not writable")
    rows = folder / ROWS_FILE
    if rows.exists() and not os.access(rows, os.W_OK):
        raise ValueError(f"results file {str(rows)!r} is not writable")


class ResultsStore:
    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.rows_path = self.folder / ROWS_FILE
        self.folder.mkdir(parents=True, exist_ok=True)
        self.cut_torn_tail()
        self.done = {row_key(row) for row in read_rows(self.rows_path)}

    def cut_torn_tail(self) -> None:
        """Drop a last line without its newline: the row being written when a run was killed."""
        if not self.rows_path.exists() or self.rows_path.stat().st_size == 0:
            return
        with open(self.rows_path, "rb+") as file:
            data = file.read()
            if data.endswith(b"\n"):
                return
            file.truncate(data.rfind(b"\n") + 1)

    def has(self, row: dict) -> bool:
        return row_key(row) in self.done

    def append(self, row: dict) -> None:
        line = (json.dumps(row, default=str) + "\n").encode()
        fd = os.open(self.rows_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)
        self.done.add(row_key(row))

    def write_run(self, record: dict, path: Path | None = None) -> Path:
        """Write (or, given its `path`, replace) a run record whole."""
        if path is None:
            runs = self.folder / RUNS_DIR
            runs.mkdir(exist_ok=True)
            stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S.%f")
            path = runs / f"{stamp}-{os.getpid()}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record, indent=2, default=str))
        tmp.rename(path)
        return path


def read_rows(path: Path) -> list[dict]:
    """Rows of one rows.jsonl; a bad line is skipped with a warning naming the file and line."""
    rows = []
    if not Path(path).exists():
        return rows
    with open(path, encoding="utf-8", errors="replace") as file:
        for number, line in enumerate(file, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                if not isinstance(row, dict) or "config_id" not in row:
                    raise ValueError("not a results row")
            except ValueError as error:
                warnings.warn(f"{path}:{number}: skipped a corrupt results row ({error})", stacklevel=2)
                continue
            rows.append(row)
    return rows


def results_files(paths, recursive: bool = True) -> list[Path]:
    """Every rows.jsonl in the given folders (or the files themselves), and with `recursive` in every folder
    below them too: a report on `results/` must not pull in `results/reference/` unless asked."""
    files = []
    for path in map(Path, paths):
        if path.is_file():
            files.append(path)
        elif recursive:
            files.extend(sorted(path.rglob(ROWS_FILE)))
        elif (path / ROWS_FILE).is_file():
            files.append(path / ROWS_FILE)
    return files


def load_rows(paths) -> pd.DataFrame:
    """All rows under `paths` as one DataFrame (`source` names the folder); a duplicate keeps the last."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    frames = []
    for file in results_files(paths):
        rows = read_rows(file)
        if rows:
            frame = pd.DataFrame(rows)
            frame["source"] = str(file.parent)
            frames.append(frame)
    if not frames:
        return pd.DataFrame(columns=[*KEY_FIELDS, "model", "press", "ratio", "score", "source"])
    frame = pd.concat(frames, ignore_index=True)
    return frame.drop_duplicates(subset=list(KEY_FIELDS), keep="last").reset_index(drop=True)


def load_runs(paths) -> list[dict]:
    """The run records (command, config, versions) of the results folders under `paths`."""
    records = []
    for file in results_files(paths):
        for run in sorted((file.parent / RUNS_DIR).glob("*.json")):
            try:
                records.append(json.loads(run.read_text()))
            except ValueError:
                warnings.warn(f"{run}: skipped a corrupt run record", stacklevel=2)
    return records
