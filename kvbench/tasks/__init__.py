"""Task registry: RULER, agent traces and the text/held-out kinds (generated offline), LongBench (hub or local
JSONL), YAML suites."""

from dataclasses import dataclass
from pathlib import Path

import yaml

from kvbench.errors import DataFileError, UnknownTask, did_you_mean
from kvbench.resources import suites_dir
from kvbench.tasks import agent, heldout, longbench, ruler, text
from kvbench.tasks.base import Sample, TaskUnavailable

__all__ = [
    "Sample",
    "TaskUnavailable",
    "Suite",
    "TaskInfo",
    "TASK_FAMILIES",
    "METRICS",
    "list_suites",
    "list_tasks",
    "load_samples",
    "score_sample",
]

# Each family module exposes: TASKS {name: one-line description}, METRICS {name: fn(prediction, sample)},
# min_length(task) -> int, make_samples(task, length, samples, seed, tokenizer, data_dir) -> list[Sample].
TASK_FAMILIES = {
    "ruler": ruler,
    "agent": agent,
    "text": text,
    **{suite.name: suite.module for suite in heldout.SUITES},  # each held-out suite is its own family
    "longbench": longbench,
}
METRICS = {name: metric for module in TASK_FAMILIES.values() for name, metric in module.METRICS.items()}
SUITES_DIR = suites_dir()  # tasks/*.yaml: any YAML file there is a suite


def family_of(task: str):
    for module in TASK_FAMILIES.values():
        if task in module.TASKS:
            return module
    raise unknown_task(task)


def unknown_task(name: str) -> UnknownTask:
    return UnknownTask(f"unknown task {name!r}{did_you_mean(name, task_names())} (see `kvbench tasks`)")


def unknown_suite(name: str) -> UnknownTask:
    return UnknownTask(f"unknown suite {name!r}{did_you_mean(name, suite_names())} (see `kvbench tasks`)")


def task_names() -> list[str]:
    return [name for module in TASK_FAMILIES.values() for name in module.TASKS]


@dataclass(frozen=True)
class TaskInfo:
    """A task of the registry: its family (ruler, agent, longbench), what it asks, its shortest length."""

    name: str
    family: str
    description: str
    min_length: int


def list_tasks() -> list[TaskInfo]:
    """Every task, family by family."""
    return [
        TaskInfo(name, family, description, module.min_length(name))
        for family, module in TASK_FAMILIES.items()
        for name, description in module.TASKS.items()
    ]


def load_samples(
    task: str, *, length: int, samples: int, seed: int, tokenizer, data_dir: Path | None = None
) -> list[Sample]:
    """The `samples` first samples of `task`, deterministic in (task, length, seed, tokenizer)."""
    return family_of(task).make_samples(task, length, samples, seed, tokenizer, data_dir)


def check_data(task: str, data_dir: Path | None) -> None:
    """Read the local data files a task would use (LongBench's JSONL), so that a missing or malformed file
    is an error naming it before any model loads."""
    if task in longbench.TASKS and data_dir is not None:
        longbench.read_rows(longbench.parse_task(task)[1], data_dir)


def score_sample(sample: Sample, prediction: str) -> float:
    return METRICS[sample.metric](prediction, sample)


@dataclass
class Suite:
    name: str
    tasks: list[str]
    length: int | None  # None: each task's default for the model (LongBench: THUDM's per-model limit)
    samples: int
    description: str = ""


def suite_names() -> list[str]:
    return sorted(p.stem for p in SUITES_DIR.glob("*.yaml"))


def list_suites() -> list[Suite]:
    return [load_suite(name) for name in suite_names()]


def load_suite(name: str) -> Suite:
    path = SUITES_DIR / f"{name}.yaml"
    if not path.is_file():
        raise unknown_suite(name)
    try:
        spec = yaml.safe_load(path.read_text())
        return Suite(name=name, **spec)
    except (yaml.YAMLError, TypeError) as error:
        raise DataFileError(f"{path}: not a suite ({str(error).splitlines()[0]})") from None
