"""LongBench v1 (16 English datasets) and LongBench-E, as THUDM/LongBench `pred.py` and `eval.py` run them.

Per dataset: the official prompt template and generation length, the prompt truncated in the middle to
`length` tokens (half kept from the start, half from the end), no chat template and first-line answers
for the few-shot and code datasets, and the official metric, best over the references.

For the query-agnostic protocol each prompt is split into `context` (instructions and document, up to
where the question part starts, as kvpress splits LongBench) and `question` (the rest, including any
trailing "Answer:"), so `context + question` is exactly the official prompt and `answer_prefix` is empty.

Data: the official JSONL files, from `data_dir/<dataset>.jsonl` (`<dataset>_e.jsonl` for LongBench-E;
the `data/` folder of the release's data.zip), else the hub's THUDM/LongBench data.zip. The hub's loading
script no longer runs with `datasets` >= 4, so we read that zip directly.
"""

import logging
import math
import socket
import zipfile
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Annotated
from urllib.parse import urlparse

import annotated_types

from kvbench.core.errors import DataFileError, UnknownTask
from kvbench.core.validation import STRICT, Count, check_json, parse_json
from kvbench.tasks import kvpress
from kvbench.tasks.base import Sample, TaskUnavailable
from kvbench.tasks.family import Family, check_request, published_api
from kvbench.tasks.longbench_metrics import (
    classification_score,
    code_sim_score,
    count_score,
    qa_f1_score,
    retrieval_score,
    rouge_score,
)

logger = logging.getLogger(__name__)

HUB_REPO = "THUDM/LongBench"
HUB_FILE = "data.zip"
MIN_LENGTH = 256


@dataclass(frozen=True)
class Dataset:
    """One LongBench dataset: where its prompt's question part starts, its official generation length
    (config/dataset2maxlen.json), metric (eval.py) and category (the LongBench paper's table)."""

    question_start: str
    max_new_tokens: int
    metric: str
    category: str


SINGLE_DOC, MULTI_DOC, SUMMARIZATION = "Single-Doc QA", "Multi-Doc QA", "Summarization"
FEW_SHOT, SYNTHETIC, CODE = "Few-shot Learning", "Synthetic", "Code"
CATEGORIES = [SINGLE_DOC, MULTI_DOC, SUMMARIZATION, FEW_SHOT, SYNTHETIC, CODE]

