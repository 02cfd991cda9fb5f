"""InfiniteBench (xinrongzhang2022/InfiniteBench): its 12 tasks as OpenBMB/InfiniteBench asks and scores them.

Prompts: `src/prompt.py`'s `yarn_mistral_templates`, the templates its scripts use for every open model
(yarn-mistral, Yi-200k, ChatGLM3), filled as `src/eval_utils.py`'s `create_prompt` fills them (code_run's
function call found in the input, math_find's "What is <the target> in the following list?" prefix, the
four options of the choice tasks), truncated in the middle to `length` tokens as its `truncate_by_tokens`
does. The context part ends where the row's context ends; the question part is the rest of the template.
Generation lengths: eval_utils.py's `DATA_NAME_TO_MAX_NEW_TOKENS`. Scores: `src/compute_scores.py`'s
per-task scorers (`infinitebench_metrics`) on `get_answer`'s label, x100.

Data: `--data-dir/<task>.jsonl` (the hub's own files, as scripts/download_dataset.sh saves them), else the
hub's file.
"""

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path

from kvbench.core.errors import DataFileError, UnknownTask
from kvbench.core.validation import STRICT
from kvbench.tasks import kvpress
from kvbench.tasks.base import Sample
from kvbench.tasks.family import Family, check_request, published_api
from kvbench.tasks.infinitebench_metrics import SCORERS
from kvbench.tasks.longbench import fit_prompt
from kvbench.tasks.published import HubFile, checked_rows, find_rows

logger = logging.getLogger(__name__)

HUB_REPO = "xinrongzhang2022/InfiniteBench"
MIN_LENGTH = 256
CONTEXT = "\x00context\x00"  # where the row's context goes, to split the filled template there

# OpenBMB/InfiniteBench src/prompt.py yarn_mistral_templates, verbatim.
TEMPLATES = {
    "passkey": "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. I will quiz you about the important information.\n\n{context}\n\n{input}\n\nThe pass key is",  # noqa: E501
    "number_string": "There is an important info hidden inside a lot of irrelevant text. Find it. I will quiz you about the important information there.\n\n{context}\n\n{input}\n\nThe sequence of digits is",  # noqa: E501
    "kv_retrieval": "Extract the value corresponding to the specified key in the JSON object below.\n\n{context}\n\n{input}",  # noqa: E501
    "longbook_sum_eng": "Summarize the book below.\n\n{context}\n\nSummary:",
    "longbook_choice_eng": "Read the book and answer the question.\n\n{context}\n\nQuestion: {question}\nA. {OPTION_A}\nB. {OPTION_B}\nC. {OPTION_C}\nD. {OPTION_D}\n\nThe letter of the correct answer is",  # noqa: E501
    "longbook_qa_eng": "Read the book and answer the question. Be very concise in your answer.\n\n{context}\n\nQuestion: {question}\nAnswer:",  # noqa: E501
    "longbook_qa_chn": "阅读以下书籍然后回答问题。\n\n{context}\n\n问题：{question}\n答案：",
    "math_find": "{prefix}\n\n{context}\n\n{input}",
    "math_calc": "Let us calculate the intermediate values of an expression.\n\nExpression: 1 + 3 + 4\nValues: [1, 4, 8]\n\nExpression: 8 - 3 + 2 - 4\nValues: [8, 5, 7, 3]\n\nExpression: {context}\nValues:",  # noqa: E501
    "code_run": "There is a function called {func} in the following Python code.\n\n{context}\n\nPlease compute the exact value of {func_call}. The value of {func_call} is",  # noqa: E501
    "code_debug": "Following is a Python code where exactly one of the functions/methods has a deliberate error that makes it crash.\n\n{context}\n\nOptions:\nA. {OPTION_A}\nB. {OPTION_B}\nC. {OPTION_C}\nD. {OPTION_D}\n\nThe correct option is:",  # noqa: E501
    "longdialogue_qa_eng": 'Below is a dialogue script where one random occurrence of a character name is replaced with "$$MASK$$", and you should try to guess who that character is.\n\n{context}\n\nThe name that has been replaced with $$MASK$$ is likely',  # noqa: E501
}
# eval_utils.py DATA_NAME_TO_MAX_NEW_TOKENS.
MAX_NEW_TOKENS = {
    "passkey": 6,
    "number_string": 12,
    "kv_retrieval": 50,
    "longbook_sum_eng": 1200,
    "longbook_choice_eng": 40,
    "longbook_qa_eng": 40,
    "longbook_qa_chn": 40,
    "longdialogue_qa_eng": 40,
    "math_find": 3,
    "math_calc": 30000,
    "code_run": 5,
    "code_debug": 5,
}
CHOICE_TASKS = ("longbook_choice_eng", "code_debug")
SOURCE = f"hub {HUB_REPO} or --data-dir"
TASKS = {f"infinitebench/{name}": f"InfiniteBench {name} ({SOURCE})" for name in TEMPLATES}


