"""The files of learned state and data stores, written whole and read with one-line errors: atomic
writes, and JSON read as a dict or refused naming the file and the command that makes it again."""

import json
import os
from pathlib import Path

from kvbench.bridge import models
from kvbench.core.errors import TrainingFileError
from kvbench.core.validation import parse_json

MANIFEST_FILE = "manifest.json"  # a data store's (store.py)
CARD_FILE = "card.json"  # learned state's (state.py)


def write_atomically(path: Path, write) -> None:
    """write(tmp_path), then rename over `path`: a reader never sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    os.replace(tmp, path)


def write_json(path: Path, content: dict) -> None:
    write_atomically(path, lambda tmp: tmp.write_text(json.dumps(content, indent=1) + "\n"))


def corrupt(path: Path, reason, hint: str) -> TrainingFileError:
    if isinstance(reason, BaseException):
        reason = models.first_line(reason)
    return TrainingFileError(f"{path} is corrupt ({reason}); make it again with: {hint}")


def read_json(path: Path, what: str, hint: str) -> dict:
    """A JSON file as a dict, or a one-line error naming the file and `hint` (the command that makes it)."""
    if not path.is_file():
        raise TrainingFileError(f"no {what} at {path.parent} (missing {path.name}); make it with: {hint}")
    try:
        content = parse_json(path.read_text())
        if not isinstance(content, dict):
            raise ValueError("not a JSON object")
    except (ValueError, UnicodeDecodeError) as error:
        raise corrupt(path, error, hint) from None
    return content
