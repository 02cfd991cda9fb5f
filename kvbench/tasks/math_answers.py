"""AIME 2025 (math-ai/aime25, 30 problems) and MATH-500 (HuggingFaceH4/MATH-500): problems solved at length,
the boxed answer scored by its mathematical equivalence to the row's answer.

Prompt: kvpress's (its aime25 and math500 datasets, its AIME notebook): the context is one space, the question
is the problem as written, no answer prefix, with the chat template; nothing asks for a box, a reasoning model
boxes its final answer by itself. Answers: kvpress's budgets, 32000 new tokens for AIME25 and 4096 for
MATH-500. These tasks are for a GPU reasoning model under the decode-time protocol (the context is one space:
there is nothing to compress before decoding); the embedded SmolLM2-135M cannot solve them. `length` plays no
part: the problem is asked whole.

Metric `math_equivalence`: 100 when the prediction's last `\\boxed{...}` (`last_boxed`) is equivalent to the
row's answer under HF's math-verify, what lighteval and open-r1 score these sets with: each is parsed as the
content of a `\\boxed{}` with `LatexExtractionConfig(boxed_match_priority=0)` (how math-verify's own MATH-500
task parses its gold answers) and compared by `verify(gold, answer)`; no closed box, 0. kvpress's own
calculate_metrics compare the text between "boxed{" and the next "}" to the answer as a string, which can
never match a nested answer such as `\\frac{14}{3}`, nor "070" with 70.

Data: `--data-dir` holding the hub's file (`aime25/test.jsonl`, `MATH-500/test.jsonl`) or the same rows as
`aime25.jsonl`/`.json`/`.parquet`, `math500.jsonl`/`.json`/`.parquet`; else the hub's file. A row whose answer
math-verify extracts nothing from (neither math nor its text fallback: lighteval's "no gold targets found") is
refused with the file, the row and the answer.
"""

import threading
from dataclasses import dataclass
from pathlib import Path

from kvbench.core.errors import BadInput, DataFileError, UnknownTask
from kvbench.core.validation import STRICT
from kvbench.tasks import kvpress
from kvbench.tasks.base import Sample
from kvbench.tasks.family import Family, published_api
from kvbench.tasks.published import SUFFIXES, HubFile, checked_rows, find_rows

MIN_LENGTH = 1  # the problem is asked whole, whatever the length
CONTEXT = " "  # kvpress's context for these sets


@dataclass
class AimeRow:
    """The schema of a math-ai/aime25 row (test.jsonl); other fields are not read."""

    __pydantic_config__ = STRICT

    id: str | int
    problem: str
    answer: str | int


@dataclass
class Math500Row:
    """The schema of a HuggingFaceH4/MATH-500 row (test.jsonl); other fields are not read."""

    __pydantic_config__ = STRICT

    problem: str
    solution: str
    answer: str
    subject: str
    level: int
    unique_id: str


@dataclass(frozen=True)
class MathSet:
    hub: HubFile
    folder: str  # the hub repository's name: where its file lies in --data-dir
    stem: str  # the same rows as <stem>.jsonl/.json/.parquet in --data-dir
    schema: type
    id_field: str
    max_new_tokens: int  # kvpress's dataset's