@dataclass(frozen=True)
class Metric:
    """compute_scores.py's scorer of one task, x100, on the label `make_samples` keeps in `meta["label"]`."""

    task: str

    def __call__(self, prediction: str, sample: Sample) -> float:
        return 100.0 * SCORERS[self.task](prediction, sample.meta["label"])


METRICS = {f"infinitebench_{name}": Metric(name) for name in SCORERS}


@dataclass
class InfiniteBenchRow:
    """The schema of an InfiniteBench row (the hub's JSONL): the fields create_prompt and get_answer read.
    `answer` is a list of strings, or of numbers for math and code_run (math_calc: the values in order)."""

    __pydantic_config__ = STRICT

    id: int
    context: str
    input: str
    answer: list[str] | list[int] | list[float] | list[list[int]]
    options: list[str]


def parse_task(task: str) -> str:
    if task not in TASKS:
        raise UnknownTask(f"unknown InfiniteBench task {task!r} (see `kvbench tasks`)")
    return task.split("/", 1)[1]


min_length, reads_data_dir = published_api(MIN_LENGTH)


def local_files(name: str, data_dir: Path | None) -> list[Path]:
    return [] if data_dir is None else [Path(data_dir) / f"{name}.jsonl"]


def check_row(name: str, row: dict, where: str) -> None:
    """What a task needs beyond the schema: four options and an answer among them for the choice tasks, a
    function call in code_run's input, "The ... of" in math_find's, numbers where the scorer compares them."""
    answer = row["answer"]
    if not answer:
        raise DataFileError(f"{where}: field 'answer': empty")
    if name in CHOICE_TASKS and (len(row["options"]) != 4 or answer[0] not in row["options"]):
        raise DataFileError(f"{where}: field 'options': four options, one of them the answer, expected")
    if name == "code_run" and not re.findall(r"func_[0-9]+\(\-?[0-9]+\)", row["input"]):
        raise DataFileError(f"{where}: field 'input': no function call func_N(x) in it")
    if name == "math_find" and not re.findall(r"The .+ of", row["input"]):
        raise DataFileError(f"{where}: field 'input': no 'The ... of' target in it")
    numeric = name in ("math_find", "math_calc", "code_run")
    if numeric == isinstance(answer[0], str):
        kind = "numbers" if numeric else "strings"
        raise DataFileError(f"{where}: field 'answer': {kind} expected for {name} (got {answer[0]!r})")


def read_rows(name: str, data_dir: Path | None) -> list[dict]:
    """The rows of `<name>.jsonl`, each checked (`InfiniteBenchRow`, `check_row`, ids unique), from data_dir
    first, else the hub."""
    rows, source = find_rows(
        local_files(name, data_dir), HubFile(HUB_REPO, f"{name}.jsonl"), f"InfiniteBench data for {name}"
    )
    checked_rows(rows, InfiniteBenchRow, source, id_field="id")
    for index, row in enumerate(rows):
        check_row(name, row, f"{source}: row {index}")
    return rows


def check_data(task: str, data_dir: Path | None) -> None:
    """Read the local file now, so a malformed one fails before any model loads."""
    name = parse_task(task)
    if any(path.is_file() for path in local_files(name, data_dir)):
        read_rows(name, data_dir)


def fields(name: str, row: dict) -> dict:
    """create_prompt's values for the template of `name`, the context left as a marker."""
    values = {"context": CONTEXT, "input": row["input"], "question": row["input"]}
    options = row["options"]
    if name in CHOICE_TASKS:
        values.update({f"OPTION_{letter}": options[i] for i, letter in enumerate("ABCD")})
    if name == "code_run":
        call = re.findall(r"func_[0-9]+\(\-?[0-9]+\)", row["input"])[0]
        values.update(func=call.split("(")[0], func_call=call)
    if name == "math_find":
        target = re.findall(r"The .+ of", row["input"])[0].lower()[:-3]
        values["prefix"] = f"What is {target} in the following list?"
    return values


def prompt(name: str, row: dict) -> tuple[str, str]:
    """(context, question): create_prompt's prompt, cut where the row's context ends."""
    head, tail = TEMPLATES[name].format(**fields(name, row)).split(CONTEXT)
    return head + row["context"], tail


