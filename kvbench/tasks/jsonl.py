"""The user's own data as tasks: a JSONL file, a Parquet file or a local Hugging Face `datasets` folder, each
record one sample (`context`, `question`, `answers`, optional `id`; other field names through `fields`, the
prompt through Jinja templates of the record), scored by a metric of the registry.

A task is a `DataTask`, registered by name (`register_data_task`): from `--data FILE` (named after the
file), from a task YAML (`--include-path DIR`, or the folder of a suite YAML; schema `TaskFile`), or from
the Python API. The records are read and checked (`record_schema`) before any model loads. Contexts longer
than the run's length are cut in the middle, as LongBench cuts its prompts.
"""

import functools
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import annotated_types

from kvbench.core.errors import BadInput, DataFileError
from kvbench.core.registry import first_line
from kvbench.core.templates import render_capped, sandboxed_environment
from kvbench.core.validation import STRICT, check, check_json, jsonl_lines, load_yaml, parse_json
from kvbench.tasks.base import Sample
from kvbench.tasks.family import Family

logger = logging.getLogger(__name__)

MIN_LENGTH = 16  # tokens: the shortest context a run may cut a record's context to
FIELD_NAMES = ("context", "question", "answers", "id")
SUFFIXES = (".jsonl", ".parquet")  # or a folder saved by `datasets.Dataset.save_to_disk`


@dataclass(frozen=True)
class DataTask:
    """A task made of the records of `path`. `fields` maps the sample's fields (context, question,
    answers, id) to the record's keys where they differ; `templates` renders context or question from the
    whole record instead (Jinja, e.g. "{{ title }}\\n{{ body }}"); `split` picks a split of a datasets
    folder that holds several. `source` is the task YAML that defines it (None: `--data` or Python), as
    messages about its name or its templates name it; `metric_digest` that of the file of a user's metric
    (set when it is registered)."""

    name: str
    path: Path
    metric: str = "qa_f1"
    fields: tuple[tuple[str, str], ...] = ()
    templates: tuple[tuple[str, str], ...] = ()
    answer_prefix: str = "Answer:"
    max_new_tokens: int = 32
    split: str | None = None
    description: str = ""
    source: Path | None = None
    metric_digest: str | None = None  # of the user's metric file: the samples' key, so an edit scores anew

    def key(self, name: str) -> str:
        return dict(self.fields).get(name, name)


TASKS: dict[str, str] = {}  # name -> description: the family's view, as every family exposes it
DATA_TASKS: dict[str, DataTask] = {}
METRICS: dict = {}  # the metrics these tasks use are the registry's (kvbench.tasks.METRICS)


def register_data_task(task: DataTask) -> DataTask:
    """Add `task` to the family (replacing a task of its name from the same file and task YAML)."""
    DATA_TASKS[task.name] = task
    TASKS[task.name] = task.description or f"records of {task.path}"
    return task


def min_length(task: str) -> int:
    return MIN_LENGTH


def check_data(task: str, data_dir: Path | None) -> None:
    """Read the task's records now, so a missing or malformed file fails before any model loads."""
    checked_records(DATA_TASKS[task])


