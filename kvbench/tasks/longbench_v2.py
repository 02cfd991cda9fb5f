"""LongBench-v2 (THUDM/LongBench-v2): 503 multiple-choice questions on long contexts, as THUDM/LongBench's
`pred.py` (its v2 root) asks and `result.py` scores them.

Prompt: `prompts/0shot.txt` (the zero-shot template, without chain of thought), filled as pred.py fills it
(context, question and choices stripped), truncated in the middle to `length` tokens; the context part ends
with `</text>\\n\\n`, the question part is the rest, so `context + question` is the authors' prompt. Answers:
128 new tokens, with the chat template (pred.py sends the prompt as one user message).

Metric `longbench_v2_accuracy`: 100 when pred.py's `extract_answer` (asterisks removed, then "The correct
answer is (X)" or else "The correct answer is X", X in A-D) gives the row's answer, else 0.

Data: `--data-dir` holding the hub's `data.json` as `LongBench-v2/data.json`, or `longbench_v2.json`,
`longbench_v2.jsonl` or `longbench_v2.parquet` (the same rows); else the hub's `data.json`.
"""

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from kvbench.core.errors import DataFileError, UnknownTask
from kvbench.core.validation import STRICT
from kvbench.tasks import kvpress
from kvbench.tasks.base import Sample
from kvbench.tasks.family import Family, check_request, published_api
from kvbench.tasks.longbench import fit_prompt
from kvbench.tasks.published import HubFile, checked_rows, find_rows

logger = logging.getLogger(__name__)

HUB = HubFile("THUDM/LongBench-v2", "data.json")
MIN_LENGTH = 256
MAX_NEW_TOKENS = 128  # pred.py without --cot
LENGTHS = ("short", "medium", "long")

# THUDM/LongBench prompts/0shot.txt, verbatim (the file ends without a newline).
TEMPLATE = (
    "Please read the following text and answer the question below.\n\n<text>\n$DOC$\n</text>\n\n"
    "What is the correct answer to this question: $Q$\nChoices:\n(A) $C_A$\n(B) $C_B$\n(C) $C_C$\n"
    "(D) $C_D$\n\n"
    'Format your response as follows: "The correct answer is (insert answer here)".'
)
QUESTION_START = "What is the correct answer to this question:"

SOURCE = f"hub {HUB.repo} or --data-dir"
TASKS = {
    "longbench-v2": f"LongBench-v2: multiple choice on long contexts, all 503 ({SOURCE})",
    **{f"longbench-v2/{n}": f"LongBench-v2: its {n} contexts only ({SOURCE})" for n in LENGTHS},
}


@dataclass
class LongBenchV2Row:
    """The schema of a LongBench-v2 row (the fields pred.py reads); other fields are not read."""

    __pydantic_config__ = STRICT

    _id: str
    domain: str
    sub_domain: str
    difficulty: Literal["easy", "hard"]
    length: Literal["short", "medium", "long"]
    question: str
    choice_A: str
    choice_B: str
    choice_C: str
    choice_D: str
    answer: Literal["A", "B", "C", "D"]
    context: str


def extract_answer(response: str) -> str | None:
    """pred.py's `extract_answer`: the letter A-D of "The correct answer is (X)", else of "The correct
    answer is X", after removing asterisks; None if neither is there."""
    response = response.replace("*", "")
    match = re.search(r"The correct answer is \(([A-D])\)", response)
    if match:
        return match.group(1)
    match = re.search(r"The correct answer is ([A-D])", response)
    return match.group(1) if match else None


def accuracy(prediction: str, sample: Sample) -> float:
    """pred.py's `judge` x 100: the extracted choice equals the answer (a prediction without one scores 0,
    as result.py counts it uncompensated)."""
    return 100.0 * (extract_answer(prediction.strip()) == sample.references[0])


METRICS = {"longbench_v2_accuracy": accuracy}


min_length, reads_data_dir = published_api(MIN_LENGTH)


def local_files(data_dir: Path | None) -> list[Path]:
    if data_dir is None:
        return []
    folder = Path(data_dir)
    return [
        folder / "LongBench-v2" / "data.json",
        *(folder / f"longbench_v2{s}" for s in (".json", ".jsonl", ".parquet")),
    ]


def read_rows(data_dir: Path | None) -> list[LongBenchV2Row]:
    """Every row of the dataset, checked (`LongBenchV2Row`, ids unique), from data_dir first, else the hub."""
    rows, source = find_rows(local_files(data_dir), HUB, "LongBench-v2 data")
    return checked_rows(rows, LongBenchV2Row, source, id_field="_id")


def check_data(task: str, data_dir: Path | None) -> None:
    """Read the local file now, so a malformed one fails before any model loads."""
    if data_dir is not None and any(path.is_file() for path in local_files(data_dir)):
        read_rows(data_dir)


def prompt(row: LongBenchV2Row) -> tuple[str, str]:
    """(context, question): the authors' prompt, filled as pred.py fills it, cut where the question starts."""
    filled = (
        TEMPLATE.replace("$DOC$", row.context.strip())
        .replace("$Q$", row.question.strip())
        .replace("$C_A$", row.choice_A.strip())
        .replace("$C_B$", row.choice_B.strip())
        .replace("$C_C$", row.choice_C.strip())
        .replace("$C_D$", row.choice_D.strip())
    )
    start = filled.rindex(QUESTION_START)
    return filled[:start], filled[start:]


