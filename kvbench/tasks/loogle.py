"""LooGLE (bigai-nlco/LooGLE): its four tasks with the authors' prompts and automatic metrics.

Rows: one document each (`input`); the QA and cloze tasks hold its questions in `qa_pairs`, a Python list
literal of {"Q", "A", ...} (read with `ast.literal_eval`), the summary task the answer in `output`. A sample
is one question (kvpress explodes the pairs the same way), in file order; ids are "<row>.<pair>".

Prompts: `config/task2prompt.json`, split where kvpress splits it (context: instruction and document;
question; answer prefix "Answer: ", "Answer:" or "Summarization: "), with the authors' text where kvpress's
copy drops a space (the cloze question's and the summary's); truncated in the middle to `length` tokens as
`Prediction/pred_opensource_models.py` does. Generation lengths: `config/task2maxlen.json`.

Metrics (`Evaluation/automatic_metrics.py`, kvpress's `calculate_metrics` the same):
- QA and summary, `loogle_rouge_l`: ROUGE-L recall of the `rouge` package x 100 (`get_rouge_score`); an
  empty prediction is read as "None" as `automatic_eval.py` does; where the package raises (no sentence
  left, or a sentence too long for its recursion) 0, as kvpress's `try_except_metric` gives. The authors
  also report BLEU-1/4, METEOR and BERTScore; kvbench does not (METEOR needs nltk's WordNet, BERTScore
  roberta-large, neither available offline).
- cloze, `loogle_exact_match`: the share x 100 of the masks whose entity the prediction, read as a dict,
  names exactly (`get_exact_match`). The authors `eval` the prediction; kvbench reads it with
  `ast.literal_eval`, so a prediction that is an expression rather than a literal (`'Bo' + 'b'`) scores 0.
  The official figure pools masks over the task (matches / masks); kvbench averages per question.
"""

import ast
import json
import logging
from dataclasses import dataclass
from pathlib import Path

from kvbench.core.errors import DataFileError, UnknownTask
from kvbench.core.validation import STRICT, check_json
from kvbench.tasks import kvpress
from kvbench.tasks.base import Sample
from kvbench.tasks.family import Family, check_request, published_api
from kvbench.tasks.longbench import fit_prompt
from kvbench.tasks.published import HubFile, checked_rows, find_rows

logger = logging.getLogger(__name__)

HUB_REPO = "bigai-nlco/LooGLE"
MIN_LENGTH = 256
CLOZE_INSTRUCTION = (
    "Please fill in the clozes based on the given long texts below. Each of the placeholder '<mask-n>' in "
    "the question could be an entity of Person, Location or Organiocation. The same masks represent the same "
    "entity. Output a json format answer, for example: {'<mask-0>': 'Bob', '<mask-1>': 'Gorrosion Magazine',"
    "'<mask-2>': 'Bethel Horizon'}\n"
)
QA_INSTRUCTION = "Please answer the question based on the long texts below. \n"
# Task -> (instruction before the document, question template, answer prefix, new tokens, metric).
DATASETS = {
    "shortdep_qa": (QA_INSTRUCTION, "\nQuestion: {Q}\n", "Answer: ", 300, "rouge_l"),
    "longdep_qa": (QA_INSTRUCTION, "\nQuestion: {Q}\n", "Answer: ", 500, "rouge_l"),
    "shortdep_cloze": (
        CLOZE_INSTRUCTION,
        "\n Question: {Q} What are the masked entities? \n",
        "Answer:",
        50,
        "exact_match",
    ),
    "longdep_summarization": (
        "Please generate a summary of the below paper. \n",
        "\n ",
        "Summarization: ",
        500,
        "rouge_l",
    ),
}
SOURCE = f"hub {HUB_REPO} or --data-dir"
METRIC_NAMES = {"rouge_l": "ROUGE-L recall", "exact_match": "exact match"}
TASKS = {
    f"loogle/{name}": f"LooGLE {name}: {METRIC_NAMES[metric]} ({SOURCE})"
    for name, (*_, metric) in DATASETS.items()
}

_ROUGE = []


def rouge_l(prediction: str, sample: Sample) -> float:
    """`get_rouge_score`'s ROUGE-L recall x 100 (0 where the `rouge` package raises)."""
    if not _ROUGE:
        from rouge import Rouge

        _ROUGE.append(Rouge(metrics=["rouge-l"], stats=["r"]))
    try:
        score = _ROUGE[0].get_scores(prediction or "None", sample.references[0])[0]
    except (ValueError, RecursionError):
        return 0.0
    return 100.0 * score["rouge-l"]["r"]