def read_records(task: DataTask) -> list[dict]:
    """The records of the task's file or folder, as dicts; DataFileError in one line naming the file (and
    line) when it is missing, unreadable or of another format."""
    path = task.path
    if path.is_dir():
        return read_datasets_folder(path, task.split)
    if not path.is_file():
        raise DataFileError(f"data {str(path)!r}: no such file or folder")
    if task.split is not None:
        raise BadInput(f"data {str(path)!r}: split {task.split!r} applies to a datasets folder, not a file")
    if path.suffix == ".parquet":
        return read_parquet(path)
    if path.suffix != ".jsonl":
        raise DataFileError(f"data {str(path)!r}: give a .jsonl or .parquet file or a datasets folder")
    try:
        lines = jsonl_lines(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise DataFileError(f"{path}: not UTF-8 text") from None
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = parse_json(line)
        except ValueError as error:
            raise DataFileError(f"{path}:{number}: not a JSON line ({first_words(error)})") from None
        if not isinstance(record, dict):
            raise DataFileError(f"{path}:{number}: not a record (a JSON object)")
        records.append(record)
    return records


def first_words(error: Exception) -> str:
    return str(error).splitlines()[0][:80] if str(error) else type(error).__name__


def read_parquet(path: Path) -> list[dict]:
    import pyarrow
    import pyarrow.parquet

    try:
        return pyarrow.parquet.read_table(path).to_pylist()
    except (pyarrow.ArrowException, OSError) as error:
        raise DataFileError(f"{path}: not a Parquet file ({first_words(error)})") from None


def read_datasets_folder(path: Path, split: str | None) -> list[dict]:
    """A folder saved by `datasets` (`save_to_disk`): one dataset, or one split of a DatasetDict (`split`,
    needed when it holds several)."""
    import datasets

    try:
        loaded = datasets.load_from_disk(str(path))
    except (FileNotFoundError, ValueError, OSError) as error:
        raise DataFileError(f"{path}: not a datasets folder ({first_words(error)})") from None
    if isinstance(loaded, datasets.DatasetDict):
        splits = list(loaded)
        if split is None and len(splits) == 1:
            split = str(splits[0])
        if split not in loaded:
            raise BadInput(f"data {str(path)!r}: give a split, one of {', '.join(splits)}")
        loaded = loaded[split]
    elif split is not None:
        raise BadInput(f"data {str(path)!r} holds one dataset: split {split!r} does not apply")
    return loaded.to_list()


def origin(task: DataTask) -> str:
    """What defines `task`, as messages name it: its task YAML, else its data."""
    return str(task.source) if task.source is not None else f"data {str(task.path)!r}"


def templates_origin(task: DataTask) -> str:
    """Where the templates of `task` are written, as messages name it: its task YAML, else the task."""
    return str(task.source) if task.source is not None else f"task {task.name!r}"


def compiled_templates(task: DataTask) -> dict:
    """The task's templates as Jinja templates of the sandbox (`core.templates`: they run no code and are
    capped in size; a name they use that the record lacks is an error), by the field they render;
    DataFileError naming the task's YAML for one that is not Jinja."""
    import jinja2

    environment = sandboxed_environment(undefined=jinja2.StrictUndefined)
    compiled = {}
    for name, template in task.templates:
        try:
            compiled[name] = environment.from_string(template)
        except (jinja2.TemplateError, RecursionError) as error:
            raise DataFileError(
                f"{templates_origin(task)}: template of {name!r} is not Jinja ({first_words(error)})"
            ) from None
    return compiled


def render(task: DataTask, name: str, template, record: dict, number: int) -> str:
    """The task's `template` of field `name` rendered with `record` (record `number` of its data, from 1);
    DataFileError naming the task's YAML and the record when it raises (any exception: Jinja's own, or an
    expression's, `{{ 1/0 }}`) or renders no text."""
    try:
        text = render_capped(template, record)
    except Exception as error:  # a template's expressions may fail in any way, or break the sandbox's caps
        raise DataFileError(
            f"{templates_origin(task)}: template of {name!r} fails on record {number} of {task.path}: "
            + first_line(error)
        ) from None
    if not text.strip():
        raise DataFileError(
            f"{templates_origin(task)}: template of {name!r} renders no text on record {number} of "
            f"{task.path}"
        )
    return text


def checked_records(task: DataTask) -> list[dict]:
    """The task's records as sample fields (context, question, answers as a list, id as text), each checked
    (`record_schema`); DataFileError naming the file and record for the first that does not fit, lacks a
    key `fields` names (the id's too), gives an id twice, or a file without records, and naming the task
    YAML for a template that fails."""
    templates = compiled_templates(task)
    records = read_records(task)
    if not records:
        raise DataFileError(f"{task.path}: holds no records")
    checked, seen = [], {}
    for index, record in enumerate(records):
        where = f"{task.path}: record {index + 1}"
        values = {name: record[task.key(name)] for name in FIELD_NAMES if task.key(name) in record}
        for name, template in templates.items():
            values[name] = render(task, name, template, record, index + 1)
        for name in ("context", "question", "answers", *dict(task.fields)):  # an id named by `fields` too
            if name not in values:
                raise DataFileError(f"{where}: no {task.key(name)!r} field")
        data = check(record_schema(), values, where, DataFileError)
        for name in ("context", "question"):
            if not getattr(data, name).strip():
                raise DataFileError(f"{where}: {task.key(name)!r} holds no text")
        answers = [data.answers] if isinstance(data.answers, str) else list(data.answers)
        if not answers:
            raise DataFileError(f"{where}: {task.key('answers')!r} holds no reference answer")
        if not all(answer.strip() for answer in answers):
            raise DataFileError(f"{where}: {task.key('answers')!r} holds an empty reference answer")
        sample_id = str(data.id) if data.id is not None else str(index)
        if sample_id in seen:
            raise DataFileError(f"{where}: id {sample_id!r} is also the id of record {seen[sample_id]}")
        seen[sample_id] = index + 1
        checked.append(
            {"id": sample_id, "context": data.context, "question": data.question, "answers": answers}
        )
    return checked


@functools.cache
def record_schema():
    """One record's schema, after `fields` renamed its keys: context and question as text (or rendered by
    templates), the reference answers as a list of text (one text is one answer), an optional id (text or
    whole number, unique in the file); other keys are not read. `checked_records` also refuses a context or
    question that holds no text (only spaces), and an empty reference answer, which no prediction matches.
    A closed-book question without a context is refused too: a press compresses the context, so with none
    every press scores alike and the row measures nothing."""
    import pydantic

    return pydantic.create_model(
        "DataRecordSchema",
        __config__=pydantic.ConfigDict(**STRICT),
        answers=(str | list[str], ...),
        context=(str, ...),
        question=(str, ...),
        id=(str | int | None, None),
    )


def make_samples(
    task: str, length: int, samples: int, seed: int, tokenizer, data_dir: Path | None
) -> list[Sample]:
    """The first `samples` records of the task, in file order (`seed` plays no part: the data is fixed; fewer
    records than asked for are said in a warning), each context cut in the middle so that context and
    question fit in `length` tokens."""
    from kvbench.tasks.longbench import truncate_middle

    spec = DATA_TASKS[task]
    result, truncated = [], 0
    records = checked_records(spec)
    if samples > len(records):
        logger.warning(
            "%s: %d samples asked for, %s holds %d records", task, samples, spec.path, len(records)
        )
    for record in records[:samples]:
        context, question = record["context"], record["question"]
        room = max(length - len(tokenizer(question)["input_ids"]), MIN_LENGTH)
        cut = truncate_middle(context, room, tokenizer)
        if cut is not None:
            context, truncated = cut[0] + cut[1], truncated + 1
        result.append(
            Sample(
                task=task,
                id=record["id"],
                context=context,
                question=question,
                answer_prefix=spec.answer_prefix,
                references=record["answers"],
                max_new_tokens=spec.max_new_tokens,
                metric=spec.metric,
                # rows record what scored them, and are keyed by the user's metric file
                meta={
                    "metric": spec.metric,
                    **({"metric_digest": spec.metric_digest} if spec.metric_digest else {}),
                },
            )
        )
    if truncated:
        logger.warning(
            "%s: %d of %d contexts cut in the middle to fit %d tokens", task, truncated, len(result), length
        )
    return result


@dataclass
class TaskFile:
    """The schema of a task YAML: `task` (its name), `data` (a .jsonl or .parquet file or a datasets
    folder, relative to the YAML), and optionally `metric` (a registry name or `module:function`), `fields`
    ({context: ..., question: ..., answers: ..., id: ...}: the record's keys), `templates` (Jinja for
    context or question), `answer_prefix`, `max_new_tokens`, `split`, `description`. Unknown keys are
    refused (a typo would otherwise be ignored)."""

    __pydantic_config__ = {**STRICT, "extra": "forbid"}

    task: Annotated[str, annotated_types.MinLen(1)]
    data: Annotated[str, annotated_types.MinLen(1)]
    metric: str = "qa_f1"
    fields: dict[str, str] = field(default_factory=dict)
    templates: dict[str, str] = field(default_factory=dict)
    answer_prefix: str = "Answer:"
    max_new_tokens: Annotated[int, annotated_types.Interval(ge=1, le=4096)] = 32
    split: str | None = None
    description: str = ""


def read_task_file(path: Path) -> DataTask:
    """The DataTask a task YAML defines (`TaskFile`); DataFileError in one line naming the file."""
    path = Path(path).resolve()
    spec = json.dumps(
        load_yaml(path, DataFileError), default=str
    )  # strict JSON mode: objects fill dataclasses
    parsed = check_json(TaskFile, spec, f"{path}: not a task file", DataFileError)
    unknown = sorted(set(parsed.fields) - set(FIELD_NAMES))
    if unknown:
        raise DataFileError(
            f"{path}: fields maps context, question, answers or id to a record's key, not {unknown[0]!r}"
        )
    unknown = sorted(set(parsed.templates) - {"context", "question"})
    if unknown:
        raise DataFileError(f"{path}: templates render context or question only, not {unknown[0]!r}")
    task = DataTask(
        name=parsed.task,
        path=(path.parent / parsed.data).resolve(),
        metric=parsed.metric,
        fields=tuple(sorted(parsed.fields.items())),
        templates=tuple(sorted(parsed.templates.items())),
        answer_prefix=parsed.answer_prefix,
        max_new_tokens=parsed.max_new_tokens,
        split=parsed.split,
        description=parsed.description,
        source=path,
    )
    compiled_templates(task)  # a template that is not Jinja fails with its file, before any record is read
    return task


def data_task(path: Path | str, metric: str = "qa_f1") -> DataTask:
    """The task of `--data PATH`: its records as they are, named after the file (`mine.jsonl`: mine)."""
    path = Path(path)
    if not path.exists():
        raise BadInput(f"--data {str(path)!r}: no such file or folder")
    name = path.stem if path.is_file() else path.name
    return DataTask(name=name, path=path.resolve(), metric=metric)


FAMILY = Family("jsonl", kinds={})  # the user's own data: in no training mixture
