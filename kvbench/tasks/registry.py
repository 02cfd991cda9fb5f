"""Task registry: RULER, agent traces and the text/held-out kinds (generated offline), LongBench (hub or local
JSONL), the user's own data (`jsonl`: JSONL, Parquet, datasets folders), and metrics.

Task families and metrics are registries (`kvbench.core.registry`) that plugins extend through the entry-point
groups `kvbench.tasks` and `kvbench.metrics`.
"""

import inspect
import numbers
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kvbench.core.errors import BadInput, UnknownTask, did_you_mean
from kvbench.core.registry import (
    USER_CODE_FAILURES,
    PluginError,
    Registry,
    first_line,
    is_target,
    load_target,
    source_of,
)
from kvbench.tasks import (
    agent,
    heldout,
    infinitebench,
    jsonl,
    listing,
    longbench,
    longbench_v2,
    loogle,
    math_answers,
    needle,
    ruler,
    text,
    zero_scrolls,
)
from kvbench.tasks.base import Sample
from kvbench.tasks.longbench_metrics import normalize_answer

# A family (a module or any object) exposes: TASKS {name: one-line description}, METRICS {name:
# fn(prediction, sample) -> score in [0, 100]}, min_length(task) -> int, make_samples(task, length, samples,
# seed, tokenizer, data_dir) -> list[Sample], and optionally reads_data_dir(task) -> bool (default False),
# sized_by_tokenizer(task) -> bool (default True: its samples depend on the tokenizer they are made with) and
# check_data(task, data_dir) (reads the local files it would use, so a bad one fails before a model loads).
FAMILY_API = ("TASKS", "METRICS", "min_length", "make_samples")

# kvbench's own families, in the order `kvbench tasks` lists them: each module declares its `FAMILY`
# (kvbench.tasks.family), which the registry, the training mixtures and kvpress's interop read.
BUILT_IN = (
    ruler,
    agent,
    text,
    *heldout.SUITES,  # each held-out suite is its own family
    longbench,
    listing,  # long answers, for the decode-heavy protocol
    jsonl,  # the user's own data
    longbench_v2,
    infinitebench,
    zero_scrolls,
    loogle,
    needle,
    math_answers,
)


def _family_from_plugin(name: str, family: Any) -> Any:
    missing = [attribute for attribute in FAMILY_API if not hasattr(family, attribute)]
    if missing:
        raise PluginError(f"not a task family: it lacks {', '.join(missing)}")
    for metric_name, metric in family.METRICS.items():
        if METRICS.entries.get(metric_name, metric) is not metric:
            raise PluginError(f"task family {name!r}: metric {metric_name!r} is another family's already")
        METRICS.register(metric_name, metric, replace=True)
    return family


TASK_FAMILIES: Registry = Registry("tasks", _family_from_plugin)


def register_family(name: str, family: Any) -> Any:
    """Add a task family (`FAMILY_API`) and its metrics to the registries."""
    return TASK_FAMILIES.register(name, _family_from_plugin(name, family))


def _is_score(value: object) -> bool:
    """Whether a user's metric gave a score: a finite number in [0, 1]."""
    return not isinstance(value, bool) and isinstance(value, numbers.Real) and 0 <= value <= 1


@dataclass(frozen=True)
class UserMetric:
    """A user's metric `function(prediction, references) -> score in [0, 1]`, called as kvbench's metrics
    are, `(prediction, sample) -> score in [0, 100]`; a function that raises, or a score that is not a
    number in [0, 1], is BadInput naming the metric and the sample. `digest`: of the file that defines it,
    which the samples it scores are keyed by (an edited metric scores again)."""

    name: str
    function: Callable
    digest: str | None = None

    def __call__(self, prediction: str, sample: Sample) -> float:
        try:
            score = self.function(prediction, list(sample.references))
        except USER_CODE_FAILURES as error:  # the user's code may fail in any way: one line, naming it
            raise BadInput(
                f"metric {self.name!r} fails on sample {sample.task}/{sample.id}: {first_line(error)}"
            ) from None
        if not _is_score(score):
            raise BadInput(
                f"metric {self.name!r} gave {score!r} for sample {sample.task}/{sample.id}: not in [0, 1]"
            )
        return 100.0 * float(score)