SETS = {
    "aime25": MathSet(HubFile("math-ai/aime25", "test.jsonl"), "aime25", "aime25", AimeRow, "id", 32000),
    "math500": MathSet(
        HubFile("HuggingFaceH4/MATH-500", "test.jsonl"), "MATH-500", "math500", Math500Row, "unique_id", 4096
    ),
}
TASKS = {
    "aime25": f"AIME 2025, 30 problems, boxed answer by math-verify; a GPU model's task, 32000 new tokens "
    f"(hub {SETS['aime25'].hub.repo} or --data-dir)",
    "math500": f"MATH-500, boxed answer by math-verify; a GPU model's task, 4096 new tokens "
    f"(hub {SETS['math500'].hub.repo} or --data-dir)",
}


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{` of `text`, up to the `}` that closes it (braces counted as
    characters, escaped ones too, as the MATH authors' `last_boxed_only_string` counts them); None when there
    is no `\\boxed{` or the last one is never closed (a generation cut short)."""
    begin = text.rfind("\\boxed{")
    if begin < 0:
        return None
    begin += len("\\boxed{")
    depth = 0
    for index in range(begin, len(text)):
        if text[index] == "{":
            depth += 1
        elif text[index] == "}":
            if depth == 0:
                return text[begin:index]
            depth -= 1
    return None


def alarm_seconds() -> int | None:
    """math-verify's time limit per parse or comparison: 5 s (its default) on the main thread, where its
    SIGALRM works; none elsewhere, where math-verify would refuse to run with one."""
    return 5 if threading.current_thread() is threading.main_thread() else None


def parsed(answer: str) -> list:
    """`answer` as math-verify parses the content of a `\\boxed{}`: a list of a SymPy object and the text, or
    empty when it is not math it can read."""
    from math_verify import LatexExtractionConfig, parse

    return parse(
        f"\\boxed{{{answer}}}",
        [LatexExtractionConfig(boxed_match_priority=0)],
        parsing_timeout=alarm_seconds(),
    )


def equivalence(prediction: str, sample: Sample) -> float:
    """100 if the prediction's last boxed answer is equivalent to the reference under math-verify's
    `verify(gold, answer)`, else 0 (no closed `\\boxed{}`: 0)."""
    from math_verify import verify

    answer = last_boxed(prediction)
    if answer is None:
        return 0.0
    return 100.0 * verify(parsed(sample.references[0]), parsed(answer), timeout_seconds=alarm_seconds())


METRICS = {"math_equivalence": equivalence}


min_length, reads_data_dir = published_api(MIN_LENGTH)


def sized_by_tokenizer(task: str) -> bool:
    return False  # each problem is asked whole: no tokenizer fills or cuts it


def parse_task(task: str) -> MathSet:
    if task not in TASKS:
        raise UnknownTask(f"unknown math task {task!r} (see `kvbench tasks`)")
    return SETS[task]


def local_files(spec: MathSet, data_dir: Path | None) -> list[Path]:
    if data_dir is None:
        return []
    folder = Path(data_dir)
    return [folder / spec.folder / spec.hub.filename, *(folder / f"{spec.stem}{s}" for s in SUFFIXES)]


def read_rows(task: str, data_dir: Path | None) -> list:
    """Every row of the task's set, checked (its schema, ids unique, an answer math-verify parses), from
    data_dir first, else the hub."""
    spec = parse_task(task)
    rows, source = find_rows(local_files(spec, data_dir), spec.hub, f"{task} data")
    checked = checked_rows(rows, spec.schema, source, id_field=spec.id_field)
    for index, row in enumerate(checked):
        if not parsed(str(row.answer)):
            answer = str(row.answer)
            raise DataFileError(
                f"{source}: row {index}: field 'answer': {answer!r} is not math math-verify reads"
            )
    return checked


def check_data(task: str, data_dir: Path | None) -> None:
    """Read the local file now, so a malformed one fails before any model loads."""
    if any(path.is_file() for path in local_files(parse_task(task), data_dir)):
        read_rows(task, data_dir)


def make_samples(
    task: str, length: int, samples: int, seed: int, tokenizer, data_dir: Path | None
) -> list[Sample]:
    """The first `samples` problems, each asked whole (`length` and `seed` play no part: the set is fixed);
    ids are the rows' `id` (AIME25) or `unique_id` (MATH-500)."""
    spec = parse_task(task)
    if samples < 1:
        raise BadInput(f"samples must be at least 1, got {samples}")
    return [
        Sample(
            task=task,
            id=str(getattr(row, spec.id_field)),
            context=CONTEXT,
            question=row.problem,
            answer_prefix="",
            references=[str(row.answer)],
            max_new_tokens=spec.max_new_tokens,
            metric="math_equivalence",
            meta={"subject": row.subject, "level": row.level} if isinstance(row, Math500Row) else {},
        )
        for row in read_rows(task, data_dir)[:samples]
    ]


# ---- kvpress's evaluation ----


class KvpressMath(kvpress.Dataset):
    """`aime25`, `math500` (`benchmarks/aime25/`, `benchmarks/math500/`; datasets alessiodevoto/aime25 and
    alessiodevoto/math500, no creation script): metrics.json `{"correct", "answered", "accuracy",
    "total"}`, the text after "boxed{" (AIME25: the last, MATH-500: the first) up to the next "}" equal to
    `answer`; no data_dir; columns the ones evaluate.py and the scorer read, `question`, `answer_prefix`,
    `answer`, `max_new_tokens`. kvbench scores these tasks with math-verify (`math_equivalence`), not that
    string match: rows keep kvbench's score; an export's metrics.json is kvpress's string match of its
    predictions, and an import's check compares the published accuracy with that same string match.

    `last`: kvpress's AIME25 scorer reads the last "boxed{", its MATH-500 one the first."""

    columns = ("question", "answer_prefix", "answer", "max_new_tokens")

    def __init__(self, name: str, last: bool):
        self.name = self.exports = name
        self.last = last
        self.schema = dict[str, float]

    def target(self, row):
        return kvpress.Target(self.name, "", self.name, row["length"]) if row["task"] == self.name else None

    def cells(self, row):
        return {"answer": row["references"][0]}

    def boxed(self, prediction: str) -> str | None:
        """extract_boxed: the text after "boxed{" (the last, or the first) up to the next "}"."""
        parts = prediction.split("boxed{")
        if not self.last and len(parts) < 2:
            return None
        return parts[-1 if self.last else 1].split("}")[0]

    def metrics(self, rows):
        """calculate_metrics, kvpress's string match (not kvbench's math-verify score)."""
        correct = sum(self.boxed(row["prediction"] or "") == row["references"][0] for row in rows)
        answered = sum("boxed{" in (row["prediction"] or "") for row in rows)
        return {"correct": correct, "answered": answered, "accuracy": correct / len(rows), "total": len(rows)}

    def check_metrics(self, metrics, path):
        if "accuracy" not in metrics:
            raise DataFileError(f"{path}: field 'accuracy': missing")

    def task(self, config, line):
        return self.name

    def sample(self, task, line, config, where):
        return kvpress.scored(task, [kvpress.text_of(line, self.answer, where)], "math_equivalence")

    def sample_id(self, task, line, index, config):
        return line.get("id") or line.get("unique_id") or f"{task}-{index}"

    def figures(self, metrics):
        return {"accuracy": 100 * metrics["accuracy"]}

    def label(self, row):
        return "accuracy"


FAMILY = Family(
    "math",
    kinds={task: f"math-{task}" for task in TASKS},
    kvpress=(KvpressMath("aime25", last=True), KvpressMath("math500", last=False)),
)
