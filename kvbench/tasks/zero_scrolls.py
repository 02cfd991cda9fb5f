"""ZeroSCROLLS (tau/zero_scrolls): its 10 tasks with the authors' prompts and official metrics.

Split: `validation`, the only one with public answers (about 20 inputs a task). kvpress's evaluation reads
the `test` split, whose answers are private (scored only by the leaderboard, so its `calculate_metrics`
returns nothing): kvbench asks the validation inputs the way kvpress asks the test ones, and scores them.

Prompts: each row's `input` is the authors' whole prompt (instruction, document, query, answer cue). Split as
kvpress splits it: the context is `input[:document_end_index]`, the question `input[document_end_index:
query_end_index]`, the answer prefix `input[query_end_index:]` stripped. A prompt longer than `length` tokens
is cut as the authors' runners cut it: the first tokens of `input[:query_start_index]` that leave room for
`truncation_seperator + input[query_start_index:query_end_index]`, which then follows (the separator ends
the context; the question is the query alone). Generation lengths: the authors' (kvpress's MAX_NEW_TOKENS).
Metrics: `zero_scrolls_metrics` (ROUGE geometric mean, F1, accuracy, exp-similarity, concordance index).

Data: `--data-dir/<task>/validation.jsonl` or `.parquet` (the hub's `<task>.zip` unpacked), or the zip
itself as `--data-dir/<task>.zip`; else the hub's zip.
"""

import logging
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from kvbench.core.errors import DataFileError, TaskUnavailable, UnknownTask
from kvbench.core.validation import STRICT
from kvbench.tasks.base import Sample
from kvbench.tasks.family import Family, check_request, published_api
from kvbench.tasks.published import HubFile, checked_rows, read_json_lines, read_objects
from kvbench.tasks.zero_scrolls_metrics import SCORERS, find_letter, summary_ids

logger = logging.getLogger(__name__)

HUB_REPO = "tau/zero_scrolls"
SPLIT = "validation"
MIN_LENGTH = 256
# Task -> (official metric, new tokens): the authors' dataset_to_leave_tokens_for_generations.
DATASETS = {
    "gov_report": ("rouge", 1024),
    "summ_screen_fd": ("rouge", 512),
    "qmsum": ("rouge", 512),
    "squality": ("rouge", 512),
    "qasper": ("f1", 128),
    "narrative_qa": ("f1", 64),
    "musique": ("f1", 32),
    "quality": ("accuracy", 10),
    "space_digest": ("exp_similarity", 36),
    "book_sum_sort": ("concordance_index", 256),
}
SOURCE = f"hub {HUB_REPO} or --data-dir"
METRIC_NAMES = {
    "rouge": "ROUGE-1/2/L geometric mean",
    "f1": "token F1",
    "accuracy": "accuracy",
    "exp_similarity": "exp-similarity",
    "concordance_index": "concordance index",
}
TASKS = {
    f"zero_scrolls/{name}": f"ZeroSCROLLS {name}: validation split, {METRIC_NAMES[metric]} ({SOURCE})"
    for name, (metric, _) in DATASETS.items()
}


@dataclass(frozen=True)
class Metric:
    """An official ZeroSCROLLS metric on the sample's references (scores in [0, 100])."""

    name: str

    def __call__(self, prediction: str, sample: Sample) -> float:
        return SCORERS[self.name](prediction, list(sample.references))


METRICS = {f"zero_scrolls_{name}": Metric(name) for name in SCORERS}


@dataclass
class ZeroScrollsRow:
    """The schema of a ZeroSCROLLS row (the fields the authors' runners and kvpress read); `output` is the
    answer, null in the test split. Other fields (`pid`, `document_start_index`) are not read."""

    __pydantic_config__ = STRICT

    id: str
    input: str
    output: str | None
    document_end_index: int
    query_start_index: int
    query_end_index: int
    truncation_seperator: str


def parse_task(task: str) -> str:
    if task not in TASKS:
        raise UnknownTask(f"unknown ZeroSCROLLS task {task!r} (see `kvbench tasks`)")
    return task.split("/", 1)[1]


min_length, reads_data_dir = published_api(MIN_LENGTH)


def local_files(name: str, data_dir: Path | None) -> list[Path]:
    if data_dir is None:
        return []
    folder = Path(data_dir)
    return [folder / name / f"{SPLIT}.jsonl", folder / name / f"{SPLIT}.parquet", folder / f"{name}.zip"]


def read_zip(path: Path, where: str) -> list[dict]:
    """The rows of the zip's one `validation.jsonl`."""
    try:
        with zipfile.ZipFile(path) as archive:
            members = [m for m in archive.namelist() if PurePosixPath(m).name == f"{SPLIT}.jsonl"]
            if len(members) != 1:
                raise DataFileError(f"{where}: holds {len(members)} {SPLIT}.jsonl files, one expected")
            text = archive.read(members[0]).decode("utf-8")
    except (zipfile.BadZipFile, OSError) as error:
        raise DataFileError(f"{where}: not a zip file ({error})") from None
    except UnicodeDecodeError:
        raise DataFileError(f"{where}: {members[0]} is not UTF-8 text") from None
    rows = read_json_lines(text, f"{where}:{members[0]}")
    for index, row in enumerate(rows):
        if not isinstance(row, dict):
            raise DataFileError(f"{where}: row {index}: not a JSON object")
    return rows


