"""AIME25 and MATH-500: rows read from the hub's own files (math-ai/aime25, HuggingFaceH4/MATH-500), asked as
kvpress asks them, bad files refused in one line, the last boxed answer against a reference written here, and
the score against math-verify called as lighteval's MATH-500 task calls it.

The rows are fixtures written for these tests, not problems of either set."""

import json
import random
import threading

import pyarrow
import pyarrow.parquet
import pytest
from click.testing import CliRunner
from math_verify import LatexExtractionConfig, parse, verify

from kvbench.cli import main
from kvbench.core.errors import DataFileError
from kvbench.tasks import list_tasks, load_samples, score_sample
from kvbench.tasks import math_answers as math
from kvbench.tasks.base import Sample, TaskUnavailable
from kvbench.tasks.published import HubFile


@pytest.fixture(autouse=True)
def no_hub(monkeypatch):
    """Tests never touch the network: the hub's files are absent."""
    monkeypatch.setattr(HubFile, "local", lambda self: None)


def aime_row(index: int, answer="70") -> dict:
    """A row with the fields of math-ai/aime25's test.jsonl."""
    return {"problem": f"Fixture problem {index}: what is $35 \\cdot 2$?", "answer": answer, "id": str(index)}


def math500_row(index: int, answer="\\frac{14}{3}", **fields) -> dict:
    """A row with every field of HuggingFaceH4/MATH-500's test.jsonl, in its order."""
    return {
        "problem": f"Fixture problem {index}: what is $\\frac{{28}}{{6}}$ in lowest terms?",
        "solution": f"Divide both by 2: $\\boxed{{{answer}}}$.",
        "answer": answer,
        "subject": "Prealgebra",
        "level": 2,
        "unique_id": f"test/prealgebra/{index}.json",
        **fields,
    }


