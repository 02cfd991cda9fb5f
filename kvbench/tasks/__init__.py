"""Task registry: RULER, agent traces and the text/held-out kinds (generated offline), LongBench (hub or local
JSONL), the user's own data (`jsonl`: JSONL, Parquet, datasets folders), metrics, YAML suites.

Task families and metrics are registries (`kvbench.core.registry`) that plugins extend through the entry-point
groups `kvbench.tasks` and `kvbench.metrics`; suites are the YAML files of tasks/ and of the folders given
with `include_path`, or a suite YAML given by its path.
"""

import inspect
import json
import numbers
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any

import annotated_types

from kvbench.core.errors import BadInput, DataFileError, UnknownTask, did_you_mean
from kvbench.core.registry import (
    USER_CODE_FAILURES,
    PluginError,
    Registry,
    first_line,
    is_target,
    load_target,
    source_of,
)
from kvbench.core.resources import suites_dir
from kvbench.core.validation import STRICT, check_json, load_yaml
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
from kvbench.tasks.base import Sample, TaskUnavailable
from kvbench.tasks.longbench_metrics import normalize_answer
from kvbench.tasks.prompt import transcript

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

# A family (a module or any object) exposes: TASKS {name: one-line description}, METRICS {name:
# fn(prediction, sample) -> score in [0, 100]}, min_length(task) -> int, make_samples(task, length, samples,
# seed, tokenizer, data_dir) -> list[Sample], and optionally reads_data_dir(task) -> bool (default False) and
# sized_by_tokenizer(task) -> bool (default True: its samples depend on the tokenizer they are made with).
FAMILY_API = ("TASKS", "METRICS", "min_length", "make_samples")


def family_from_plugin(name: str, family: Any) -> Any:
    missing = [attribute for attribute in FAMILY_API if not hasattr(family, attribute)]
    if missing:
        raise PluginError(f"not a task family: it lacks {', '.join(missing)}")
    for metric_name, metric in family.METRICS.items():
        if METRICS.entries.get(metric_name, metric) is not metric:
            raise PluginError(f"task family {name!r}: metric {metric_name!r} is another family's already")
        METRICS.register(metric_name, metric, replace=True)
    return family


TASK_FAMILIES: Registry = Registry("tasks", family_from_plugin)


def register_family(name: str, family: Any) -> Any:
    """Add a task family (`FAMILY_API`) and its metrics to the registries."""
    return TASK_FAMILIES.register(name, family_from_plugin(name, family))


def is_score(value: object) -> bool:
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
        if not is_score(score):
            raise BadInput(
                f"metric {self.name!r} gave {score!r} for sample {sample.task}/{sample.id}: not in [0, 1]"
            )
        return 100.0 * float(score)


def metric_from_plugin(name: str, function: object) -> UserMetric:
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


METRICS: Registry = Registry("metrics", metric_from_plugin)
METRICS.register("exact_match", exact_match)
METRICS.register("contains", ruler.string_match_part)  # any reference in the prediction, case-insensitive
for family_name, family_module in {
    "ruler": ruler,
    "agent": agent,
    "text": text,
    **{suite.name: suite.module for suite in heldout.SUITES},  # each held-out suite is its own family
    "longbench": longbench,
    "listing": listing,  # long answers, for the decode-heavy protocol
    "jsonl": jsonl,  # the user's own data
}.items():
    register_family(family_name, family_module)
register_family("longbench-v2", longbench_v2)
register_family("infinitebench", infinitebench)
register_family("zero_scrolls", zero_scrolls)
register_family("loogle", loogle)
register_family("needle_in_haystack", needle)
register_family("math", math_answers)
BUILT_IN_FAMILIES = frozenset(TASK_FAMILIES.entries)


def register_metric(name: str, function) -> str:
    """Add a user's metric `function(prediction, references) -> score in [0, 1]` under `name`."""
    METRICS.register(name, metric_from_plugin(name, function), replace=name in user_metrics())
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


def task_file_metric(task: "jsonl.DataTask") -> str:
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


SUITES_DIR = suites_dir()  # tasks/*.yaml: any YAML file there is a suite
SUITE_PATHS: dict[str, Path] = {}  # suites from the user's folders (`include_path`) and paths, by name


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


def unknown_suite(name: str) -> UnknownTask:
    return UnknownTask(f"unknown suite {name!r}{did_you_mean(name, suite_names())} (see `kvbench tasks`)")


def task_names() -> list[str]:
    return [name for module in TASK_FAMILIES.loaded().values() for name in module.TASKS]