def find_rows(name: str, data_dir: Path | None) -> tuple[list[dict], str]:
    """(rows, source): the first local file there is, else the hub's zip; TaskUnavailable in one line."""
    for path in local_files(name, data_dir):
        if path.is_file():
            return (read_zip(path, str(path)) if path.suffix == ".zip" else read_objects(path)), str(path)
    hub = HubFile(HUB_REPO, f"{name}.zip")
    path = hub.local()
    if path is not None:
        return read_zip(path, f"{HUB_REPO}:{hub.filename}"), f"{HUB_REPO}:{hub.filename}"
    looked_at = [str(path) for path in local_files(name, data_dir)]
    looked_at.append(f"hub dataset {HUB_REPO} ({hub.filename}: offline, unreachable or not cached)")
    raise TaskUnavailable(f"ZeroSCROLLS data for {name} not found; looked at: {'; '.join(looked_at)}")


def check_row(name: str, row: ZeroScrollsRow, where: str) -> None:
    """What the prompt and metric need beyond the schema: indices in order within the input, an answer,
    a letter A-D in quality's, a permutation of 1..n (n >= 2) in book_sum_sort's."""
    if not 0 <= row.document_end_index <= row.query_start_index <= row.query_end_index <= len(row.input):
        raise DataFileError(
            f"{where}: fields 'document_end_index', 'query_start_index', 'query_end_index': "
            f"0 <= document end <= query start <= query end <= len(input) expected"
        )
    if row.output is None or not row.output.strip():
        raise DataFileError(f"{where}: field 'output': no answer (the test split has none: give {SPLIT})")
    if DATASETS[name][0] == "accuracy" and find_letter(row.output) is None:
        raise DataFileError(f"{where}: field 'output': no letter A-D in {row.output[:40]!r}")
    if DATASETS[name][0] == "concordance_index":
        ids = summary_ids(row.output)
        if len(ids) < 2 or sorted(ids) != list(range(1, len(ids) + 1)):
            raise DataFileError(f"{where}: field 'output': summary IDs 1..n in some order (n >= 2) expected")


def read_rows(name: str, data_dir: Path | None) -> list[tuple[ZeroScrollsRow, list[str]]]:
    """Each distinct input once, with the outputs of every row of its id (`drop_duplicates_in_input`), from
    data_dir first, else the hub; every row checked (`ZeroScrollsRow`, `check_row`)."""
    rows, source = find_rows(name, data_dir)
    grouped: dict[str, tuple[ZeroScrollsRow, list[str], int]] = {}
    for index, row in enumerate(checked_rows(rows, ZeroScrollsRow, source)):
        where = f"{source}: row {index}"
        check_row(name, row, where)
        if row.id in grouped and grouped[row.id][0].input != row.input:
            raise DataFileError(
                f"{where}: id {row.id!r} is that of row {grouped[row.id][2]} with another input"
            )
        grouped.setdefault(row.id, (row, [], index))[1].append(row.output)
    return [(row, outputs) for row, outputs, _ in grouped.values()]


def check_data(task: str, data_dir: Path | None) -> None:
    """Read the local file now, so a malformed one fails before any model loads."""
    name = parse_task(task)
    if any(path.is_file() for path in local_files(name, data_dir)):
        read_rows(name, data_dir)


def count(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def prompt(row: ZeroScrollsRow, length: int, tokenizer) -> tuple[str, str, str, bool]:
    """(context, question, answer prefix, cut): kvpress's split of the row's input, cut as the authors cut
    prompts longer than `length` tokens (context + question)."""
    text = row.input
    context, question = text[: row.document_end_index], text[row.document_end_index : row.query_end_index]
    answer_prefix = text[row.query_end_index :].strip()
    if len(count(tokenizer, context + question)) <= length:
        return context, question, answer_prefix, False
    question = text[row.query_start_index : row.query_end_index]
    room = max(length - len(count(tokenizer, row.truncation_seperator + question)), 0)
    head = tokenizer.decode(count(tokenizer, text[: row.query_start_index])[:room], skip_special_tokens=True)
    return head + row.truncation_seperator, question, answer_prefix, True


def make_samples(
    task: str, length: int, samples: int, seed: int, tokenizer, data_dir: Path | None
) -> list[Sample]:
    """The first `samples` distinct inputs of the validation split, cut to `length` tokens. `seed` plays
    no part: the set is fixed; ids are the rows' `id`."""
    name = parse_task(task)
    check_request("ZeroSCROLLS", length, samples, MIN_LENGTH)
    metric, new_tokens = DATASETS[name]
    result, truncated = [], 0
    for row, outputs in read_rows(name, data_dir)[:samples]:
        context, question, answer_prefix, cut = prompt(row, length, tokenizer)
        truncated += cut
        result.append(
            Sample(
                task=task,
                id=row.id,
                context=context,
                question=question,
                answer_prefix=answer_prefix,
                references=outputs,
                max_new_tokens=new_tokens,
                metric=f"zero_scrolls_{metric}",
            )
        )
    if truncated:
        logger.warning("%s: %d of %d prompts cut to %d tokens", task, truncated, len(result), length)
    return result


# kvpress's `zero_scrolls` (`benchmarks/zero_scrolls/`) reads the test split: refused both ways.
FAMILY = Family(
    "zero_scrolls",
    kinds={task: task.replace("/", "-") for task in TASKS},
    not_kvpress=(
        "kvpress's zero_scrolls is ZeroSCROLLS's test split, whose answers are private (its metrics.json is "
        "{}); kvbench's zero_scrolls tasks score the validation split"
    ),
)