def label(name: str, row: dict):
    """get_answer's label: [option text, letter] for the choice tasks, else the row's answer."""
    if name in CHOICE_TASKS:
        return [row["answer"][0], "ABCD"[row["options"].index(row["answer"][0])]]
    return row["answer"]


def make_samples(
    task: str, length: int, samples: int, seed: int, tokenizer, data_dir: Path | None
) -> list[Sample]:
    """The first `samples` rows, prompts truncated in the middle to `length` tokens. `seed` plays no part:
    the set is fixed; ids are the rows' `id`."""
    name = parse_task(task)
    check_request("InfiniteBench", length, samples, MIN_LENGTH)
    result, truncated = [], 0
    for row in read_rows(name, data_dir)[:samples]:
        context, question, cut = fit_prompt(*prompt(name, row), length, tokenizer)
        truncated += cut
        answer = label(name, row)
        result.append(
            Sample(
                task=task,
                id=str(row["id"]),
                context=context,
                question=question,
                answer_prefix="",
                references=[
                    json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else value
                    for value in answer
                ],
                max_new_tokens=MAX_NEW_TOKENS[name],
                metric=f"infinitebench_{name}",
                meta={"label": answer},
            )
        )
    if truncated:
        logger.warning(
            "%s: %d of %d prompts truncated in the middle to %d tokens", task, truncated, len(result), length
        )
    return result


# ---- kvpress's evaluation ----


class KvpressInfiniteBench(kvpress.Dataset):
    """`infinitebench` (`benchmarks/infinite_bench/`): metrics.json is one number, the mean score in [0,
    1]; data_dir and `task` the task name; columns `question`, `answer_prefix`, `answer` (strings), `task`,
    `max_new_tokens`. `infinitebench/NAME` is `infinitebench`, data_dir NAME. kvpress's prompts are its own
    (answer prefixes, 20 more new tokens), kvbench's OpenBMB's; its choice answers are the letter alone
    where OpenBMB's `get_answer` (and kvbench's export) gives [option, letter]: on import the option is
    read from the question's "X. option" line, and code_debug, whose scorer needs the function's name, is
    refused without it. kvpress's scorer copy raises on longbook_sum_eng, code_debug, math_find and
    math_calc (its labels are strings, or a letter alone) and scores code_run 0 (a string label against an
    int): its folders of those have no config.yaml, or a published score kvbench does not give back (a
    warning)."""

    name = "infinitebench"
    exports = "infinitebench/NAME"
    columns = ("question", "answer_prefix", "answer", "task", "max_new_tokens")
    reads = ("task",)
    numeric = ("math_find", "math_calc", "code_run")  # labels that are numbers (strings in kvpress's CSV)

    def target(self, row):
        return self.named_target(row, TEMPLATES)

    def cells(self, row):
        return {**super().cells(row), "task": row["task"].partition("/")[2]}

    def metrics(self, rows):
        return kvpress.mean([row["score"] / 100 for row in rows])

    def task(self, config, line):
        return f"{self.name}/{line['task']}" if line["task"] in TEMPLATES else None

    def sample(self, task, line, config, where):
        name = task.partition("/")[2]
        label: list = kvpress.references_of(line, self.answer, where)
        if name in self.numeric:
            try:
                label = [json.loads(value) for value in label]
            except ValueError:
                label = []
            if not label or any(isinstance(value, (str, bool, dict)) or value is None for value in label):
                raise DataFileError(f"{where}: field 'answer': not numbers (got {line['answer']!r})")
        elif name in CHOICE_TASKS and len(label) == 1:
            label = self.choice_label(name, label[0], line.get("question") or "", where)
        references = [value if isinstance(value, str) else json.dumps(value) for value in label]
        return kvpress.scored(task, references, f"infinitebench_{name}", {"label": label})

    def choice_label(self, name: str, letter: str, question: str, where: str) -> list[str]:
        """[option, letter], as get_answer gives, from kvpress's letter and the question's "X. option" line;
        longbook_choice_eng without that line: [letter] (what kvpress scores it on)."""
        found = re.search(rf"^{re.escape(letter)}\. (.*)$", question, re.MULTILINE)
        if found:
            return [found.group(1).strip(), letter]
        if name == "code_debug":
            raise DataFileError(
                f"{where}: field 'question': no option {letter!r} in it (code_debug's scorer needs the "
                "function's name, which kvpress's answer leaves out)"
            )
        return [letter]

    def figures(self, metrics):
        return {"score": 100 * metrics}

    def label(self, row):
        return "score"


FAMILY = Family(
    "infinitebench",
    kinds={task: f"infinitebench-{task.split('/')[1]}" for task in TASKS},
    kvpress=(KvpressInfiniteBench(),),
)