def reads_data_dir(task: str) -> bool:
    """Whether `task` reads local files from --data-dir (LongBench's JSONL, RULER QA's SQuAD or HotpotQA)."""
    if task in longbench.TASKS or task in ruler.QA_FILES:
        return True
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
    refused, naming both, as is a name a table or a file name cannot show (`check_task_name`). Its records
    are read when a run checks its data."""
    check_task_name(task)
    owner = task_owner(task)
    if owner is not None:
        advice = (
            "choose another `task:`" if task.source else "rename the file or name its task in a task YAML"
        )
        raise BadInput(f"{jsonl.origin(task)}: task name {task.name!r} is taken by {owner}; {advice}")
    metric = task_file_metric(task)
    jsonl.register_data_task(
        replace(task, metric=metric, metric_digest=getattr(METRICS[metric], "digest", None))
    )
    return task.name


MAX_TASK_NAME = 100  # characters: a task names report sections, table rows and plot files


def check_task_name(task: "jsonl.DataTask") -> None:
    """BadInput when the task's name (a --data file's stem, or a task YAML's `task:`) holds a character
    that shows as nothing or moves the text around it (controls, zero-width and direction marks: Unicode's
    C categories) or is longer than `MAX_TASK_NAME`: rows, report tables and plot names carry it."""
    hidden = next((char for char in task.name if unicodedata.category(char).startswith("C")), None)
    if hidden is not None:
        raise BadInput(
            f"{jsonl.origin(task)}: task name {task.name!r} holds U+{ord(hidden):04X}, which shows as "
            "nothing or reorders the text around it; rename the file or name its task in a task YAML"
        )
    if len(task.name) > MAX_TASK_NAME:
        raise BadInput(
            f"{jsonl.origin(task)}: task name of {len(task.name)} characters, more than {MAX_TASK_NAME}; "
            "rename the file or name its task in a task YAML"
        )


def task_owner(task: "jsonl.DataTask") -> str | None:
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
                "kvbench's built-in task" if family in BUILT_IN_FAMILIES else f"a task of family {family!r}"
            )
    return None


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
            register_suite_path(path)
    return names


def register_suite_path(path: Path) -> None:
    """Make the suite YAML at `path` (resolved) known by its file's name, unless that name is taken."""
    built_in = SUITES_DIR / f"{path.stem}.yaml"
    owner = SUITE_PATHS.get(path.stem, built_in if built_in.is_file() else None)
    if owner is not None and owner.resolve() != path:
        taken_by = "kvbench's built-in suite" if owner.resolve() == built_in.resolve() else str(owner)
        raise BadInput(f"{path}: suite name {path.stem!r} is taken by {taken_by}; rename the file")
    SUITE_PATHS[path.stem] = path


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


# Tasks whose question names a key drawn at random for each sample (a needle's key, a variable's value, a
# document's question), so that the questions of several samples set side by side in one context can be
# told apart. Other tasks ask about "the one" line of a kind (the held-out kinds) or aggregate over the
# whole context (RULER's cwe/fwe): two of their samples in one context would make each question ambiguous.
def names_its_key(task: str) -> bool:
    return task in ruler.TASKS and ruler.family(task) in ("niah", "vt", "qa")


def why_once(task: str) -> str:
    """Why a task's samples cannot share a context (`names_its_key` is False), in words."""
    if task in ruler.TASKS:
        return "its question is about the whole context"
    if task in jsonl.DATA_TASKS:
        return "its records' questions may not name what they ask about"
    return "its question asks about the one line of its kind"


def check_combinable(names: list[str], length: int | None, questions: int, *, turns: bool = False) -> None:
    """Fail before any work if `questions` samples of the tasks `names` (cycled) cannot share one context
    of `length` tokens: each part gets length // questions tokens, at least its task's minimum; a task
    whose question does not name its key may appear once per context. LongBench tasks group their own
    questions by context instead (`group_by_context`), and cannot be mixed with other tasks; those asked
    without the chat template have no turns to take (`turns`: the multi-turn protocol)."""
    bench = [name for name in names if name in longbench.TASKS]
    if bench:
        if len(bench) < len(names):
            raise BadInput(f"LongBench task {bench[0]!r} cannot share contexts with tasks of other families")
        raw = [name for name in bench if longbench.parse_task(name)[0] in longbench.NO_CHAT_TEMPLATE]
        if turns and raw:
            raise BadInput(
                f"task {raw[0]!r} is a raw prompt without the chat template: it has no turns to take"
            )
        return
    repeated = [name for name in names if not names_its_key(name)]
    if len(names) < questions and repeated:
        per, option = ("turns", "--turns") if turns else ("questions", "--questions")
        raise BadInput(
            f"{questions} {per} per context from {len(names)} task(s): two samples of task {repeated[0]!r} "
            f"in one context would make its questions ambiguous ({why_once(repeated[0])}), so a context "
            f"holds one of its samples; give at least {questions} tasks (e.g. a suite) or a smaller {option}"
        )
    if length is not None:
        for name in names:
            minimum = family_of(name).min_length(name)
            if length // questions < minimum:
                raise BadInput(
                    f"length {length} gives each of {questions} questions {length // questions} tokens, "
                    f"below the minimum of task {name!r} ({minimum}); give a larger --length"
                )