def read_dict(prediction: str) -> dict | None:
    try:
        value = ast.literal_eval(prediction)
    except Exception:  # any text that is not a literal, as the authors' bare `except Exception`
        return None
    return value if isinstance(value, dict) else None


def exact_match(prediction: str, sample: Sample) -> float:
    """`get_exact_match`: the share x 100 of the reference's masks the prediction (a dict) names exactly."""
    reference = json.loads(sample.references[0])
    predicted = read_dict(prediction or "None")
    if predicted is None:
        return 0.0
    matched = sum(1 for key in reference if key in predicted and predicted[key] == reference[key])
    return 100.0 * matched / len(reference)


METRICS = {"loogle_rouge_l": rouge_l, "loogle_exact_match": exact_match}


@dataclass
class LooGLERow:
    """The schema of a LooGLE row; `title` and other fields are not read."""

    __pydantic_config__ = STRICT

    input: str
    qa_pairs: str
    output: str


@dataclass
class QAPair:
    """A question of `qa_pairs` (its evidence `S` and `type` are not read)."""

    __pydantic_config__ = STRICT

    Q: str
    A: str


@dataclass
class ClozePair:
    """A cloze of `qa_pairs`: the masks' entities."""

    __pydantic_config__ = STRICT

    Q: str
    A: dict[str, str]


def parse_task(task: str) -> str:
    if task not in TASKS:
        raise UnknownTask(f"unknown LooGLE task {task!r} (see `kvbench tasks`)")
    return task.split("/", 1)[1]


min_length, reads_data_dir = published_api(MIN_LENGTH)


def local_files(name: str, data_dir: Path | None) -> list[Path]:
    if data_dir is None:
        return []
    return [Path(data_dir) / f"{name}{suffix}" for suffix in (".jsonl", ".parquet")]


def questions(name: str, row: LooGLERow, where: str) -> list[tuple[str, str]]:
    """(question, answer) pairs of a row: its `qa_pairs`, or for the summary the one empty question and
    `output`; answers of the cloze as JSON."""
    if name == "longdep_summarization":
        if row.output.strip().lower() in ("", "none"):
            raise DataFileError(f"{where}: field 'output': no summary")
        return [("", row.output)]
    try:
        pairs = ast.literal_eval(row.qa_pairs)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        pairs = None
    if not isinstance(pairs, list) or not pairs:
        raise DataFileError(f"{where}: field 'qa_pairs': not a Python list of {{'Q': ..., 'A': ...}} pairs")
    schema = ClozePair if name == "shortdep_cloze" else QAPair
    checked = []
    for index, pair in enumerate(pairs):
        place = f"{where}: field 'qa_pairs': pair {index}"
        try:
            text = json.dumps(pair, ensure_ascii=False, default=repr)
        except (TypeError, ValueError) as error:  # a key JSON cannot hold (a tuple)
            raise DataFileError(f"{place}: not a {{'Q': ..., 'A': ...}} pair ({error})") from None
        pair = check_json(schema, text, place, DataFileError)
        if name == "shortdep_cloze" and not pair.A:
            raise DataFileError(f"{where}: field 'qa_pairs': pair {index}: field 'A': no mask")
        checked.append(
            (pair.Q, json.dumps(pair.A, ensure_ascii=False) if isinstance(pair.A, dict) else pair.A)
        )
    return checked


def read_rows(name: str, data_dir: Path | None) -> list[tuple[str, list[tuple[str, str]]]]:
    """(document, its (question, answer) pairs) of each row of `<name>.jsonl`, checked (`LooGLERow`,
    `questions`), from data_dir first, else the hub."""
    rows, source = find_rows(
        local_files(name, data_dir), HubFile(HUB_REPO, f"data/{name}.jsonl"), f"LooGLE data for {name}"
    )
    checked = checked_rows(rows, LooGLERow, source)
    return [(row.input, questions(name, row, f"{source}: row {i}")) for i, row in enumerate(checked)]


def check_data(task: str, data_dir: Path | None) -> None:
    """Read the local file now, so a malformed one fails before any model loads."""
    name = parse_task(task)
    if any(path.is_file() for path in local_files(name, data_dir)):
        read_rows(name, data_dir)