def make_samples(
    task: str, length: int, samples: int, seed: int, tokenizer, data_dir: Path | None
) -> list[Sample]:
    """The first `samples` rows (of the task's length class, for `longbench-v2/<length>`), prompts truncated
    in the middle to `length` tokens. `seed` plays no part: the set is fixed; ids are the rows' `_id`."""
    if task not in TASKS:
        raise UnknownTask(f"unknown LongBench-v2 task {task!r} (see `kvbench tasks`)")
    check_request("LongBench-v2", length, samples, MIN_LENGTH)
    wanted = task.partition("/")[2]
    rows = [row for row in read_rows(data_dir) if not wanted or row.length == wanted][:samples]
    result, truncated = [], 0
    for row in rows:
        context, question, cut = fit_prompt(*prompt(row), length, tokenizer)
        truncated += cut
        result.append(
            Sample(
                task=task,
                id=row._id,
                context=context,
                question=question,
                answer_prefix="",
                references=[row.answer],
                max_new_tokens=MAX_NEW_TOKENS,
                metric="longbench_v2_accuracy",
                meta={
                    "domain": row.domain,
                    "sub_domain": row.sub_domain,
                    "difficulty": row.difficulty,
                    "length_class": row.length,  # short, medium or long; meta.length is a count of tokens
                },
            )
        )
    if truncated:
        logger.warning(
            "%s: %d of %d prompts truncated in the middle to %d tokens", task, truncated, len(result), length
        )
    return result


# ---- kvpress's evaluation ----


class KvpressLongBenchV2(kvpress.Dataset):
    """`longbench-v2` (`benchmarks/longbenchv2/`): metrics.json `{"average": .., "easy": .., "hard": ..,
    "long": .., "medium": .., "short": ..}` (means in [0, 1] by `difficulty` and by `length`, the length
    class); data_dir `0shot` (its config_name; import takes none too); columns THUDM's (`_id`, `domain`,
    `sub_domain`, `difficulty`, `length`, `question`, `choice_A`..`choice_D`, `answer`) and
    `max_new_tokens`, `answer_prefix`. `longbench-v2` and `longbench-v2/<length>` are `longbench-v2` (a
    subset comes back as `longbench-v2`; the length class is a row's `meta.length_class`). kvpress scores a
    choice present anywhere ("The correct answer is (X)" in the answer), kvbench as THUDM's
    `extract_answer` (the first one found); kvpress's prompt is its own (16 new tokens), kvbench's THUDM's
    0shot.txt (128)."""

    name = exports = "longbench-v2"
    data_dir = "0shot"  # create_huggingface_dataset.py's config_name
    classes = ("domain", "sub_domain", "difficulty")  # the meta import keeps, beside the length class
    columns = (
        "_id",
        *classes,
        "length",
        "question",
        "choice_A",
        "choice_B",
        "choice_C",
        "choice_D",
        "answer",
        "max_new_tokens",
        "answer_prefix",
    )
    reads = ("difficulty", "length")  # what its scorer groups by
    schema = dict[str, float]

    def target(self, row):
        if row["task"] not in TASKS:
            return None
        return kvpress.Target(self.name, self.data_dir, self.name, row["length"])

    def cells(self, row):
        meta = row["meta"] or {}
        return {
            **{name: meta.get(name, "") for name in self.classes},
            "length": meta.get("length_class", ""),
            "answer": row["references"][0],
            "_id": row["sample_id"],
        }

    def metrics(self, rows):
        """calculate_metrics: the mean of 0/1 scores, then by difficulty and by length class, sorted."""
        result = {"average": kvpress.mean([row["score"] / 100 for row in rows])}
        for key in ("difficulty", "length_class"):
            groups: dict[str, list[float]] = {}
            for row in rows:
                value = (row["meta"] or {}).get(key)
                if value:
                    groups.setdefault(value, []).append(row["score"] / 100)
            result.update({value: kvpress.mean(groups[value]) for value in sorted(groups)})
        return result

    def check_config(self, config, path):
        if config.data_dir not in (None, "", self.data_dir):
            raise DataFileError(
                f"{path}: field 'data_dir': longbench-v2's is {self.data_dir} (got {config.data_dir!r})"
            )

    def check_metrics(self, metrics, path):
        if "average" not in metrics:
            raise DataFileError(f"{path}: field 'average': missing")

    def task(self, config, line):
        return self.name

    def sample(self, task, line, config, where):
        answer = line["answer"]
        if answer not in ("A", "B", "C", "D"):
            raise DataFileError(f"{where}: field 'answer': not a choice A-D (got {answer!r})")
        meta = {name: line[name] for name in self.classes if line.get(name)}
        if line["length"]:
            meta["length_class"] = line["length"]
        return kvpress.scored(task, [answer], "longbench_v2_accuracy", meta)

    def figures(self, metrics):
        return {"average": 100 * metrics["average"]}

    def label(self, row):
        return "average"


FAMILY = Family(
    "longbench-v2", kinds={task: "longbench-v2" for task in TASKS}, kvpress=(KvpressLongBenchV2(),)
)
