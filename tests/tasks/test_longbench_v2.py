"""LongBench-v2: the authors' prompt and answer extraction (THUDM/LongBench pred.py, prompts/0shot.txt), its
rows read from the hub's own formats, and bad files refused in one line."""

import json
import random

import pyarrow
import pyarrow.parquet
import pytest
from click.testing import CliRunner

from kvbench.cli import main
from kvbench.core.errors import DataFileError
from kvbench.store.results import check_meta
from kvbench.tasks import list_tasks, load_samples, score_sample
from kvbench.tasks import longbench_v2 as v2
from kvbench.tasks.base import Sample, TaskUnavailable
from kvbench.tasks.published import HubFile


@pytest.fixture(autouse=True)
def no_hub(monkeypatch):
    """Tests never touch the network: the hub's file is absent."""
    monkeypatch.setattr(HubFile, "local", lambda self: None)


def row(index: int, length: str = "short", answer: str = "B", **fields) -> dict:
    """A row with every field of the hub's data.json, in its order."""
    return {
        "_id": f"66f36490821e116aacb2{index:04d}",
        "domain": "Single-Document QA",
        "sub_domain": "Financial",
        "difficulty": "easy" if index % 2 else "hard",
        "length": length,
        "question": f" Which year is named in report {index}? ",
        "choice_A": "1999",
        "choice_B": " 2004 ",
        "choice_C": "2010",
        "choice_D": "2020",
        "answer": answer,
        "context": f"\nReport {index}. The company was founded in 2004.\n",
        **fields,
    }


def write_hub_json(folder, rows) -> None:
    (folder / "LongBench-v2").mkdir(exist_ok=True)
    (folder / "LongBench-v2" / "data.json").write_text(json.dumps(rows, ensure_ascii=False), encoding="utf-8")


@pytest.fixture
def tokenizer(embedded_tokenizer):
    return embedded_tokenizer


def test_loads_the_hubs_data_json_with_the_authors_prompt(tmp_path, tokenizer):
    write_hub_json(tmp_path, [row(0), row(1, "long", "D"), row(2, "medium")])
    samples = load_samples(
        "longbench-v2", length=4000, samples=2, seed=0, tokenizer=tokenizer, data_dir=tmp_path
    )
    assert [s.id for s in samples] == [row(0)["_id"], row(1)["_id"]]
    first = samples[0]
    assert first.context + first.question == (
        "Please read the following text and answer the question below.\n\n<text>\n"
        "Report 0. The company was founded in 2004.\n</text>\n\nWhat is the correct answer to this question: "
        "Which year is named in report 0?\nChoices:\n(A) 1999\n(B) 2004\n(C) 2010\n(D) 2020\n\n"
        'Format your response as follows: "The correct answer is (insert answer here)".'
    )
    assert first.question.startswith("What is the correct answer to this question:")
    assert (first.references, first.metric, first.max_new_tokens, first.chat_template) == (
        ["B"],
        "longbench_v2_accuracy",
        128,
        True,
    )
    assert first.meta == {
        "domain": "Single-Document QA",
        "sub_domain": "Financial",
        "difficulty": "hard",
        "length_class": "short",
    }
    check_meta({"task": first.task, "meta": first.meta})  # a row of it loads: meta.length counts tokens
    longs = load_samples(
        "longbench-v2/long", length=4000, samples=5, seed=0, tokenizer=tokenizer, data_dir=tmp_path
    )
    assert [s.references for s in longs] == [["D"]]


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet", ".json"])
def test_reads_the_same_rows_as_jsonl_parquet_or_json(suffix, tmp_path, tokenizer):
    rows = [row(0), row(1)]
    path = tmp_path / f"longbench_v2{suffix}"
    if suffix == ".parquet":
        pyarrow.parquet.write_table(pyarrow.Table.from_pylist(rows), path)
    elif suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    else:
        path.write_text(json.dumps(rows), encoding="utf-8")
    samples = v2.make_samples("longbench-v2", 4000, 5, 0, tokenizer, tmp_path)
    assert [s.id for s in samples] == [r["_id"] for r in rows]


def test_long_prompts_are_cut_in_the_middle_and_keep_the_question(tmp_path, tokenizer):
    write_hub_json(tmp_path, [row(0, context="start " + "filler " * 3000 + "end")])
    [sample] = v2.make_samples("longbench-v2", 400, 1, 0, tokenizer, tmp_path)
    assert sample.context.startswith("Please read") and "start" in sample.context
    assert sample.question.endswith('"The correct answer is (insert answer here)".')
    assert len(tokenizer(sample.context + sample.question).input_ids) <= 404