def write_jsonl(path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")


def test_loads_the_hubs_files_and_asks_as_kvpress_does(tmp_path):
    write_jsonl(tmp_path / "aime25" / "test.jsonl", [aime_row(1), aime_row(2, "023")])
    write_jsonl(tmp_path / "MATH-500" / "test.jsonl", [math500_row(1), math500_row(2, "3")])
    aime = load_samples("aime25", length=1024, samples=5, seed=0, tokenizer=None, data_dir=tmp_path)
    assert [(s.id, s.references) for s in aime] == [("1", ["70"]), ("2", ["023"])]
    first = aime[0]
    assert (first.context, first.question, first.answer_prefix) == (" ", aime_row(1)["problem"], "")
    assert (first.max_new_tokens, first.metric, first.chat_template, first.meta) == (
        32000,
        "math_equivalence",
        True,
        {},
    )
    [problem] = load_samples("math500", length=1024, samples=1, seed=0, tokenizer=None, data_dir=tmp_path)
    assert (problem.id, problem.references, problem.max_new_tokens) == (
        "test/prealgebra/1.json",
        ["\\frac{14}{3}"],
        4096,
    )
    assert problem.meta == {"subject": "Prealgebra", "level": 2}
    assert score_sample(problem, "So it is $\\boxed{\\dfrac{14}{3}}$.") == 100.0
    assert score_sample(problem, "\\boxed{4.6666666667}") == 100.0
    assert score_sample(problem, "\\boxed{14/4}") == 0.0
    assert score_sample(aime[1], "The answer is \\boxed{23}") == 100.0


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet", ".json"])
def test_reads_the_same_rows_as_jsonl_parquet_or_json(suffix, tmp_path):
    rows = [math500_row(1), math500_row(2, "\\left( 3, \\frac{\\pi}{2} \\right)")]
    path = tmp_path / f"math500{suffix}"
    if suffix == ".parquet":
        pyarrow.parquet.write_table(pyarrow.Table.from_pylist(rows), path)
    elif suffix == ".jsonl":
        write_jsonl(path, rows)
    else:
        path.write_text(json.dumps(rows), encoding="utf-8")
    samples = math.make_samples("math500", 1024, 5, 0, None, tmp_path)
    assert [s.id for s in samples] == [r["unique_id"] for r in rows]
    assert score_sample(samples[1], "\\boxed{(3, \\pi/2)}") == 100.0


@pytest.mark.parametrize(
    ("task", "rows", "field"),
    [
        ("math500", [math500_row(1, answer="}{")], "'answer': '}{' is not math"),
        ("math500", [math500_row(1, answer="")], "'answer': '' is not math"),
        ("aime25", [aime_row(1, answer="$")], "'answer': '$' is not math"),
        ("math500", [{k: v for k, v in math500_row(1).items() if k != "level"}], "'level'"),
        ("math500", [math500_row(1, level="2")], "'level'"),
        ("aime25", [{k: v for k, v in aime_row(1).items() if k != "problem"}], "'problem'"),
        ("aime25", [aime_row(1), aime_row(1)], "id '1'"),
        # another dataset's rows: kvpress's processed AIME (context/question), MATH-500's in AIME's place
        (
            "aime25",
            [{"context": " ", "question": "q", "answer_prefix": "", "answer": "1", "max_new_tokens": 9}],
            "'id'",
        ),
        ("math500", [aime_row(1)], "'solution'"),
        ("aime25", [], "holds no rows"),
    ],
)
def test_malformed_rows_are_refused_in_one_line_naming_file_and_field(task, rows, field, tmp_path):
    folder = {"aime25": "aime25", "math500": "MATH-500"}[task]
    write_jsonl(tmp_path / folder / "test.jsonl", rows)
    with pytest.raises(DataFileError) as error:
        math.make_samples(task, 1024, 5, 0, None, tmp_path)
    message = str(error.value)
    assert "\n" not in message and f"{folder}/test.jsonl" in message and field in message


def test_the_cli_refuses_an_answer_that_does_not_parse_before_any_work_and_writes_nothing(tmp_path):
    write_jsonl(tmp_path / "MATH-500" / "test.jsonl", [math500_row(1), math500_row(2, answer="}{")])
    out = tmp_path / "out"
    args = ["run", "--press", "knorm", "--ratio", "0.5", "--task", "math500", "--samples", "1"]
    result = CliRunner().invoke(main, [*args, "--data-dir", str(tmp_path), "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert "test.jsonl: row 1: field 'answer'" in result.output
    assert len(result.output.strip().splitlines()) == 1 and not out.exists()


def test_without_data_and_hub_the_task_says_so_in_one_line(tmp_path):
    for task, repo in (("aime25", "math-ai/aime25"), ("math500", "HuggingFaceH4/MATH-500")):
        with pytest.raises(TaskUnavailable) as error:
            math.make_samples(task, 1024, 1, 0, None, tmp_path)
        assert "\n" not in str(error.value) and repo in str(error.value)
        with pytest.raises(TaskUnavailable):
            math.make_samples(task, 1024, 1, 0, None, None)


def test_kvbench_tasks_lists_them_with_their_source():
    listed = {task.name: task for task in list_tasks() if task.family == "math"}
    assert set(listed) == {"aime25", "math500"}
    assert "hub math-ai/aime25 or --data-dir" in listed["aime25"].description
    assert "hub HuggingFaceH4/MATH-500 or --data-dir" in listed["math500"].description
    result = CliRunner().invoke(main, ["tasks"])
    assert result.exit_code == 0 and "math500" in result.output


def test_the_score_works_off_the_main_thread():
    sample = Sample("math500", "0", " ", "q", "", ["\\frac{1}{2}"], 4096, "math_equivalence")
    scores = []
    thread = threading.Thread(target=lambda: scores.append(score_sample(sample, "\\boxed{0.5}")))
    thread.start()
    thread.join()
    assert scores == [100.0]


# The last boxed answer, written again without a depth counter: the last "\boxed{" of the text, and the first
# "}" after it that closes a balanced run of braces (every prefix of the run has no more "}" than "{" and the
# run has as many of each); none: no answer.
def balanced(run: str) -> bool:
    prefix_sums = [run[: k + 1].count("{") - run[: k + 1].count("}") for k in range(len(run))]
    return all(total >= 0 for total in prefix_sums) and run.count("{") == run.count("}")


def reference_boxed(text: str) -> str | None:
    starts = [i for i in range(len(text)) if text.startswith("\\boxed{", i)]
    if not starts:
        return None
    begin = starts[-1] + len("\\boxed{")
    for end in range(begin, len(text)):
        if text[end] == "}" and balanced(text[begin:end]):
            return text[begin:end]
    return None


BOX_PIECES = [
    "\\boxed{",
    "\\boxed",
    "boxed{",
    "{",
    "}",
    "\\{",
    "\\}",
    "\\frac{1}{2}",
    "7",
    "70",
    " ",
    "\n",
    "x",
    "$",
    "\\text{",
    "\\dfrac",
    "0.5",
    "-",
]
ADVERSARIAL = [
    "",
    "\\boxed{}",
    "\\boxed{7}",
    "\\boxed{7",
    "\\boxed{7} then \\boxed{8",
    "\\boxed{\\boxed{5}}",
    "\\boxed{\\frac{14}{3}}",
    "\\boxed{\\{1, 2\\}}",
    "boxed{70}",
    "\\boxed {70}",
    "\\boxed{{}}}",
    "}}\\boxed{1}}}",
    "\\boxed{a}\\boxed{b}",
    "\\boxed{\\text{(C)}}.",
    "The answer is $\\boxed{070}$.",
    "\\fbox{3}",
]


def test_last_boxed_matches_the_reference_on_random_and_adversarial_cases():
    rng = random.Random(4805)
    cases = list(ADVERSARIAL)
    while len(cases) < 6000:
        cases.append("".join(rng.choice(BOX_PIECES + ["}"] * 6) for _ in range(rng.randint(0, 14))))
    mismatches = [text for text in cases if math.last_boxed(text) != reference_boxed(text)]
    assert mismatches == []
    found = [reference_boxed(text) for text in cases]
    assert any(answer is None for answer in found) and sum(answer is not None for answer in found) > 500


# The score as the authors' tools define it: the reference's last boxed answer, and math-verify's `verify` on
# the gold and that answer parsed as the content of a \boxed{} by
# LatexExtractionConfig(boxed_match_priority=0) (math-verify's MATH-500 task's gold extraction).
def reference_score(prediction: str, gold: str) -> float:
    answer = reference_boxed(prediction)
    if answer is None:
        return 0.0
    config = [LatexExtractionConfig(boxed_match_priority=0)]
    return 100.0 * verify(parse("\\boxed{" + gold + "}", config), parse("\\boxed{" + answer + "}", config))


GOLDS = [
    "70",
    "023",
    "\\frac{14}{3}",
    "\\left( 3, \\frac{\\pi}{2} \\right)",
    "2\\sqrt{2}",
    "x=5",
    "\\text{(C)}",
    "10\\%",
    "\\{1,2\\}",
    "-1",
]
ANSWERS = [
    "70",
    "070",
    "70.0",
    "23",
    "14/3",
    "\\frac{28}{6}",
    "4.6666667",
    "(3,\\pi/2)",
    "\\sqrt{8}",
    "5",
    "C",
    "0.1",
    "10",
    "\\{2,1\\}",
    "-1",
    "1",
    "}",
    "{",
    "\\frac{1}",
]


def test_equivalence_matches_math_verify_on_random_and_adversarial_cases():
    rng = random.Random(500)
    cases = [(f"\\boxed{{{answer}}}", gold) for gold in GOLDS for answer in ANSWERS]
    cases += [(text, gold) for text in ADVERSARIAL for gold in GOLDS]
    while len(cases) < 5200:
        pieces = [
            rng.choice(BOX_PIECES + [f"\\boxed{{{rng.choice(ANSWERS)}}}"] * 4)
            for _ in range(rng.randint(0, 6))
        ]
        cases.append(("".join(pieces), rng.choice(GOLDS)))
    mismatches = []
    for text, gold in cases:
        sample = Sample("math500", "0", " ", "q", "", [gold], 4096, "math_equivalence")
        if score_sample(sample, text) != reference_score(text, gold):
            mismatches.append((text, gold))
    assert len(cases) >= 5000 and mismatches == []
    scores = [reference_score(text, gold) for text, gold in cases[:400]]
    assert 0 < sum(scores) < 100 * len(scores)  # both outcomes are exercised