def make_samples(
    task: str, length: int, samples: int, seed: int, tokenizer, data_dir: Path | None
) -> list[Sample]:
    """The first `samples` questions, in file order, prompts truncated in the middle to `length` tokens.
    `seed` plays no part: the set is fixed."""
    name = parse_task(task)
    check_request("LooGLE", length, samples, MIN_LENGTH)
    instruction, template, answer_prefix, new_tokens, metric = DATASETS[name]
    asked = [
        (f"{row}.{index}", document, question, answer)
        for row, (document, pairs) in enumerate(read_rows(name, data_dir))
        for index, (question, answer) in enumerate(pairs)
    ][:samples]
    result, truncated = [], 0
    for sample_id, document, question, answer in asked:
        context, question, cut = fit_prompt(
            instruction + document, template.replace("{Q}", question), length, tokenizer
        )
        truncated += cut
        result.append(
            Sample(
                task=task,
                id=sample_id,
                context=context,
                question=question,
                answer_prefix=answer_prefix,
                references=[answer],
                max_new_tokens=new_tokens,
                metric=f"loogle_{metric}",
            )
        )
    if truncated:
        logger.warning(
            "%s: %d of %d prompts truncated in the middle to %d tokens", task, truncated, len(result), length
        )
    return result


# ---- kvpress's evaluation ----


class KvpressLooGLE(kvpress.Dataset):
    """`loogle` (`benchmarks/loogle/`): metrics.json `{task: {"bleu1", "bleu4", "rouge-1", "rouge-2",
    "rouge-l", "meteor", "bert"}}` (means in [0, 1]), for `shortdep_cloze` `{"exact_match",
    "partial_match"}` (masks matched over masks, a prediction that is not a dict counting one, rounded to
    4); data_dir and `task` the task name; columns `question`, `answer_prefix`, `answer` (a string; the
    cloze's as JSON), `task`, `max_new_tokens`. `loogle/NAME` is `loogle`, data_dir NAME. kvbench has
    ROUGE-L recall and exact match only: an export's metrics.json holds `rouge-l` and `exact_match`."""

    name = "loogle"
    exports = "loogle/NAME"
    columns = ("question", "answer_prefix", "answer", "task", "max_new_tokens")
    reads = ("task",)
    schema = dict[str, dict[str, float]]
    cloze = "shortdep_cloze"

    def target(self, row):
        return self.named_target(row, DATASETS)

    def cells(self, row):
        return {"answer": row["references"][0], "task": row["task"].partition("/")[2]}

    def key(self, name: str) -> str:
        return "exact_match" if name == self.cloze else "rouge-l"

    def metrics(self, rows):
        tasks = kvpress.grouped(rows, self.label)
        result = {}
        for name in sorted(tasks):
            value = (
                pooled_exact_match(tasks[name])
                if name == self.cloze
                else kvpress.mean([r["score"] / 100 for r in tasks[name]])
            )
            result[name] = {self.key(name): value}
        return result

    def check_metrics(self, metrics, path):
        for name, scores in metrics.items():
            if self.key(name) not in scores:
                raise DataFileError(f"{path}: field '{name}.{self.key(name)}': missing")

    def task(self, config, line):
        return f"{self.name}/{line['task']}" if line["task"] in DATASETS else None

    def sample(self, task, line, config, where):
        name = task.partition("/")[2]
        answer = kvpress.text_of(line, self.answer, where)
        if name == self.cloze:
            try:
                masks = json.loads(answer)
            except ValueError:
                masks = None
            if not isinstance(masks, dict) or not masks:
                raise DataFileError(f"{where}: field 'answer': not the cloze's masks as a JSON object")
        return kvpress.scored(task, [answer], f"loogle_{DATASETS[name][4]}")

    def figures(self, metrics):
        return {name: 100 * scores[self.key(name)] for name, scores in metrics.items()}

    def label(self, row):
        return row["task"].partition("/")[2]


def pooled_exact_match(rows: list[dict]) -> float:
    """calculate_metrics' cloze `exact_match`: masks matched over masks, a prediction that is no dict counting
    one mask, rounded to 4; each row's matches from kvbench's score (its share of the masks)."""
    matched = counted = 0
    for row in rows:
        masks = len(json.loads(row["references"][0]))
        if read_dict(row["prediction"] or "None") is None:
            counted += 1
        else:
            matched += round(row["score"] / 100 * masks)
            counted += masks
    return round(matched / counted, 4) if counted else float("nan")


FAMILY = Family("loogle", kinds={task: task.replace("/", "-") for task in TASKS}, kvpress=(KvpressLooGLE(),))
