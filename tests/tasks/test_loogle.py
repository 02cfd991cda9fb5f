"""LooGLE: rows read from the hub's own JSONL (or Parquet), one sample per question with the authors'
prompts (config/task2prompt.json), bad files refused in one line, and the metrics against references
written here from Evaluation/automatic_metrics.py's definitions."""

import json
import random

import pyarrow
import pyarrow.parquet
import pytest
from click.testing import CliRunner

from kvbench.cli import main
from kvbench.core.errors import DataFileError
from kvbench.tasks import list_tasks, load_samples, loogle, score_sample
from kvbench.tasks.base import Sample, TaskUnavailable
from kvbench.tasks.published import HubFile
from tests.tasks.rouge_reference import distinct_words, sentences, union_lcs


@pytest.fixture(autouse=True)
def no_hub(monkeypatch):
    """Tests never touch the network: the hub's file is absent."""
    monkeypatch.setattr(HubFile, "local", lambda self: None)


@pytest.fixture
def tokenizer(embedded_tokenizer):
    return embedded_tokenizer


# config/task2prompt.json, verbatim.
AUTHORS_PROMPTS = {
    "shortdep_qa": "Please answer the question based on the long texts below. \n{input}\nQuestion: {Q}\nAnswer: ",  # noqa: E501
    "longdep_qa": "Please answer the question based on the long texts below. \n{input}\nQuestion: {Q}\nAnswer: ",  # noqa: E501
    "longdep_summarization": "Please generate a summary of the below paper. \n{input}\n Summarization: ",
    "shortdep_cloze": "Please fill in the clozes based on the given long texts below. Each of the placeholder '<mask-n>' in the question could be an entity of Person, Location or Organiocation. The same masks represent the same entity. Output a json format answer, for example: {{'<mask-0>': 'Bob', '<mask-1>': 'Gorrosion Magazine','<mask-2>': 'Bethel Horizon'}}\n{input}\n Question: {Q} What are the masked entities? \nAnswer:",  # noqa: E501
}
DOCUMENT = " Early life. Maren was born in Vardø in 1919. She kept the lighthouse on the northern cape."


def qa_row(index: int, pairs: list[dict], **fields) -> dict:
    """A row as the hub's JSONL holds it: `qa_pairs` is the Python repr of the list of pairs."""
    return {"input": DOCUMENT, "title": f"Doc {index}", "qa_pairs": str(pairs), "output": "none", **fields}


SHORT_PAIRS = [
    {"S": "Maren was born in Vardø in 1919.", "Q": "Where was Maren born?", "A": "In Vardø."},
    {"S": "She kept the lighthouse.", "Q": "What did she keep?", "A": "The lighthouse."},
]
LONG_PAIRS = [
    {"Q": "How old was she in 1939?\n1. 20\n2. 19", "A": "2", "type": "computation", "S": ["a", "b"]}
]
CLOZE_PAIRS = [
    {"Q": "<mask-0> was born in <mask-1>.", "A": {"<mask-0>": "Maren", "<mask-1>": "Vardø"}, "S": "x"}
]
SUMMARY_ROW = {
    "input": DOCUMENT,
    "output": "A life by the sea.",
    "question": "none",
    "title": "2201.0",
    "qa_pairs": "none",
}


