"""Several samples in one context: which tasks can share one (`check_combinable`), and the combined
samples (`load_combined_samples`: tasks rotated over the parts; LongBench's questions grouped by context)."""

from dataclasses import replace
from pathlib import Path

from kvbench.core.errors import BadInput
from kvbench.tasks import jsonl, longbench, ruler
from kvbench.tasks.base import Sample
from kvbench.tasks.prompt import transcript
from kvbench.tasks.registry import family_of, load_samples


# Tasks whose question names a key drawn at random for each sample (a needle's key, a variable's value, a
# document's question), so that the questions of several samples set side by side in one context can be
# told apart. Other tasks ask about "the one" line of a kind (the held-out kinds) or aggregate over the
# whole context (RULER's cwe/fwe): two of their samples in one context would make each question ambiguous.
def _names_its_key(task: str) -> bool:
    return task in ruler.TASKS and ruler.family(task) in ("niah", "vt", "qa")


def _why_once(task: str) -> str:
    """Why a task's samples cannot share a context (`_names_its_key` is False), in words."""
    if task in ruler.TASKS:
        return "its question is about the whole context"
    if task in jsonl.DATA_TASKS:
        return "its records' questions may not name what they ask about"
    return "its question asks about the one line of its kind"


def check_combinable(names: list[str], length: int | None, questions: int, *, turns: bool = False) -> None:
    """Fail before any work if `questions` samples of the tasks `names` (cycled) cannot share one context
    of `length` tokens: each part gets length // questions tokens, at least its task's minimum; a task
    whose question does not name its key may appear once per context. LongBench tasks group their own
    questions by context instead (`_group_by_context`), and cannot be mixed with other tasks; those asked
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
    repeated = [name for name in names if not _names_its_key(name)]
    if len(names) < questions and repeated:
        per, option = ("turns", "--turns") if turns else ("questions", "--questions")
        raise BadInput(
            f"{questions} {per} per context from {len(names)} task(s): two samples of task {repeated[0]!r} "
            f"in one context would make its questions ambiguous ({_why_once(repeated[0])}), so a context "
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


def _group_by_context(samples: list[Sample], questions: int) -> list[Sample]:
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
    tasks: each task's first `samples` contexts, its questions grouped by context (`_group_by_context`)."""
    if names[0] in longbench.TASKS:  # (`check_combinable`: then all are)
        return [
            combined
            for name in names
            for combined in _group_by_context(
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
