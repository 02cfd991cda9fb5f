"""Results store: a folder with `rows.jsonl` (one JSON row per (config, sample)) and `runs/*.json`.

Rows are only ever appended, one `write` per line on an O_APPEND file, then fsync'd, so a run killed at any
point (even kill -9) leaves at most one torn last line. Opening the store cuts such a torn tail, and a rerun
computes only the (config, sample) keys that are missing. Run records are written whole (tmp + rename).
"""

import hashlib
import json
import os
import tempfile
import warnings
from datetime import datetime, timezone
from pathlib import Path

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
    try:  # a real probe: os.access says yes to root even on a read-only file system
        tempfile.TemporaryFile(dir=probe).close()
    except OSError:
        raise ValueError(f"results folder {str(folder)!r} is not writable") from None
    rows = folder / ROWS_FILE
    if rows.exists() and not os.access(rows, os.W_OK):
        raise ValueError(f"results file {str(rows)!r} is not writable")


class ResultsWriteError(OSError):
    """The results store could not be written (disk full, permissions): one line, exit code 1."""


class ResultsStore:
    """The folder is created by the first write, so a run that fails before scoring anything leaves none."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.rows_path = self.folder / ROWS_FILE
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
        """Append one row; it counts as done only once all its bytes are written and fsync'd. A failed
        write (disk full) is cut back off the file, so no torn row stays behind, and raises."""
        line = (json.dumps(row, default=str) + "\n").encode()
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.rows_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as error:
            raise ResultsWriteError(f"cannot write results to {self.rows_path}: {error.strerror}") from None
        start = os.fstat(fd).st_size
        try:
            written = 0
            while written < len(line):
                count = os.write(fd, line[written:])
                if count <= 0:
                    raise OSError(28, os.strerror(28))  # no progress: as good as a full disk
                written += count
            os.fsync(fd)
        except OSError as error:
            try:
                os.ftruncate(fd, start)
            except OSError:
                pass  # the next open cuts the torn tail
            raise ResultsWriteError(f"cannot write results to {self.rows_path}: {error.strerror}") from None
        finally:
            os.close(fd)
        self.done.add(row_key(row))

    def write_run(self, record: dict, path: Path | None = None) -> Path:
        """Write (or, given its `path`, replace) a run record whole."""
        if path is None:
            stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S.%f")
            path = self.folder / RUNS_DIR / f"{stamp}-{os.getpid()}.json"
        tmp = path.with_suffix(".tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(record, indent=2, default=str))
            tmp.rename(path)
        except OSError as error:
            tmp.unlink(missing_ok=True)
            raise ResultsWriteError(f"cannot write the run record {path}: {error.strerror}") from None
        return path


def read_rows(path: Path) -> list[dict]:
    """Rows of one rows.jsonl; bad lines are skipped with one warning per file (how many, the first)."""
    rows, bad = [], []
    if not Path(path).is_file():
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
                bad.append((number, str(error).splitlines()[0] if str(error) else "unreadable"))
                continue
            rows.append(row)
    if bad:
        (first, error), lines = bad[0], ", ".join(str(number) for number, _ in bad[:5])
        what = "a corrupt results row" if len(bad) == 1 else f"{len(bad)} corrupt results rows (lines {lines}"
        what += "" if len(bad) == 1 else (", ...)" if len(bad) > 5 else ")")
        warnings.warn(f"{path}:{first}: skipped {what}: {error}", stacklevel=2)
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


def load_rows(paths):
    """All rows under `paths` as one DataFrame (`source` names the folder); a duplicate keeps the last."""
    import pandas as pd

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
            except (ValueError, UnicodeDecodeError):
                warnings.warn(f"{run}: skipped a corrupt run record", stacklevel=2)
    return records