def _metric_from_plugin(name: str, function: object) -> UserMetric:
    """A metric of a plugin or target: a function `(prediction, references) -> score in [0, 1]`, its
    signature checked (never called: what it does runs only on answers)."""
    if not callable(function):
        raise PluginError(f"metric {name!r} is {type(function).__name__}, not a function")
    try:
        inspect.signature(function).bind("a", ["a"])
    except (TypeError, ValueError):
        raise PluginError(
            f"metric {name!r}: a metric takes (prediction, references) and returns a score in [0, 1]"
        ) from None
    return UserMetric(name, function, source_of(function).digest)


def exact_match(prediction: str, sample: Sample) -> float:
    """100 if the prediction equals a reference after SQuAD's normalisation (case, punctuation, articles,
    spaces), else 0."""
    return 100.0 * any(normalize_answer(prediction) == normalize_answer(ref) for ref in sample.references)


METRICS: Registry = Registry("metrics", _metric_from_plugin)
METRICS.register("exact_match", exact_match)
METRICS.register("contains", ruler.string_match_part)  # any reference in the prediction, case-insensitive
for family_module in BUILT_IN:
    register_family(family_module.FAMILY.name, family_module)
_BUILT_IN_FAMILIES = frozenset(TASK_FAMILIES.entries)


def register_metric(name: str, function) -> str:
    """Add a user's metric `function(prediction, references) -> score in [0, 1]` under `name`."""
    METRICS.register(name, _metric_from_plugin(name, function), replace=name in user_metrics())
    return name


def metric_target(metric: str, folder: Path | None = None) -> str:
    """`metric` as the registry names it: a `file.py:function` target with its file resolved from `folder`
    (the file that names it; default the working folder), anything else as it is."""
    module, _, function = metric.rpartition(":")
    if is_target(metric) and (module.endswith(".py") or "/" in module):
        return f"{(Path(folder or '.') / module).resolve()}:{function}"
    return metric


def resolve_metric(metric: str, folder: Path | None = None) -> str:
    """The registry's name of `metric`: a name as it is; a target `module:function` (or `file.py:function`,
    from `folder`) loaded and registered under the target (`metric_target`), again when its file changed;
    BadInput naming the known metrics if neither."""
    if not isinstance(metric, str) or not metric.strip():
        raise BadInput(f"--metric must name a metric, got {metric!r}")
    if is_target(metric):
        target = metric_target(metric, folder)
        function = load_target(target, "metric")
        held = METRICS.entries.get(target)
        if not (isinstance(held, UserMetric) and held.function is function):
            register_metric(target, function)
        return target
    if metric in METRICS:
        METRICS[metric]  # a plugin's metric loads (and is checked) now
        return metric
    raise BadInput(f"unknown metric {metric!r}{did_you_mean(metric, METRICS)} (one of {', '.join(METRICS)})")


def user_metrics() -> dict[str, str]:
    """The metrics registered from a user's target: name -> target, what a Ray worker registers again."""
    return {
        name: name
        for name, metric in METRICS.entries.items()
        if isinstance(metric, UserMetric) and is_target(name)
    }


def register_user_metrics(targets: dict[str, str]) -> None:
    for target in targets.values():
        resolve_metric(target)


def _task_file_metric(task: "jsonl.DataTask") -> str:
    """The registry's name of a data task's metric. A task YAML is data that people share, so the code it
    names (`module:function`, `file.py:function` from the YAML's folder) is never imported from it: only a
    metric the user gave as code (`--metric`, `register_metric`) or installed (a plugin) is taken; else
    BadInput saying how to allow it."""
    if task.source is None or not is_target(task.metric):
        return resolve_metric(task.metric)
    target = metric_target(task.metric, task.source.parent)
    if target not in user_metrics():
        raise BadInput(
            f"{task.source}: metric {task.metric!r} is code, which a task YAML never runs; to run it, "
            f"give it on the command line: --metric {target}"
        )
    return resolve_metric(target)


def family_of(task: str):
    for module in TASK_FAMILIES.loaded().values():
        if task in module.TASKS:
            return module
    raise unknown_task(task)


def unknown_task(name: str) -> UnknownTask:
    """The task is in no family that loads; a family plugin that failed to load may hold it: say why."""
    broken = "".join(f"; {error}" for error in TASK_FAMILIES.broken())
    hint = did_you_mean(name, task_names())
    return UnknownTask(f"unknown task {name!r}{hint} (see `kvbench tasks`){broken}")


