"""Suites: the YAML files of tasks/ (any YAML there is a suite), those of the folders given with
`include_path` (whose task YAMLs are registered too), or a suite YAML given by its path; one schema
(`_SuiteFile`), checked where it is read."""

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import annotated_types

from kvbench.core.errors import BadInput, DataFileError, UnknownTask, did_you_mean
from kvbench.core.resources import suites_dir
from kvbench.core.validation import STRICT, check_json, load_yaml
from kvbench.tasks import jsonl
from kvbench.tasks.registry import register_data_task

SUITES_DIR = suites_dir()  # tasks/*.yaml: any YAML file there is a suite
SUITE_PATHS: dict[str, Path] = {}  # suites from the user's folders (`include_path`) and paths, by name


def unknown_suite(name: str) -> UnknownTask:
    return UnknownTask(f"unknown suite {name!r}{did_you_mean(name, suite_names())} (see `kvbench tasks`)")


def include_path(folder: Path | str) -> list[str]:
    """Register every task YAML of `folder` (a YAML with a `task` key: `jsonl.TaskFile`) and make its suite
    YAMLs (with `tasks`) known by name, the file's name; the task names registered. A suite named as
    kvbench's or as one of another file is refused, naming both, as a task's name is."""
    folder = Path(folder)
    if not folder.is_dir():
        raise BadInput(f"--include-path {str(folder)!r} is not a folder")
    names = []
    for path in sorted([*folder.resolve().glob("*.yaml"), *folder.resolve().glob("*.yml")]):
        spec = load_yaml(path, DataFileError)
        if isinstance(spec, dict) and "task" in spec:
            names.append(register_data_task(jsonl.read_task_file(path)))
        elif isinstance(spec, dict) and "tasks" in spec:
            _register_suite_path(path)
    return names


def _register_suite_path(path: Path) -> None:
    """Make the suite YAML at `path` (resolved) known by its file's name, unless that name is taken."""
    built_in = SUITES_DIR / f"{path.stem}.yaml"
    owner = SUITE_PATHS.get(path.stem, built_in if built_in.is_file() else None)
    if owner is not None and owner.resolve() != path:
        taken_by = "kvbench's built-in suite" if owner.resolve() == built_in.resolve() else str(owner)
        raise BadInput(f"{path}: suite name {path.stem!r} is taken by {taken_by}; rename the file")
    SUITE_PATHS[path.stem] = path


@dataclass
class Suite:
    name: str
    tasks: list[str]
    length: int | None  # None: each task's default for the model (LongBench: THUDM's per-model limit)
    samples: int
    description: str = ""
    tokenizer: str | None = None  # what sizes the samples (a hub id or folder); None: the model's


@dataclass
class _SuiteFile:
    """The schema of a suite YAML: its tasks (names, at least one), and optionally the context length in
    tokens, the samples per task, a description and the tokenizer that sizes the samples instead of the
    model's (a hub id or a folder, as `--tokenizer` takes). Unknown keys are refused."""

    __pydantic_config__ = {**STRICT, "extra": "forbid"}

    tasks: Annotated[list[Annotated[str, annotated_types.MinLen(1)]], annotated_types.MinLen(1)]
    length: Annotated[int, annotated_types.Interval(ge=1, lt=2**31)] | None = None
    samples: Annotated[int, annotated_types.Interval(ge=1, lt=2**31)] = 5
    description: str = field(default="")
    tokenizer: Annotated[str, annotated_types.MinLen(1)] | None = None


def suite_names() -> list[str]:
    return sorted({*(p.stem for p in SUITES_DIR.glob("*.yaml")), *SUITE_PATHS})


def list_suites() -> list[Suite]:
    return [load_suite(name) for name in suite_names()]


def is_suite_path(name: str) -> bool:
    """Whether a --suite value names a file (`path/to/suite.yaml`) rather than a suite of the registry."""
    return name.endswith((".yaml", ".yml")) or "/" in name


def load_suite(name: str) -> Suite:
    """The suite `name` (tasks/, or a folder given with `include_path`) or the suite YAML at path `name`,
    whose folder's task YAMLs are registered first; checked against `_SuiteFile`. A `tokenizer:` that names a
    folder is relative to the suite's folder; anything else is a hub id."""
    if is_suite_path(name):
        path = Path(name)
        if not path.is_file():
            raise UnknownTask(f"--suite {name!r}: no such file")
        include_path(path.parent)
    else:
        path = SUITE_PATHS.get(name, SUITES_DIR / f"{name}.yaml")
        if not path.is_file():
            raise unknown_suite(name)
    spec = json.dumps(
        load_yaml(path, DataFileError), default=str
    )  # strict JSON mode: objects fill dataclasses
    parsed = check_json(_SuiteFile, spec, f"{path}: not a suite", DataFileError)
    tokenizer = parsed.tokenizer
    if tokenizer is not None and (path.parent / tokenizer).is_dir():
        tokenizer = str((path.parent / tokenizer).resolve())
    return Suite(path.stem, list(parsed.tasks), parsed.length, parsed.samples, parsed.description, tokenizer)