# THUDM/LongBench config/dataset2prompt.json, verbatim (typos included).
PROMPTS = {
    "narrativeqa": (
        "You are given a story, which can be either a novel or a movie script, and a question. "
        "Answer the question asconcisely as you can, using a single phrase if possible. Do not "
        "provide any explanation.\n\nStory: {context}\n\nNow, answer the question based on the story "
        "asconcisely as you can, using a single phrase if possible. Do not provide any "
        "explanation.\n\nQuestion: {input}\n\nAnswer:"
    ),
    "qasper": (
        "You are given a scientific article and a question. Answer the question as concisely as "
        "you can, using a single phrase or sentence if possible. If the question cannot be "
        'answered based on the information in the article, write "unanswerable". If the question '
        'is a yes/no question, answer "yes", "no", or "unanswerable". Do not provide any '
        "explanation.\n\nArticle: {context}\n\n Answer the question based on the above article as "
        "concisely as you can, using a single phrase or sentence if possible. If the question "
        'cannot be answered based on the information in the article, write "unanswerable". If '
        'the question is a yes/no question, answer "yes", "no", or "unanswerable". Do not '
        "provide any explanation.\n\nQuestion: {input}\n\nAnswer:"
    ),
    "multifieldqa_en": (
        "Read the following text and answer briefly.\n\n{context}\n\nNow, answer the following "
        "question based on the above text, only give me the answer and do not output any other "
        "words.\n\nQuestion: {input}\nAnswer:"
    ),
    "hotpotqa": (
        "Answer the question based on the given passages. Only give me the answer and do not "
        "output any other words.\n\nThe following are given passages.\n{context}\n\nAnswer the "
        "question based on the given passages. Only give me the answer and do not output any "
        "other words.\n\nQuestion: {input}\nAnswer:"
    ),
    "2wikimqa": (
        "Answer the question based on the given passages. Only give me the answer and do not "
        "output any other words.\n\nThe following are given passages.\n{context}\n\nAnswer the "
        "question based on the given passages. Only give me the answer and do not output any "
        "other words.\n\nQuestion: {input}\nAnswer:"
    ),
    "musique": (
        "Answer the question based on the given passages. Only give me the answer and do not "
        "output any other words.\n\nThe following are given passages.\n{context}\n\nAnswer the "
        "question based on the given passages. Only give me the answer and do not output any "
        "other words.\n\nQuestion: {input}\nAnswer:"
    ),
    "gov_report": (
        "You are given a report by a government agency. Write a one-page summary of the report.\n\n"
        "Report:\n{context}\n\nNow, write a one-page summary of the report.\n\nSummary:"
    ),
    "qmsum": (
        "You are given a meeting transcript and a query containing a question or instruction. "
        "Answer the query in one or more sentences.\n\nTranscript:\n{context}\n\nNow, answer the "
        "query based on the above meeting transcript in one or more sentences.\n\nQuery: {input}\n"
        "Answer:"
    ),
    "multi_news": (
        "You are given several news passages. Write a one-page summary of all news. \n\nNews:\n"
        "{context}\n\nNow, write a one-page summary of all the news.\n\nSummary:"
    ),
    "trec": (
        "Please determine the type of the question below. Here are some examples of questions.\n\n"
        "{context}\n{input}"
    ),
    "triviaqa": (
        "Answer the question based on the given passage. Only give me the answer and do not "
        "output any other words. The following are some examples.\n\n{context}\n\n{input}"
    ),
    "samsum": (
        "Summarize the dialogue into a few short sentences. The following are some examples.\n\n"
        "{context}\n\n{input}"
    ),
    "passage_count": (
        "There are some paragraphs below sourced from Wikipedia. Some of them may be duplicates. "
        "Please carefully read these paragraphs and determine how many unique paragraphs there "
        "are after removing duplicates. In other words, how many non-repeating paragraphs are "
        "there in total?\n\n{context}\n\nPlease enter the final count of unique paragraphs after "
        "removing duplicates. The output format should only contain the number, such as 1, 2, 3, "
        "and so on.\n\nThe final answer is: "
    ),
    "passage_retrieval_en": (
        "Here are 30 paragraphs from Wikipedia, along with an abstract. Please determine which "
        "paragraph the abstract is from.\n\n{context}\n\nThe following is an abstract.\n\n{input}\n\n"
        "Please enter the number of the paragraph that the abstract is from. The answer format "
        'must be like "Paragraph 1", "Paragraph 2", etc.\n\nThe answer is: '
    ),
    "lcc": "Please complete the code given below. \n{context}Next line of code:\n",
    "repobench-p": "Please complete the code given below. \n{context}{input}Next line of code:\n",
}