def task_names() -> list[str]:
    return [name for module in TASK_FAMILIES.loaded().values() for name in module.TASKS]


def reads_data_dir(task: str) -> bool:
    """Whether `task` reads local files from --data-dir (LongBench's JSONL, RULER QA's SQuAD or HotpotQA), as
    its family says (`FAMILY_API`)."""
    family = family_of(task)
    return bool(getattr(family, "reads_data_dir", lambda task: False)(task))


def sized_by_tokenizer(task: str) -> bool:
    """Whether the samples of `task` depend on the tokenizer they are made with (filled or cut to a length in
    its tokens), as its family says (`FAMILY_API`); what `--tokenizer` applies to."""
    family = family_of(task)
    return bool(getattr(family, "sized_by_tokenizer", lambda task: True)(task))


def register_data_task(task: "jsonl.DataTask") -> str:
    """Add the user's data task to the registry (its metric resolved: a name or `module:function`); a name
    taken by another task (kvbench's, a plugin's, or a data task of other data or another task YAML) is
    refused, naming both, as is a name a table or a file name cannot show (`_check_task_name`). Its records
    are read when a run checks its data."""
    _check_task_name(task)
    owner = _task_owner(task)
    if owner is not None:
        advice = (
            "choose another `task:`" if task.source else "rename the file or name its task in a task YAML"
        )
        raise BadInput(f"{jsonl.origin(task)}: task name {task.name!r} is taken by {owner}; {advice}")
    metric = _task_file_metric(task)
    jsonl.register_data_task(
        replace(task, metric=metric, metric_digest=getattr(METRICS[metric], "digest", None))
    )
    return task.name


_MAX_TASK_NAME = 100  # characters: a task names report sections, table rows and plot files


def _check_task_name(task: "jsonl.DataTask") -> None:
    """BadInput when the task's name (a --data file's stem, or a task YAML's `task:`) holds a character
    that shows as nothing or moves the text around it (controls, zero-width and direction marks: Unicode's
    C categories) or is longer than `_MAX_TASK_NAME`: rows, report tables and plot names carry it."""
    hidden = next((char for char in task.name if unicodedata.category(char).startswith("C")), None)
    if hidden is not None:
        raise BadInput(
            f"{jsonl.origin(task)}: task name {task.name!r} holds U+{ord(hidden):04X}, which shows as "
            "nothing or reorders the text around it; rename the file or name its task in a task YAML"
        )
    if len(task.name) > _MAX_TASK_NAME:
        raise BadInput(
            f"{jsonl.origin(task)}: task name of {len(task.name)} characters, more than {_MAX_TASK_NAME}; "
            "rename the file or name its task in a task YAML"
        )


def _task_owner(task: "jsonl.DataTask") -> str | None:
    """What already holds the name of `task`, in words; None when nothing does, or the same data task
    (the same data, from the same task YAML: a folder included again)."""
    existing = jsonl.DATA_TASKS.get(task.name)
    if existing is not None:
        return (
            None if (existing.path, existing.source) == (task.path, task.source) else jsonl.origin(existing)
        )
    for family, module in TASK_FAMILIES.loaded().items():
        if task.name in module.TASKS:
            return (
                "kvbench's built-in task" if family in _BUILT_IN_FAMILIES else f"a task of family {family!r}"
            )
    return None


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
        for family, module in TASK_FAMILIES.loaded().items()
        for name, description in module.TASKS.items()
    ]


def load_samples(
    task: str, *, length: int, samples: int, seed: int, tokenizer, data_dir: Path | None = None
) -> list[Sample]:
    """The `samples` first samples of `task`, deterministic in (task, length, seed, tokenizer)."""
    return family_of(task).make_samples(task, length, samples, seed, tokenizer, data_dir)


def check_data(task: str, data_dir: Path | None) -> None:
    """Read the local data files a task would use (LongBench's JSONL, RULER QA's SQuAD or HotpotQA JSON, a
    user's records), so that a missing or malformed file is an error naming it before any model loads."""
    if hasattr(family := family_of(task), "check_data"):  # a family that reads its own files checks them
        family.check_data(task, data_dir)


def score_sample(sample: Sample, prediction: str) -> float:
    return METRICS[sample.metric](prediction, sample)
