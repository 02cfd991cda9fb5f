"""The records `kvbench check-press PRESS --out FOLDER` leaves in FOLDER/conformance/ (one JSON file a
press), their schema (`ConformanceRecord`), checked where the report reads them."""

import dataclasses
import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvbench.core.errors import DataFileError, KvbenchWarning
from kvbench.core.validation import STRICT, check_json, read_bytes

CONFORMANCE_DIR = "conformance"  # in a results folder: one record per press checked, read by the report


@dataclass
class ConformanceRecord:
    """A press's conformance, for the report to set beside its scores: the press and its arguments, the
    verdict of each check, the battery's models (`quick`: the tiny ones only), where a user's press came
    from, and when."""

    __pydantic_config__ = STRICT

    press: str
    press_args: dict[str, Any]
    verdicts: dict[str, str]
    quick: bool
    model: str
    written: str
    source: dict[str, Any] | None = None


def write_record(folder, record: ConformanceRecord) -> Path:
    """FOLDER/conformance/<press>.json, written whole (tmp + rename); its path."""
    path = Path(folder) / CONFORMANCE_DIR / f"{record.press}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".json.tmp")
    temporary.write_text(json.dumps(dataclasses.asdict(record), indent=1, default=str) + "\n")
    os.replace(temporary, path)
    return path


def read_records(folder) -> list[ConformanceRecord]:
    """The conformance records of a results folder; one that does not fit its schema is skipped with a
    KvbenchWarning naming it (the report still renders)."""
    records = []
    for path in sorted((Path(folder) / CONFORMANCE_DIR).glob("*.json")):
        try:
            text = read_bytes(path, DataFileError)
            records.append(check_json(ConformanceRecord, text, str(path), DataFileError))
        except (DataFileError, OSError) as error:
            warnings.warn(f"skipped a conformance record: {error}", KvbenchWarning, stacklevel=2)
    return records
