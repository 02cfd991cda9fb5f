"""Reading a published benchmark's own files: a dataset as its authors put it on the hub (JSON array, JSONL
or Parquet), each row checked against the benchmark's schema, from a local folder or the hub.

Contracts: every malformed file, row or field is one `DataFileError` line naming the file (and the row and
field); a dataset found neither locally nor on the hub is one `TaskUnavailable` line saying where we looked.
"""

import json
from dataclasses import dataclass
from pathlib import Path

from kvbench.core.errors import DataFileError, TaskUnavailable
from kvbench.core.validation import check_json, parse_json
from kvbench.tasks.jsonl import read_parquet
from kvbench.tasks.longbench import hub_is_reachable

SUFFIXES = (".json", ".jsonl", ".parquet")


@dataclass(frozen=True)
class HubFile:
    """One file of a hub dataset repository (`repo`, `filename`)."""

    repo: str
    filename: str

    def local(self) -> Path | None:
        """The file from the local hub cache or, when the hub is reachable, downloaded into it; else None."""
        from huggingface_hub import hf_hub_download, is_offline_mode, try_to_load_from_cache

        cached = try_to_load_from_cache(self.repo, self.filename, repo_type="dataset")
        if isinstance(cached, str):
            return Path(cached)
        if is_offline_mode() or not hub_is_reachable():
            return None
        try:
            return Path(hf_hub_download(self.repo, self.filename, repo_type="dataset"))
        except OSError:  # huggingface_hub's HTTP and not-found errors are OSErrors
            return None


def read_objects(path: Path) -> list[dict]:
    """The rows of a .json (an array of objects), .jsonl (one object a line) or .parquet file; a file that
    is not of its kind, or a row that is not an object, is a DataFileError naming the file (and line)."""
    if path.suffix == ".parquet":
        rows = read_parquet(path)
    else:
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise DataFileError(f"{path}: not UTF-8 text") from None
        rows = read_json_array(text, path) if path.suffix == ".json" else read_json_lines(text, path)
    for index, row in enumerate(rows):
        if not isinstance(row, dict):
            raise DataFileError(f"{path}: row {index}: not a JSON object")
    return rows


def read_json_array(text: str, path: Path) -> list:
    try:
        rows = parse_json(text)
    except ValueError as error:
        raise DataFileError(f"{path}: not a JSON document ({error})") from None
    if not isinstance(rows, list):
        raise DataFileError(f"{path}: not a JSON array of rows")
    return rows


def read_json_lines(text: str, path: Path) -> list:
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(parse_json(line))
        except ValueError as error:
            raise DataFileError(f"{path}:{number}: not a JSON line ({error})") from None
    return rows


def checked_rows(rows: list[dict], schema, source: str, id_field: str | None = None) -> list:
    """`rows` as instances of `schema` (a STRICT dataclass), each checked; a missing or mistyped field, an
    id given twice (`id_field`) or no row at all is one DataFileError naming `source`, the row and field."""
    checked, seen = [], {}
    for index, row in enumerate(rows):
        where = f"{source}: row {index}"
        checked.append(check_json(schema, json.dumps(row, default=str), where, DataFileError))
        if id_field is not None:
            key = row[id_field]
            if key in seen:
                raise DataFileError(f"{where}: {id_field} {key!r} is also that of row {seen[key]}")
            seen[key] = index
    if not checked:
        raise DataFileError(f"{source}: holds no rows")
    return checked


def find_rows(local: list[Path], hub: HubFile | None, what: str) -> tuple[list[dict], str]:
    """(rows, source) of the first existing file of `local`, else of `hub`'s file; TaskUnavailable in one
    line naming every place looked at when none is there."""
    for path in local:
        if path.is_file():
            return read_objects(path), str(path)
    looked_at = [str(path) for path in local]
    if hub is not None:
        path = hub.local()
        if path is not None:
            return read_objects(path), f"{hub.repo}:{hub.filename}"
        looked_at.append(f"hub dataset {hub.repo} ({hub.filename}: offline, unreachable or not cached)")
    raise TaskUnavailable(f"{what} not found; looked at: {'; '.join(looked_at)}")
