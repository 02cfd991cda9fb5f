"""InfiniteBench: the authors' prompts (OpenBMB/InfiniteBench src/prompt.py, eval_utils.py), their rows
read from the hub's JSONL, bad files refused in one line, and compute_scores.py's scorers against
references written here from its definitions."""

import json
import random
import re
import string
from collections import Counter

import pytest
from click.testing import CliRunner

from kvbench.cli import main
from kvbench.core.errors import DataFileError
from kvbench.tasks import infinitebench as ib
from kvbench.tasks import list_tasks, score_sample
from kvbench.tasks.base import Sample, TaskUnavailable
from kvbench.tasks.infinitebench_metrics import SCORERS
from kvbench.tasks.published import HubFile


@pytest.fixture(autouse=True)
def no_hub(monkeypatch):
    monkeypatch.setattr(HubFile, "local", lambda self: None)


@pytest.fixture
def tokenizer(embedded_tokenizer):
    return embedded_tokenizer


def write(folder, name, rows):
    (folder / f"{name}.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


PASSKEY = {
    "id": 0,
    "context": "Grass is green. The pass key is 71432. Remember it.",
    "input": "What is the pass key?",
    "answer": ["71432"],
    "options": [],
}  # noqa: E501
CHOICE = {
    "id": 3,
    "context": "Book text.",
    "input": "Who walks?",
    "answer": ["Georgie"],
    "options": ["Ann", "Georgie", "Bob", "Eve"],
}  # noqa: E501
CODE_RUN = {
    "id": 1,
    "context": "def func_1(x):\n    return x + 1",
    "input": "Please give me the exact number of the return value of func_1(3). ",
    "answer": [4],
    "options": [],
}  # noqa: E501
MATH_FIND = {
    "id": 2,
    "context": "[3, 9, 1]",
    "input": "What is the largest number in the list above?",
    "answer": [9],
    "options": [],
}  # noqa: E501


def test_loads_rows_with_the_authors_prompts(tmp_path, tokenizer):
    write(tmp_path, "passkey", [PASSKEY])
    write(tmp_path, "longbook_choice_eng", [CHOICE])
    write(tmp_path, "code_run", [CODE_RUN])
    write(tmp_path, "math_find", [{**MATH_FIND, "input": "The largest number of the list is?"}])
    [p] = ib.make_samples("infinitebench/passkey", 4000, 5, 0, tokenizer, tmp_path)
    assert p.context + p.question == ib.TEMPLATES["passkey"].format(
        context=PASSKEY["context"], input=PASSKEY["input"]
    )
    assert p.question.startswith("\n\nWhat is the pass key?") and (p.max_new_tokens, p.id) == (6, "0")
    [c] = ib.make_samples("infinitebench/longbook_choice_eng", 4000, 5, 0, tokenizer, tmp_path)
    assert c.meta["label"] == ["Georgie", "B"] and "B. Georgie" in c.question
    assert score_sample(c, "B") == 100.0 and score_sample(c, "A") == 0.0
    [r] = ib.make_samples("infinitebench/code_run", 4000, 5, 0, tokenizer, tmp_path)
    assert r.context.startswith("There is a function called func_1 in")
    assert r.question.endswith("The value of func_1(3) is") and score_sample(r, "so it is 4") == 100.0
    [m] = ib.make_samples("infinitebench/math_find", 4000, 5, 0, tokenizer, tmp_path)
    assert m.context.startswith("What is the largest number in the following list?\n\n[3, 9, 1]")


@pytest.mark.parametrize(
    ("name", "rows", "field"),
    [
        ("passkey", [{k: v for k, v in PASSKEY.items() if k != "answer"}], "field 'answer"),
        ("passkey", [{**PASSKEY, "answer": "71432"}], "field 'answer"),
        ("passkey", [{**PASSKEY, "answer": [71432]}], "field 'answer"),
        ("code_run", [{**CODE_RUN, "input": "no call"}], "'input'"),
        ("longbook_choice_eng", [{**CHOICE, "answer": ["Zed"]}], "'options'"),
        ("passkey", [PASSKEY, PASSKEY], "id"),
        ("passkey", [{"_id": "x", "question": "q", "choice_A": "a"}], "field"),  # a LongBench-v2 row
    ],
)
def test_malformed_rows_are_refused_in_one_line(name, rows, field, tmp_path, tokenizer):
    write(tmp_path, name, rows)
    with pytest.raises(DataFileError) as error:
        ib.make_samples(f"infinitebench/{name}", 4000, 5, 0, tokenizer, tmp_path)
    assert "\n" not in str(error.value) and f"{name}.jsonl" in str(error.value) and field in str(error.value)


def test_the_cli_refuses_a_bad_file_and_writes_nothing(tmp_path):
    write(tmp_path, "passkey", [{**PASSKEY, "answer": "71432"}])
    out = tmp_path / "out"
    args = ["run", "--press", "knorm", "--ratio", "0.5", "--task", "infinitebench/passkey", "--samples", "1"]
    result = CliRunner().invoke(main, [*args, "--data-dir", str(tmp_path), "--out", str(out)])
    assert result.exit_code == 2 and "passkey.jsonl: row 0: field 'answer" in result.output
    assert len(result.output.strip().splitlines()) == 1 and not out.exists()


def test_without_data_and_hub_the_task_says_so_in_one_line(tmp_path, tokenizer):
    with pytest.raises(TaskUnavailable) as error:
        ib.make_samples("infinitebench/kv_retrieval", 4000, 1, 0, tokenizer, tmp_path)
    assert "\n" not in str(error.value) and "xinrongzhang2022/InfiniteBench" in str(error.value)


def test_kvbench_tasks_lists_the_12_tasks_with_their_source():
    listed = [t for t in list_tasks() if t.family == "infinitebench"]
    assert len(listed) == 12 and all("hub xinrongzhang2022/InfiniteBench" in t.description for t in listed)


# References from compute_scores.py's definitions, written with regular expressions and sets.
def ref_words(text, junk):
    return re.sub("[" + re.escape(junk) + "]", " ", text).split()


def ref_first_int(text):
    found = re.search("[0-9]+", text)
    return found.group(0) if found else ""


def ref_norm(text):
    text = "".join(c for c in text.lower() if c not in string.punctuation)
    return re.sub(r"\b(a|an|the)\b", " ", text).split()


def ref_norm_zh(text):
    punct = set(string.punctuation) | set(
        "！？｡。＂＃＄％＆＇（）＊＋，－／：；＜＝＞＠［＼］＾＿｀｛｜｝～｟｠｢｣､、〃》「」『』【】〔〕〖〗〘〙〚〛〜〝〞〟〰〾〿–—‘’‛“”„‟…‧﹏."
    )
    return [c for c in text.lower() if c not in punct and not c.isspace()]


def ref_f1(a, b):
    same = sum((Counter(a) & Counter(b)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(a), same / len(b)
    return 2 * precision * recall / (precision + recall)


def ref_squash(text, junk):
    for j in junk:
        text = text.replace(j, " ")
    return re.sub(" {2,}", " ", text)


def ref_after_prefix(text, prefixes, starts):
    for prefix in prefixes:
        if prefix in text:
            rest = text[text.index(prefix) + len(prefix) + 1 :]
            return float(
                len(text) >= text.index(prefix) + len(prefix) + 1 and any(rest.startswith(s) for s in starts)
            )
    return None


def ref_choice(pred, label):
    pred = pred.strip()
    if not pred:
        return 0.0
    if pred[0] in "ABCD" or pred in label:
        return float(pred[0] in label or pred in label) if pred[0] not in "ABCD" else float(pred[0] in label)
    pred = ref_squash(pred, "\n\"'.,?!{}")
    found = ref_after_prefix(pred, ["answer is:", "answer:", "answer is", "option is"], label)
    if found is not None:
        return found
    word = next((w for w in pred.split() if w in "ABCD"), None)
    return 0.0 if word is None else float(word in label)


def ref_debug(pred, label):
    pred = pred.strip()
    if pred[:2] in (label[1] + ".", label[1] + ":"):
        return 1.0
    pred = ref_squash(pred, ["\n", "`", "'", '"', "-", "*", "Option", "option"])
    found = ref_after_prefix(
        pred, ["answer is:", "is:", "answer:", "correct option is:"], [label[1], label[0]]
    )
    return 0.0 if found is None else found


def ref_math_find(pred, label):
    found = re.search(r"\d+\.\d+|\d+", pred)
    if found is None:
        return 0.0
    if isinstance(label[0], int):
        return float(re.fullmatch("[0-9]+", found.group(0)) is not None and int(found.group(0)) == label[0])
    return float(float(found.group(0)) == label[0])


def ref_math_calc(pred, label):
    got = [int(x) for x in re.findall("[0-9]+", pred)]
    n = 0
    while n < min(len(label), len(got)) and label[n] == got[n]:
        n += 1
    return n / len(label)


def ref_code_run(pred, label):
    words = ref_words(pred.strip(), "\n.`'\":")
    return float(
        bool(words)
        and re.fullmatch(r"\s*[-+]?[0-9_]+\s*", words[-1]) is not None
        and _int(words[-1]) == label[0]
    )


def _int(word):
    try:
        return int(word)
    except ValueError:
        return None


REFERENCES = {
    "passkey": lambda p, label: float(ref_first_int(p) == label[0]),
    "number_string": lambda p, label: float(ref_first_int(p) == label[0]),
    "kv_retrieval": lambda p, label: float(label[0] in ref_words(p, "\n:\"'.,?!{}")),
    "longdialogue_qa_eng": lambda p, label: float(
        label[0] in [w.upper() for w in ref_words(p, "\n:\"'.,?!{}")]
    ),
    "longbook_qa_eng": lambda p, label: max(ref_f1(ref_norm(p), ref_norm(x)) for x in label),
    "longbook_qa_chn": lambda p, label: max(ref_f1(ref_norm_zh(p), ref_norm_zh(x)) for x in label),
    "longbook_choice_eng": ref_choice,
    "code_debug": ref_debug,
    "math_find": ref_math_find,
    "math_calc": ref_math_calc,
    "code_run": ref_code_run,
}
PIECES = [
    "A",
    "B",
    "C",
    "D",
    "a",
    " ",
    "\n",
    ".",
    ":",
    "answer is:",
    "answer:",
    "answer is",
    "option is",
    "is:",
    "correct option is:",
    "Option",
    "*",
    "-",
    "`",
    '"',
    "'",
    "the",
    "an",
    "Georgie",
    "GEORGIE",
    "foo_bar",
    "12",
    "4",
    "-4",
    "3.5",
    "71432",
    "9",
    "[1, 4, 8]",
    "书",
    "。",
    "，",
    "{",
    "}",
    "?",
    "!",
    "_",
]


def case_label(name, rng):
    if name in ("passkey", "number_string"):
        return [rng.choice(["71432", "4", "12"])]
    if name in ("kv_retrieval", "longbook_qa_eng", "longbook_qa_chn"):
        return [
            rng.choice(["Georgie", "foo_bar", "the 12 books", "书。", "an A"])
            for _ in range(rng.randint(1, 2))
        ]
    if name == "longdialogue_qa_eng":
        return [rng.choice(["GEORGIE", "A", "FOO_BAR"])]
    if name in ("longbook_choice_eng", "code_debug"):
        return [rng.choice(["Georgie", "foo_bar", "A", "B"]), rng.choice("ABCD")]
    if name == "math_find":
        return [rng.choice([4, 9, 12, 3.5])]
    if name == "math_calc":
        return [rng.choice([1, 4, 8, 12]) for _ in range(rng.randint(1, 4))]
    return [rng.choice([4, 12, -4, 9])]  # code_run


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_scorer_matches_its_reference_on_random_cases(name):
    rng = random.Random(f"infinitebench-{name}")
    cases = [
        (
            " ".join(rng.choice(PIECES) for _ in range(rng.randint(0, 10)))
            if rng.random() < 0.5
            else "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 10))),
            case_label(name, rng),
        )
        for _ in range(5000)
    ]
    mismatches = [(p, label) for p, label in cases if SCORERS[name](p, label) != REFERENCES[name](p, label)]
    assert mismatches[:5] == []
    assert len({REFERENCES[name](p, label) for p, label in cases}) > 1  # not one outcome only


def test_summary_scorer_is_rouge_lsum():
    sample = Sample(
        "infinitebench/longbook_sum_eng",
        "0",
        "",
        "",
        "",
        ["x"],
        9,
        "infinitebench_longbook_sum_eng",
        meta={"label": ["the cat sat\non the mat"]},
    )
    assert score_sample(sample, "the cat sat\non the mat") == 100.0 and score_sample(sample, "dog") == 0.0