def write(folder, name, rows) -> None:
    (folder / f"{name}.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def test_each_question_is_a_sample_with_the_authors_prompt(tmp_path, tokenizer):
    write(tmp_path, "shortdep_qa", [qa_row(0, SHORT_PAIRS), qa_row(1, SHORT_PAIRS[:1])])
    samples = load_samples(
        "loogle/shortdep_qa", length=4000, samples=5, seed=0, tokenizer=tokenizer, data_dir=tmp_path
    )
    assert [s.id for s in samples] == ["0.0", "0.1", "1.0"]
    first = samples[0]
    assert first.context + first.question + first.answer_prefix == AUTHORS_PROMPTS["shortdep_qa"].format(
        input=DOCUMENT, Q="Where was Maren born?"
    )
    assert first.context.endswith("northern cape.") and first.answer_prefix == "Answer: "
    assert (first.references, first.max_new_tokens, first.metric) == (["In Vardø."], 300, "loogle_rouge_l")
    assert score_sample(first, "In Vardø.") == 100.0 and score_sample(first, "Oslo") == 0.0


@pytest.mark.parametrize(
    ("name", "row", "question", "reference", "new_tokens"),
    [
        ("longdep_qa", qa_row(0, LONG_PAIRS), LONG_PAIRS[0]["Q"], "2", 500),
        (
            "shortdep_cloze",
            qa_row(0, CLOZE_PAIRS),
            CLOZE_PAIRS[0]["Q"],
            '{"<mask-0>": "Maren", "<mask-1>": "Vardø"}',
            50,
        ),
        ("longdep_summarization", SUMMARY_ROW, "", "A life by the sea.", 500),
    ],
)
def test_the_other_tasks_prompts_are_the_authors(
    name, row, question, reference, new_tokens, tmp_path, tokenizer
):
    write(tmp_path, name, [row])
    [sample] = loogle.make_samples(f"loogle/{name}", 4000, 5, 0, tokenizer, tmp_path)
    assert sample.context + sample.question + sample.answer_prefix == AUTHORS_PROMPTS[name].format(
        input=DOCUMENT, Q=question
    )
    assert (
        sample.context
        == AUTHORS_PROMPTS[name].split("{input}")[0].replace("{{", "{").replace("}}", "}") + DOCUMENT
    )
    assert (sample.references, sample.max_new_tokens) == ([reference], new_tokens)


def test_the_cloze_is_scored_by_exact_match_of_each_mask(tmp_path, tokenizer):
    write(tmp_path, "shortdep_cloze", [qa_row(0, CLOZE_PAIRS)])
    [sample] = loogle.make_samples("loogle/shortdep_cloze", 4000, 1, 0, tokenizer, tmp_path)
    assert score_sample(sample, " {'<mask-0>': 'Maren', '<mask-1>': 'Vardø'}") == 100.0
    assert score_sample(sample, "{'<mask-0>': 'Maren', '<mask-1>': 'Oslo'}") == 50.0
    assert score_sample(sample, "Maren and Vardø") == 0.0
    # The authors `eval` the prediction; kvbench reads literals only: an expression scores 0 here.
    assert score_sample(sample, "{'<mask-0>': 'Mar' + 'en', '<mask-1>': f'Vardø'}") == 0.0


def test_reads_the_same_rows_as_parquet(tmp_path, tokenizer):
    rows = [qa_row(0, SHORT_PAIRS)]
    pyarrow.parquet.write_table(pyarrow.Table.from_pylist(rows), tmp_path / "shortdep_qa.parquet")
    samples = loogle.make_samples("loogle/shortdep_qa", 4000, 5, 0, tokenizer, tmp_path)
    assert [s.references for s in samples] == [["In Vardø."], ["The lighthouse."]]


def test_long_prompts_are_truncated_in_the_middle_and_keep_the_question(tmp_path, tokenizer):
    write(tmp_path, "longdep_qa", [qa_row(0, LONG_PAIRS, input="start " + "filler " * 3000 + "end")])
    [sample] = loogle.make_samples("loogle/longdep_qa", 400, 1, 0, tokenizer, tmp_path)
    assert sample.context.startswith("Please answer the question") and "end" in sample.context[-20:]
    assert sample.question == "\nQuestion: " + LONG_PAIRS[0]["Q"] + "\n"
    assert len(tokenizer(sample.context + sample.question).input_ids) <= 404


@pytest.mark.parametrize(
    ("name", "rows", "message"),
    [
        ("shortdep_qa", [qa_row(0, SHORT_PAIRS, qa_pairs="none")], "field 'qa_pairs': not a Python list"),
        ("shortdep_qa", [qa_row(0, SHORT_PAIRS, qa_pairs="[{'Q': 'q', 'A': ")], "field 'qa_pairs'"),
        ("shortdep_qa", [qa_row(0, [{"Q": "q"}])], "pair 0: field 'A'"),
        ("shortdep_qa", [qa_row(0, [{"Q": "q", "A": 3}])], "pair 0: field 'A'"),
        ("shortdep_cloze", [qa_row(0, [{"Q": "q", "A": {}}])], "no mask"),
        ("shortdep_cloze", [qa_row(0, [{"Q": "q", "A": "Maren"}])], "pair 0: field 'A'"),
        ("shortdep_cloze", [qa_row(0, [{"Q": "q", "A": {(1, 2): "x"}}])], "pair 0"),
        ("longdep_summarization", [{**SUMMARY_ROW, "output": "none"}], "field 'output': no summary"),
        ("shortdep_qa", [{k: v for k, v in qa_row(0, SHORT_PAIRS).items() if k != "input"}], "field 'input'"),
        (
            "shortdep_qa",
            [{"id": "z", "input": "x", "output": "y", "document_end_index": 1}],
            "field 'qa_pairs'",
        ),
        ("shortdep_qa", [], "holds no rows"),
    ],
)
def test_malformed_rows_are_refused_in_one_line_naming_file_and_field(
    name, rows, message, tmp_path, tokenizer
):
    write(tmp_path, name, rows)
    with pytest.raises(DataFileError) as error:
        loogle.make_samples(f"loogle/{name}", 4000, 5, 0, tokenizer, tmp_path)
    text = str(error.value)
    assert "\n" not in text and f"{name}.jsonl" in text and message in text


def test_the_cli_refuses_a_bad_file_before_any_work_and_writes_nothing(tmp_path):
    write(tmp_path, "shortdep_cloze", [qa_row(0, [{"Q": "q", "A": {}}])])
    out = tmp_path / "out"
    args = ["run", "--press", "knorm", "--ratio", "0.5", "--task", "loogle/shortdep_cloze", "--samples", "1"]
    result = CliRunner().invoke(main, [*args, "--data-dir", str(tmp_path), "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert "shortdep_cloze.jsonl: row 0: field 'qa_pairs': pair 0: field 'A': no mask" in result.output
    assert len(result.output.strip().splitlines()) == 1 and not out.exists()


def test_without_data_and_hub_the_task_says_so_in_one_line(tmp_path, tokenizer):
    with pytest.raises(TaskUnavailable) as error:
        loogle.make_samples("loogle/longdep_qa", 4000, 1, 0, tokenizer, tmp_path)
    assert "\n" not in str(error.value) and "bigai-nlco/LooGLE" in str(error.value)
    with pytest.raises(TaskUnavailable):
        loogle.make_samples("loogle/longdep_qa", 4000, 1, 0, tokenizer, None)


def test_kvbench_tasks_lists_the_four_tasks_with_their_source():
    listed = [t for t in list_tasks() if t.family == "loogle"]
    assert len(listed) == 4 and all("hub bigai-nlco/LooGLE or --data-dir" in t.description for t in listed)
    result = CliRunner().invoke(main, ["tasks"])
    assert result.exit_code == 0 and "loogle/longdep_summarization" in result.output


# ---- the metrics against references written from the authors' definitions ----


def ref_rouge_l_recall(prediction: str, reference: str) -> float:
    """get_rouge_score's "r" of rouge-l: the distinct words of the union LCS over the reference's distinct
    words (summary level); 0 where the package raises (no sentence on a side)."""
    hypothesis, expected = sentences(prediction or "None"), sentences(reference)
    if not hypothesis or not expected:
        return 0.0
    return 100.0 * len(union_lcs(expected, hypothesis)) / len(distinct_words(expected))


def ref_exact_match(prediction: str, reference: dict) -> float:
    """get_exact_match, as the authors wrote it (eval: the test's own strings only)."""
    hypothesis = prediction if prediction != "" else "None"
    try:
        hypothesis = eval(hypothesis, {"__builtins__": {}}, {})  # noqa: S307
        assert isinstance(hypothesis, dict)
    except Exception:
        return 0.0
    matched = sum(1 for key in reference if key in hypothesis and hypothesis[key] == reference[key])
    return 100.0 * matched / len(reference)


WORDS = ["the", "cat", "sat", "on", "mat", "The", "dog", "a", "é", "Vardø", "1919", ",", "cat,"]
SEPARATORS = [" ", "  ", ".", ". ", "..", "\n", "\t", ""]


def text(rng, most=14) -> str:
    return "".join(rng.choice(WORDS) + rng.choice(SEPARATORS) for _ in range(rng.randint(0, most)))


KEYS = ["'<mask-0>'", "'<mask-1>'", '"<mask-0>"', "'<mask-2>'", "'mask-0'"]
VALUES = [
    "'Maren'",
    "'Lu'",
    '"Maren"',
    "'maren'",
    "'Maren '",
    "['Maren']",
    "None",
    "1",
    "'Ma' 'ren'",
    "u'Lu'",
    "b'Lu'",
]
JUNK = [
    "{",
    "}",
    ":",
    ",",
    "'",
    '"',
    "(",
    ")",
    "[",
    "]",
    " ",
    "\n",
    "Maren",
    "None",
    "'<mask-0>'",
    "'Lu'",
    "1",
]


def cloze_case(rng):
    reference = {f"<mask-{i}>": rng.choice(["Maren", "Lu"]) for i in range(rng.randint(1, 3))}
    if rng.random() < 0.7:
        pairs = ", ".join(f"{rng.choice(KEYS)}: {rng.choice(VALUES)}" for _ in range(rng.randint(0, 4)))
        body = "{" + pairs + rng.choice(["", ",", " "]) + "}"
        prediction = rng.choice(["", " ", "\n", "\t"]) + body + rng.choice(["", "\n", " ", " and so on", "}"])
    else:
        prediction = "".join(rng.choice(JUNK) for _ in range(rng.randint(0, 10)))
    return prediction, reference


def test_rouge_l_matches_its_reference_on_random_and_adversarial_cases():
    rng = random.Random("loogle-rouge-l")
    cases = [("", "the cat"), ("...", "the cat"), ("None", "none of it"), ("the cat", "..."), ("a.b", "b.a")]
    cases += [(text(rng), text(rng) or "cat") for _ in range(5000)]
    mismatches = []
    for prediction, reference in cases:
        sample = Sample("loogle/shortdep_qa", "0", "", "", "", [reference], 300, "loogle_rouge_l")
        got, expected = score_sample(sample, prediction), ref_rouge_l_recall(prediction, reference)
        if got != pytest.approx(expected, rel=1e-12, abs=1e-12):
            mismatches.append((prediction, reference, got, expected))
    assert mismatches[:5] == []
    assert len({round(ref_rouge_l_recall(p, r), 6) for p, r in cases}) > 10


def test_cloze_exact_match_matches_the_authors_code_on_random_and_adversarial_cases():
    rng = random.Random("loogle-cloze")
    reference = {"<mask-0>": "Maren", "<mask-1>": "Lu"}
    adversarial = [
        "", "None", "{}", "{'<mask-0>': 'Maren'}", " {'<mask-0>': 'Maren', '<mask-1>': 'Lu'}",
        "\n{'<mask-0>': 'Maren'}", "{'<mask-0>': 'Maren'} and more",
        "{'<mask-0>': 'Lu', '<mask-0>': 'Maren'}", '{"<mask-0>": "Maren",}', "{'<mask-0>': 'Ma' 'ren'}",
        "{'<mask-0>': b'Maren'}", "[('<mask-0>', 'Maren')]", "{'<mask-0>': {'Maren'}}",
        "{{'<mask-0>': 'Maren'}}", "{'<mask-0>': 'Maren'", "\t{'<mask-1>': u'Lu'}",
    ]  # fmt: skip
    cases = [(prediction, reference) for prediction in adversarial]
    cases += [cloze_case(rng) for _ in range(5000)]
    mismatches = []
    for prediction, expected_dict in cases:
        sample = Sample(
            "loogle/shortdep_cloze", "0", "", "", "", [json.dumps(expected_dict)], 50, "loogle_exact_match"
        )
        got, expected = score_sample(sample, prediction), ref_exact_match(prediction, expected_dict)
        if got != expected:
            mismatches.append((prediction, expected_dict, got, expected))
    assert mismatches[:5] == []
    outcomes = {ref_exact_match(p, r) for p, r in cases}
    assert {0.0, 100.0} < outcomes  # partial matches too