def combine_samples(parts: list[Sample], sample_id: str) -> Sample:
    """One context made of the parts' material, in order, whose questions are the parts' (`Sample.parts`).

    The material is joined in one user turn when no part is made of chat turns, else the parts' turns
    follow one another (a part without turns is one user turn). The parts keep their own questions,
    answer prefixes, references and metrics: each answer is scored as the part alone would be."""
    if not all(part.chat_template for part in parts):
        raise BadInput("samples without the chat template cannot share a context")
    messages = None
    if any(part.messages for part in parts):
        messages = [
            m for part in parts for m in (part.messages or [{"role": "user", "content": part.context}])
        ]
    first = parts[0]
    return Sample(
        task=first.task,
        id=sample_id,
        context=transcript(messages) if messages else "\n\n".join(part.context for part in parts),
        question=first.question,
        answer_prefix=first.answer_prefix,
        references=list(first.references),
        max_new_tokens=first.max_new_tokens,
        metric=first.metric,
        meta={"tasks": [part.task for part in parts], "parts": [part.id for part in parts]},
        messages=messages,
        parts=parts,
    )


def group_by_context(samples: list[Sample], questions: int) -> list[Sample]:
    """LongBench's questions grouped by their context (several rows of a dataset ask about one document):
    one sample per distinct context, in order of first appearance, holding up to `questions` of its
    questions as parts (a context asked once is a context of one question). Ids: "<questions>q-<first
    question's id>"."""
    groups: dict[str, list[Sample]] = {}
    for sample in samples:
        groups.setdefault(sample.context, []).append(sample)
    return [
        replace(
            group[0],
            id=f"{questions}q-{group[0].id}",
            meta={"parts": [part.id for part in group[:questions]]},
            parts=group[:questions],
        )
        for group in groups.values()
    ]


def load_combined_samples(
    names: list[str],
    *,
    length: int,
    samples: int,
    questions: int,
    seed: int,
    tokenizer,
    data_dir: Path | None = None,
) -> list[Sample]:
    """`samples` contexts of `questions` parts each: the k-th context's j-th part is a sample of task
    names[(k + j) % len(names)] (the tasks rotate, so each is asked at every position of a context),
    sized to length // questions tokens, and no sample is used twice. Ids: "<questions>q-<k>". LongBench
    tasks: each task's first `samples` contexts, its questions grouped by context (`group_by_context`)."""
    if names[0] in longbench.TASKS:  # (`check_combinable`: then all are)
        return [
            combined
            for name in names
            for combined in group_by_context(
                load_samples(
                    name, length=length, samples=10**9, seed=seed, tokenizer=tokenizer, data_dir=data_dir
                ),
                questions,
            )[:samples]
        ]
    part_length = length // questions
    drawn = {name: [] for name in names}
    plan = [[names[(k + j) % len(names)] for j in range(questions)] for k in range(samples)]
    for name in names:
        count = sum(row.count(name) for row in plan)
        drawn[name] = load_samples(
            name, length=part_length, samples=count, seed=seed, tokenizer=tokenizer, data_dir=data_dir
        )
    used = {name: iter(drawn[name]) for name in names}
    return [
        combine_samples([next(used[name]) for name in row], f"{questions}q-{k}") for k, row in enumerate(plan)
    ]


def check_data(task: str, data_dir: Path | None) -> None:
    """Read the local data files a task would use (LongBench's JSONL, RULER QA's SQuAD or HotpotQA JSON, a
    user's records), so that a missing or malformed file is an error naming it before any model loads."""
    if task in jsonl.DATA_TASKS:
        jsonl.checked_records(jsonl.DATA_TASKS[task])
    if task in longbench.TASKS and data_dir is not None:
        longbench.read_rows(longbench.parse_task(task)[1], data_dir)
    if task in ruler.QA_FILES and data_dir is not None and (Path(data_dir) / ruler.QA_FILES[task]).is_file():
        ruler.qa_data(task, Path(data_dir))
    if hasattr(family := family_of(task), "check_data"):  # a family that reads its own files checks them
        family.check_data(task, data_dir)


def score_sample(sample: Sample, prediction: str) -> float:
    return METRICS[sample.metric](prediction, sample)


@dataclass
class Suite:
    name: str
    tasks: list[str]
    length: int | None  # None: each task's default for the model (LongBench: THUDM's per-model limit)
    samples: int
    description: str = ""
    tokenizer: str | None = None  # what sizes the samples (a hub id or folder); None: the model's


@dataclass
class SuiteFile:
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
    whose folder's task YAMLs are registered first; checked against `SuiteFile`. A `tokenizer:` that names a
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
    parsed = check_json(SuiteFile, spec, f"{path}: not a suite", DataFileError)
    tokenizer = parsed.tokenizer
    if tokenizer is not None and (path.parent / tokenizer).is_dir():
        tokenizer = str((path.parent / tokenizer).resolve())
    return Suite(path.stem, list(parsed.tasks), parsed.length, parsed.samples, parsed.description, tokenizer)