@pytest.mark.parametrize(
    ("rows", "field"),
    [
        ([{k: v for k, v in row(0).items() if k != "answer"}], "'answer'"),
        ([row(0, answer="E")], "'answer'"),
        ([row(0, length=3)], "'length'"),
        ([row(0, choice_C=None)], "'choice_C'"),
        ([{"input": "Who?", "context": "c", "answers": ["x"], "length": 3}], "'_id'"),  # a LongBench v1 row
        ([row(0), row(0)], "_id"),
        ([], "holds no rows"),
        ({"_id": "x"}, "not a JSON array"),
    ],
)
def test_malformed_rows_are_refused_in_one_line_naming_file_and_field(rows, field, tmp_path, tokenizer):
    write_hub_json(tmp_path, rows)
    with pytest.raises(DataFileError) as error:
        v2.make_samples("longbench-v2", 4000, 5, 0, tokenizer, tmp_path)
    message = str(error.value)
    assert "\n" not in message and "LongBench-v2/data.json" in message and field in message


def test_the_cli_refuses_a_bad_file_before_any_work_and_writes_nothing(tmp_path):
    write_hub_json(tmp_path, [row(0, answer="E")])
    out = tmp_path / "out"
    args = ["run", "--press", "knorm", "--ratio", "0.5", "--task", "longbench-v2", "--samples", "1"]
    result = CliRunner().invoke(main, [*args, "--data-dir", str(tmp_path), "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert "data.json: row 0: field 'answer'" in result.output
    assert len(result.output.strip().splitlines()) == 1 and not out.exists()


def test_without_data_and_hub_the_task_says_so_in_one_line(tmp_path, tokenizer):
    with pytest.raises(TaskUnavailable) as error:
        v2.make_samples("longbench-v2", 4000, 1, 0, tokenizer, tmp_path)
    assert "\n" not in str(error.value) and "THUDM/LongBench-v2" in str(error.value)
    with pytest.raises(TaskUnavailable):
        v2.make_samples("longbench-v2", 4000, 1, 0, tokenizer, None)


def test_kvbench_tasks_lists_them_with_their_source():
    listed = {task.name: task for task in list_tasks() if task.family == "longbench-v2"}
    assert set(listed) == {"longbench-v2", "longbench-v2/short", "longbench-v2/medium", "longbench-v2/long"}
    assert all("hub THUDM/LongBench-v2 or --data-dir" in task.description for task in listed.values())
    result = CliRunner().invoke(main, ["tasks"])
    assert result.exit_code == 0 and "longbench-v2/long" in result.output


# The metric against a reference written from pred.py's definition without regular expressions: asterisks
# removed, the leftmost "The correct answer is (X)" with X in A-D, else the leftmost "The correct answer is
# X"; the choice equals the answer.
def reference_extract(response: str) -> str | None:
    text = response.replace("*", "")
    phrase = "The correct answer is "
    for i in range(len(text)):
        if (
            text.startswith(phrase + "(", i)
            and text[i + 23 : i + 24] in tuple("ABCD")
            and text[i + 24 : i + 25] == ")"
        ):
            return text[i + 23]
    for i in range(len(text)):
        if text.startswith(phrase, i) and text[i + 22 : i + 23] in tuple("ABCD"):
            return text[i + 22]
    return None


def reference_score(prediction: str, answer: str) -> float:
    return 100.0 if reference_extract(prediction.strip()) == answer else 0.0


PIECES = [
    "The correct answer is ",
    "The correct answer is (",
    "The correct answer is",
    "the correct answer is ",
    "The  correct answer is ",
    "*",
    "**",
    "(",
    ")",
    " ",
    "\n",
    "A",
    "B",
    "C",
    "D",
    "E",
    "a",
    "d",
    "AB",
    "answer",
    "Ⓐ",
    "\t",
    ".",
]
ADVERSARIAL = [
    "",
    "The correct answer is (A)",
    "The correct answer is A",
    "The correct answer is (E)",
    "The correct answer is E",
    "The correct answer is **(B)**",
    "**The correct answer is (C)**",
    "The correct answer is (A",
    "The correct answer is (a)",
    "the correct answer is (A)",
    "The correct answer is  (A)",
    "The correct answer is D. Or rather, The correct answer is (B)",
    "The correct answer is (E) The correct answer is C",
    "The correct answer is*(B)*",
    "The correct answer is (*D*)",
    "The correct* answer is (A)",
    "   \n The correct answer is (B)\n",
    "The correct answer is (insert answer here)",
    "The correct answer is Answer A",
    "THE CORRECT ANSWER IS (A)",
]


def test_accuracy_matches_the_reference_on_random_and_adversarial_cases():
    rng = random.Random(20240548)
    cases = [(text, answer) for text in ADVERSARIAL for answer in "ABCD"]
    while len(cases) < 6000:
        text = "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 12)))
        cases.append((text, rng.choice("ABCD")))
    mismatches = []
    for text, answer in cases:
        sample = Sample("longbench-v2", "0", "", "", "", [answer], 128, "longbench_v2_accuracy")
        if score_sample(sample, text) != reference_score(text, answer):
            mismatches.append((text, answer))
    assert len(cases) >= 5000 and mismatches == []
    scores = [reference_score(text, answer) for text, answer in cases]
    assert 0 < sum(scores) < 100 * len(cases)  # both outcomes are exercised