# The question part starts at the question with its label, else at the input, else (prompts without an
# input) at the closing instruction; kvpress splits LongBench at the same places.
DATASETS = {
    "narrativeqa": Dataset("Question: {input}", 128, "qa_f1", SINGLE_DOC),
    "qasper": Dataset("Question: {input}", 128, "qa_f1", SINGLE_DOC),
    "multifieldqa_en": Dataset("Question: {input}", 64, "qa_f1", SINGLE_DOC),
    "hotpotqa": Dataset("Question: {input}", 32, "qa_f1", MULTI_DOC),
    "2wikimqa": Dataset("Question: {input}", 32, "qa_f1", MULTI_DOC),
    "musique": Dataset("Question: {input}", 32, "qa_f1", MULTI_DOC),
    "gov_report": Dataset("Now, write a one-page summary of the report.", 512, "rouge", SUMMARIZATION),
    "qmsum": Dataset("Query: {input}", 512, "rouge", SUMMARIZATION),
    "multi_news": Dataset("Now, write a one-page summary of all the news.", 512, "rouge", SUMMARIZATION),
    "trec": Dataset("{input}", 64, "classification", FEW_SHOT),
    "triviaqa": Dataset("{input}", 32, "qa_f1", FEW_SHOT),
    "samsum": Dataset("{input}", 128, "rouge", FEW_SHOT),
    "passage_count": Dataset("Please enter the final count", 32, "count", SYNTHETIC),
    "passage_retrieval_en": Dataset("{input}", 32, "retrieval", SYNTHETIC),
    "lcc": Dataset("Next line of code:", 64, "code_sim", CODE),
    "repobench-p": Dataset("{input}", 64, "code_sim", CODE),
}
# pred.py: LongBench-E has every dataset but these three; and these go without the chat template.
E_DATASETS = [name for name in DATASETS if name not in {"narrativeqa", "musique", "qmsum"}]
NO_CHAT_TEMPLATE = {"trec", "triviaqa", "samsum", "lcc", "repobench-p"}
# eval.py: scored on the first line of the prediction only.
FIRST_LINE = {"trec", "triviaqa", "samsum"}

TASKS = {
    **{f"longbench/{name}": f"LongBench {d.category}: {name}" for name, d in DATASETS.items()},
    **{f"longbench-e/{name}": f"LongBench-E {DATASETS[name].category}: {name}" for name in E_DATASETS},
}
E_BUCKETS = ["0-4k", "4-8k", "8k+"]


def first_line(prediction: str) -> str:
    return prediction.lstrip("\n").split("\n")[0]


def best_over_references(score, prediction: str, sample: Sample) -> float:
    """As official `eval.py`: first-line cut where the dataset asks for it, max over references, x100."""
    if sample.first_line:
        prediction = first_line(prediction)
    return 100.0 * max((score(prediction, reference) for reference in sample.references), default=0.0)


def classification(prediction: str, sample: Sample) -> float:
    score = partial(classification_score, all_classes=sample.meta["all_classes"])
    return best_over_references(score, prediction, sample)


METRICS = {
    "qa_f1": partial(best_over_references, qa_f1_score),
    "rouge": partial(best_over_references, rouge_score),
    "classification": classification,
    "retrieval": partial(best_over_references, retrieval_score),
    "count": partial(best_over_references, count_score),
    "code_sim": partial(best_over_references, code_sim_score),
}


min_length, reads_data_dir = published_api(MIN_LENGTH)


def check_data(task: str, data_dir: Path | None) -> None:
    """Read the local file now, so a malformed one fails before any model loads."""
    if data_dir is not None:
        read_rows(parse_task(task)[1], data_dir)


def parse_task(task: str) -> tuple[str, str]:
    """("longbench-e/qasper") -> ("qasper", "qasper_e"): the dataset and the official file stem."""
    if task not in TASKS:
        raise UnknownTask(f"unknown LongBench task {task!r} (see `kvbench tasks`)")
    family, dataset = task.split("/")
    return dataset, f"{dataset}_e" if family == "longbench-e" else dataset


def hub_is_reachable(timeout_s: float = 3.0) -> bool:
    """A quick TCP check, so an unreachable hub fails in seconds instead of retrying for half a minute."""
    from huggingface_hub import constants  # imported when used: it takes a second, `kvbench --help` none

    url = urlparse(constants.ENDPOINT)
    try:
        socket.create_connection((url.hostname, url.port or 443), timeout=timeout_s).close()
    except OSError:
        return False
    return True


