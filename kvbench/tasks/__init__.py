"""Task registry: RULER, agent traces and the text/held-out kinds (generated offline), LongBench (hub or local
JSONL), YAML suites."""

from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from kvbench.errors import BadInput, DataFileError, UnknownTask, did_you_mean
from kvbench.resources import suites_dir
from kvbench.tasks import agent, heldout, longbench, ruler, text
from kvbench.tasks.base import Sample, TaskUnavailable
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


# Tasks whose question names a key drawn at random for each sample (a needle's key, a variable's value, a
# document's question), so that the questions of several samples set side by side in one context can be
# told apart. Other tasks ask about "the one" line of a kind (the held-out kinds) or aggregate over the
# whole context (RULER's cwe/fwe): two of their samples in one context would make each question ambiguous.
def names_its_key(task: str) -> bool:
    return task in ruler.TASKS and ruler.family(task) in ("niah", "vt", "qa")


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
        raise BadInput(
            f"{questions} questions per context from {len(names)} task(s): task {repeated[0]!r} asks about "
            "the one line of its kind, so each context may hold one of its samples; give at least as many "
            "tasks (e.g. a suite) or fewer --questions/--turns"
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
    """Read the local data files a task would use (LongBench's JSONL, RULER QA's SQuAD or HotpotQA JSON), so
    that a missing or malformed file is an error naming it before any model loads."""
    if task in longbench.TASKS and data_dir is not None:
        longbench.read_rows(longbench.parse_task(task)[1], data_dir)
    if task in ruler.QA_FILES and data_dir is not None and (Path(data_dir) / ruler.QA_FILES[task]).is_file():
        ruler.qa_data(task, Path(data_dir))


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