def hub_data_zip() -> Path | None:
    """The official data.zip from the local hub cache or, when reachable, downloaded into it."""
    from huggingface_hub import hf_hub_download, is_offline_mode, try_to_load_from_cache

    cached = try_to_load_from_cache(HUB_REPO, HUB_FILE, repo_type="dataset")
    if isinstance(cached, str):
        return Path(cached)
    if is_offline_mode() or not hub_is_reachable():
        return None
    try:
        return Path(hf_hub_download(HUB_REPO, HUB_FILE, repo_type="dataset"))
    except OSError:  # huggingface_hub's HTTP and not-found errors are OSErrors
        return None


FIELDS = ("input", "context", "answers", "length")  # what every official row holds and we read


@dataclass
class LongBenchRow:
    """The schema of a row of an official LongBench JSONL (THUDM/LongBench data.zip): the fields read, each
    of its type (a string `answers` would be scored letter by letter; no answer at all, scored 0 whatever
    the prediction, as the user's JSONL refuses it); others are not read."""

    __pydantic_config__ = STRICT

    input: str
    context: str
    answers: Annotated[list[str], annotated_types.MinLen(1)]
    length: Count  # words (LongBench-E's buckets)
    _id: str | None = None
    all_classes: list[str] | None = None


def read_jsonl(lines, source: str) -> list[dict]:
    """The rows of an official JSONL file; a malformed line, a row missing a field or with a field of the
    wrong type (`LongBenchRow`), an id given twice, or a file with no row is one error naming `source` (and
    the line)."""
    rows, lines_of = [], {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = parse_json(line)
        except ValueError as error:
            raise DataFileError(f"{source}:{number}: not a JSON line ({error})") from None
        if not isinstance(row, dict):
            raise DataFileError(f"{source}:{number}: not a LongBench row (a JSON object)")
        missing = [name for name in FIELDS if name not in row]
        if missing:
            raise DataFileError(f"{source}:{number}: LongBench row lacks {', '.join(missing)}")
        check_json(LongBenchRow, line, f"{source}:{number}", DataFileError)
        if row.get("_id") and row["_id"] in lines_of:
            first = lines_of[row["_id"]]
            raise DataFileError(f"{source}:{number}: id {row['_id']!r} is also the id of line {first}")
        lines_of[row.get("_id")] = number  # rows without an id take their index
        rows.append(row)
    if not rows:
        raise DataFileError(f"{source}: holds no LongBench rows")
    return rows


def read_rows(stem: str, data_dir: Path | None) -> list[dict]:
    """The official rows of `<stem>.jsonl`: from data_dir first, else from the hub's data.zip."""
    looked_at = []
    if data_dir is not None:
        path = Path(data_dir) / f"{stem}.jsonl"
        if path.is_file():
            with path.open(encoding="utf-8", errors="replace") as lines:
                return read_jsonl(lines, str(path))
        looked_at.append(str(path))
    archive = hub_data_zip()
    if archive is not None:
        with zipfile.ZipFile(archive) as data_zip, data_zip.open(f"data/{stem}.jsonl") as member:
            return read_jsonl((line.decode("utf-8") for line in member), f"{archive}:data/{stem}.jsonl")
    looked_at.append(f"hub dataset {HUB_REPO} ({HUB_FILE}: offline, unreachable or not cached)")
    raise TaskUnavailable(f"LongBench data for {stem} not found; looked at: {'; '.join(looked_at)}")


def truncate_middle(prompt: str, length: int, tokenizer) -> tuple[str, str] | None:
    """Official truncation: when the tokenized prompt exceeds `length`, keep its first and last
    `length // 2` tokens. Returns the decoded (head, tail), or None when the prompt fits."""
    ids = tokenizer(prompt)["input_ids"]
    if len(ids) <= length:
        return None
    half = length // 2
    head = tokenizer.decode(ids[:half], skip_special_tokens=True)
    tail = tokenizer.decode(ids[-half:], skip_special_tokens=True)
    return head, tail


def prompt_templates(name: str) -> tuple[str, str]:
    """The official prompt template of dataset `name`, cut where its question part starts."""
    prompt = PROMPTS[name]
    start = prompt.index(DATASETS[name].question_start)
    return prompt[:start], prompt[start:]


def official_length(context: int) -> int:
    """THUDM's pred.py truncates every prompt to one `max_length` per model (config/model2maxlen.json):
    3500 tokens for its 4k models, 7500 for 8k, 15500 for 16k, 31500 for 32k; that is the context in whole
    thousands minus 500, room for the longest generation (512 tokens). The same rule for any model."""
    return context // 1000 * 1000 - 500


def split_prompt(row: dict, name: str, length: int, tokenizer) -> tuple[str, str, bool]:
    """(context, question, truncated): context + question is the official prompt after middle truncation."""
    context_template, question_template = prompt_templates(name)
    context = context_template.format(context=row["context"])
    return fit_prompt(context, question_template.format(input=row["input"]), length, tokenizer)


def fit_prompt(context: str, question: str, length: int, tokenizer) -> tuple[str, str, bool]:
    """(context, question, cut): `context + question` truncated in the middle to `length` tokens as the
    authors' pred.py files do (first and last halves of the tokens kept); the question part stays whole
    unless it alone is longer than the kept tail (a tiny `length`: all kept from the end is the question)."""
    truncated = truncate_middle(context + question, length, tokenizer)
    if truncated is None:
        return context, question, False
    head, tail = truncated
    if tail.endswith(question):
        return head + tail[: len(tail) - len(question)], question, True
    return head, tail, True


def make_samples(
    task: str, length: int, samples: int, seed: int, tokenizer, data_dir: Path | None
) -> list[Sample]:
    """The first `samples` rows of the dataset, prompts truncated in the middle to `length` tokens.

    `seed` plays no part: LongBench is a fixed set, and ids come from the rows themselves.
    """
    check_request("LongBench", length, samples, MIN_LENGTH)
    name, stem = parse_task(task)
    dataset = DATASETS[name]
    result, truncated = [], 0
    for index, row in enumerate(read_rows(stem, data_dir)[:samples]):
        context, question, cut = split_prompt(row, name, length, tokenizer)
        truncated += cut
        result.append(
            Sample(
                task=task,
                id=row.get("_id") or str(index),
                context=context,
                question=question,
                answer_prefix="",
                references=list(row["answers"]),
                max_new_tokens=dataset.max_new_tokens,
                metric=dataset.metric,
                chat_template=name not in NO_CHAT_TEMPLATE,
                first_line=name in FIRST_LINE,
                meta={"dataset": name, "length": row["length"], "all_classes": row.get("all_classes") or []},
            )
        )
    if truncated:
        logger.warning(
            "%s: %d of %d prompts truncated in the middle to %d tokens", task, truncated, len(result), length
        )
    return result


def dataset_of(task: str) -> str:
    return parse_task(task)[0]


def longbench_average(task_scores: dict[str, float]) -> dict[str, float]:
    """Mean score per category and overall ("Average": plain mean over datasets, not over categories),
    for `task_scores` {task: mean score} of LongBench (or of LongBench-E) tasks. Only the categories
    that have scores appear."""
    datasets = [dataset_of(task) for task in task_scores]
    if len(set(datasets)) != len(datasets):
        raise ValueError("longbench_average: a dataset appears twice (mixing longbench and longbench-e?)")
    by_category: dict[str, list[float]] = {}
    for dataset, score in zip(datasets, task_scores.values(), strict=True):
        by_category.setdefault(DATASETS[dataset].category, []).append(score)
    averages = {category: mean(by_category[category]) for category in CATEGORIES if category in by_category}
    averages["Average"] = mean(list(task_scores.values()))
    return averages


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def length_bucket(words: int) -> str:
    """LongBench-E buckets on the row's `length` field (words), as official `scorer_e`."""
    return E_BUCKETS[0] if words < 4000 else E_BUCKETS[1] if words < 8000 else E_BUCKETS[2]


def longbench_e_buckets(rows):
    """Mean score per length bucket of the LongBench-E rows in `rows` (result rows with a `meta` column
    holding each sample's meta). Index: model, press, ratio (those present) and task; one column per
    bucket, NaN where a bucket has no sample."""
    rows = rows[rows["task"].str.startswith("longbench-e/")]
    buckets = rows["meta"].map(lambda meta: length_bucket(meta["length"]))
    keys = [key for key in ("model", "press", "ratio") if key in rows] + ["task"]
    table = rows.assign(bucket=buckets).pivot_table(
        index=keys, columns="bucket", values="score", aggfunc="mean"
    )
    return table.reindex(columns=E_BUCKETS)


# ---- kvpress's evaluation ----


class KvpressLongBench(kvpress.Dataset):
    """`longbench`, `longbench-e` (`benchmarks/longbench/`): for `longbench` metrics.json is one number
    (the dataset's official metric, mean x 100 rounded to 2); for `longbench-e`, `{"0-4k": .., "4-8k": ..,
    "8k+": ..}` by the row's `length` (NaN for an empty bucket); one `data_dir` per LongBench dataset
    (`narrativeqa`; LongBench-E's `qasper_e`), columns `question`, `answers`, `all_classes`, `length`,
    `_id`, `answer_prefix`, `task`, `max_new_tokens`. `longbench/NAME` is `longbench`, data_dir NAME;
    `longbench-e/NAME` is `longbench-e`, data_dir `NAME_e`; the kvbench length is `max_context_length`.
    With `e`, `longbench-e`."""

    columns = (
        "question",
        "answers",
        "length",
        "dataset",
        "all_classes",
        "_id",
        "answer_prefix",
        "task",
        "max_new_tokens",
    )
    answer = "answers"
    reads = ("task", "length")

    def __init__(self, e: bool):
        self.e = e
        self.name = "longbench-e" if e else "longbench"
        self.exports = f"{self.name}/NAME"
        self.names = E_DATASETS if e else list(DATASETS)
        self.schema = dict[str, float | None] if e else float

    def target(self, row):
        family, _, name = row["task"].partition("/")
        if family != self.name or name not in self.names:
            return None
        return kvpress.Target(self.name, f"{name}_e" if self.e else name, name, row["length"])

    def cells(self, row):
        meta = row["meta"] or {}
        name = row["task"].partition("/")[2]
        classes = meta.get("all_classes") or []
        return {
            **super().cells(row),
            "length": meta.get("length", ""),
            "dataset": name,
            "all_classes": kvpress.list_cell(classes) if classes else "",
            "_id": row["sample_id"],
            "task": name,
        }

    def metrics(self, rows):
        if not self.e:
            return kvpress.mean2([row["score"] for row in rows])
        buckets = kvpress.grouped(rows, self.label)
        return {
            bucket: kvpress.mean2([row["score"] for row in buckets.get(bucket, [])]) for bucket in E_BUCKETS
        }

    def task(self, config, line):
        return f"{self.name}/{line['task']}" if line["task"] in self.names else None

    def sample(self, task, line, config, where):
        name = task.partition("/")[2]
        dataset = DATASETS[name]
        meta = {
            "all_classes": kvpress.parse_list_cell(line.get("all_classes") or ""),
            "length": kvpress.whole(line["length"], "length", where),
        }
        return kvpress.scored(
            task,
            kvpress.references_of(line, self.answer, where),
            dataset.metric,
            meta,
            first_line=name in FIRST_LINE,
        )

    def figures(self, metrics):
        if not self.e:
            return {"score": metrics}
        return {bucket: value for bucket, value in metrics.items() if value is None or not math.isnan(value)}

    def label(self, row):
        return length_bucket(row["meta"]["length"]) if self.e else "score"


FAMILY = Family(
    "longbench",
    kinds={task: f"longbench-{parse_task(task)[0]}" for task in TASKS},
    kvpress=(KvpressLongBench(e=False), KvpressLongBench(e=True)),
)
