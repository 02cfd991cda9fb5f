"""Needle in a haystack: the grid of depths x lengths, gkamradt's placement (LLMTest_NeedleInAHaystack's
insert_needle) checked against a reference written here, kvpress's dataset rows or gkamradt's essay files read
from --data-dir, bad files refused in one line, and kvpress's ROUGE score against a reference written here.

The haystacks are fixture paragraphs written for these tests, not essays."""

import json
import random

import pyarrow
import pyarrow.parquet
import pytest
from click.testing import CliRunner

from kvbench.cli import main
from kvbench.core.errors import BadInput, DataFileError
from kvbench.tasks import list_tasks, load_samples, score_sample
from kvbench.tasks import needle as niah
from kvbench.tasks.base import Sample, TaskUnavailable
from kvbench.tasks.published import HubFile
from tests.tasks.rouge_reference import distinct_words, sentences, union_lcs

FIXTURE_ESSAYS = {
    "alpha.txt": (
        "FIXTURE PARAGRAPH ONE. This text was written for kvbench's tests and is no essay. It talks "
        "about nothing in particular: a kettle, a ladder and a window that faces the sea. Each sentence "
        "ends with a period so that a needle has somewhere to go.\n\n"
    ),
    "beta.txt": (
        "FIXTURE PARAGRAPH TWO. Another stand-in, as dull as the first on purpose. The ladder leans on the "
        "wall; the kettle is cold; the window is shut. Nothing here answers any question.\n\n"
    ),
}
KVPRESS_ROW = {
    "context": "".join(FIXTURE_ESSAYS.values()),
    "needle": "The fixture's secret is that the lighthouse keeper collects blue teapots.",
    "question": "What does the lighthouse keeper collect?",
    "answer_prefix": "Answer:",
    "max_new_tokens": 24,
}


@pytest.fixture(autouse=True)
def no_hub(monkeypatch):
    """Tests never touch the network: the hub's file is absent."""
    monkeypatch.setattr(HubFile, "local", lambda self: None)


@pytest.fixture
def tokenizer(embedded_tokenizer):
    return embedded_tokenizer


def write_essays(folder, essays=FIXTURE_ESSAYS):
    (folder / "PaulGrahamEssays").mkdir()
    for name, text in essays.items():
        (folder / "PaulGrahamEssays" / name).write_text(text, encoding="utf-8")


def write_rows(folder, rows, suffix=".parquet"):
    path = folder / f"paul_graham_essays{suffix}"
    if suffix == ".parquet":
        pyarrow.parquet.write_table(pyarrow.Table.from_pylist(rows), path)
    elif suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    else:
        path.write_text(json.dumps(rows), encoding="utf-8")
    return path


# gkamradt's LLMNeedleHaystackTester, written again here on token lists: read_context_files (the essays
# joined, again while too short), encode_and_trim, insert_needle (trim for the needle, back to a period, 100 =
# end).
def reference_context(tokenizer, haystack: str, needle: str, question: str, length: int, depth: int) -> str:
    def encode(text):
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    wrapper_head, wrapper_tail = "This is a very long story book: <book> ", " </book>."
    tokens_needle = encode(needle)
    room = length - len(encode(wrapper_head + wrapper_tail + question)) - len(tokens_needle)
    context = haystack
    while len(encode(context)) < room:
        context += haystack
    tokens_context = encode(context)[:room]
    if depth == 100:
        tokens_new_context = tokens_context + tokens_needle
    else:
        insertion_point = int(len(tokens_context) * (depth / 100))
        tokens_new_context = tokens_context[:insertion_point]
        period_tokens = [t for t in set(tokens_context) if tokenizer.decode([t]).strip() == "."]
        while tokens_new_context and tokens_new_context[-1] not in period_tokens:
            insertion_point -= 1
            tokens_new_context = tokens_context[:insertion_point]
        tokens_new_context += tokens_needle + tokens_context[insertion_point:]
    return wrapper_head + tokenizer.decode(tokens_new_context, skip_special_tokens=True) + wrapper_tail


def test_the_grid_of_gkamradts_essay_files_with_his_needle_and_placement(tmp_path, tokenizer):
    write_essays(tmp_path)
    samples = load_samples(
        "needle_in_haystack", length=1024, samples=100, seed=0, tokenizer=tokenizer, data_dir=tmp_path
    )
    depths = list(range(0, 101, 10))
    assert [(s.meta["length"], s.meta["depth"]) for s in samples] == [
        (n, d) for n in (1024, 768, 512, 256) for d in depths
    ]
    assert [s.id for s in samples[:2]] == ["1024-0", "1024-10"]
    haystack = "".join(FIXTURE_ESSAYS[name] for name in sorted(FIXTURE_ESSAYS))
    for sample in samples:
        n, depth = sample.meta["length"], sample.meta["depth"]
        assert sample.context == reference_context(
            tokenizer, haystack, niah.GKAMRADT_NEEDLE, niah.GKAMRADT_QUESTION, n, depth
        )
        assert sample.context.count("Dolores Park") == 1
        assert len(tokenizer(sample.context + sample.question).input_ids) <= n + 2
        assert (sample.question, sample.answer_prefix, sample.max_new_tokens) == (
            niah.GKAMRADT_QUESTION,
            "",
            64,
        )
        assert (sample.references, sample.metric, sample.chat_template) == (
            [niah.GKAMRADT_NEEDLE],
            "needle_rouge",
            True,
        )
    at = {(s.meta["length"], s.meta["depth"]): s.context.index("\nThe best thing") for s in samples}
    assert all(
        at[1024, a] <= at[1024, b] for a, b in zip(depths[:-1], depths[1:], strict=True)
    )  # deeper is later
    assert samples[0].context.startswith("This is a very long story book: <book> \nThe best thing")
    assert samples[10].context.endswith("sunny day.\n </book>.")
    middle = samples[5].context
    assert middle[: middle.index("\nThe best thing")].endswith(".")  # the needle starts a sentence


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl", ".json"])
def test_kvpress_dataset_rows_give_the_needle_question_and_budget(suffix, tmp_path, tokenizer):
    write_rows(tmp_path, [KVPRESS_ROW, {**KVPRESS_ROW, "needle": "A second row is not read."}], suffix)
    samples = niah.make_samples("needle_in_haystack", 2048, 11, 0, tokenizer, tmp_path)
    assert [s.id for s in samples] == [f"2048-{d}" for d in range(0, 101, 10)]
    sample = samples[4]
    assert (sample.question, sample.answer_prefix, sample.max_new_tokens) == (
        KVPRESS_ROW["question"],
        "Answer:",
        24,
    )
    assert sample.references == [KVPRESS_ROW["needle"]] and "blue teapots" in sample.context
    assert sample.context == reference_context(
        tokenizer, KVPRESS_ROW["context"], KVPRESS_ROW["needle"], KVPRESS_ROW["question"], 2048, 40
    )
    assert "FIXTURE PARAGRAPH TWO" in sample.context  # the short haystack is repeated, as gkamradt does


def test_a_length_below_the_minimum_is_refused(tmp_path, tokenizer):
    write_essays(tmp_path)
    with pytest.raises(BadInput, match="length >= 512"):
        niah.make_samples("needle_in_haystack", 511, 1, 0, tokenizer, tmp_path)


@pytest.mark.parametrize(
    ("rows", "field"),
    [
        ([{k: v for k, v in KVPRESS_ROW.items() if k != "needle"}], "'needle'"),
        ([{**KVPRESS_ROW, "max_new_tokens": "40"}], "'max_new_tokens'"),
        ([{**KVPRESS_ROW, "needle": "  "}], "'needle': empty"),
        ([{**KVPRESS_ROW, "max_new_tokens": 0}], "'max_new_tokens'"),
        # another dataset's rows: HuggingFaceH4/MATH-500's and LongBench-v2's fields
        (
            [{"problem": "p", "solution": "s", "answer": "1", "subject": "x", "level": 1, "unique_id": "u"}],
            "'context'",
        ),
        ([{"_id": "a", "context": "c", "question": "q", "answer": "A", "choice_A": "x"}], "'needle'"),
        ([], "holds no rows"),
    ],
)
def test_malformed_rows_are_refused_in_one_line_naming_file_and_field(rows, field, tmp_path, tokenizer):
    write_rows(tmp_path, rows, ".jsonl")
    with pytest.raises(DataFileError) as error:
        niah.make_samples("needle_in_haystack", 1024, 1, 0, tokenizer, tmp_path)
    message = str(error.value)
    assert "\n" not in message and "paul_graham_essays.jsonl" in message and field in message


def test_bad_essay_folders_are_refused_in_one_line(tmp_path, tokenizer):
    (tmp_path / "PaulGrahamEssays").mkdir()
    with pytest.raises(DataFileError, match="holds no .txt essays"):
        niah.make_samples("needle_in_haystack", 1024, 1, 0, tokenizer, tmp_path)
    (tmp_path / "PaulGrahamEssays" / "a.txt").write_bytes(b"\xff\xfe not text")
    with pytest.raises(DataFileError, match="a.txt: not UTF-8 text"):
        niah.make_samples("needle_in_haystack", 1024, 1, 0, tokenizer, tmp_path)
    (tmp_path / "PaulGrahamEssays" / "a.txt").write_text("  \n")
    with pytest.raises(DataFileError, match="'context': empty"):
        niah.make_samples("needle_in_haystack", 1024, 1, 0, tokenizer, tmp_path)


def test_the_cli_refuses_a_bad_file_before_any_work_and_writes_nothing(tmp_path):
    write_rows(tmp_path, [{**KVPRESS_ROW, "question": None}], ".jsonl")
    out = tmp_path / "out"
    args = ["run", "--press", "knorm", "--ratio", "0.5", "--task", "needle_in_haystack", "--samples", "1"]
    result = CliRunner().invoke(main, [*args, "--data-dir", str(tmp_path), "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert "paul_graham_essays.jsonl: row 0: field 'question'" in result.output
    assert len(result.output.strip().splitlines()) == 1 and not out.exists()


def test_without_a_haystack_the_task_says_so_in_one_line(tmp_path, tokenizer):
    with pytest.raises(TaskUnavailable) as error:
        niah.make_samples("needle_in_haystack", 1024, 1, 0, tokenizer, tmp_path)
    message = str(error.value)
    assert (
        "\n" not in message
        and "alessiodevoto/paul_graham_essays" in message
        and "PaulGrahamEssays" in message
    )
    with pytest.raises(TaskUnavailable):
        niah.make_samples("needle_in_haystack", 1024, 1, 0, tokenizer, None)


def test_kvbench_tasks_lists_it_with_its_source():
    [task] = [task for task in list_tasks() if task.family == "needle_in_haystack"]
    assert (
        task.name == "needle_in_haystack"
        and "hub alessiodevoto/paul_graham_essays or --data-dir" in task.description
    )
    result = CliRunner().invoke(main, ["tasks"])
    assert result.exit_code == 0 and "needle_in_haystack" in result.output


# kvpress's score, written again from the rouge package's definition of summary-level ROUGE-L: the texts cut
# into sentences at every ".", spaces normalised, words split on single spaces; for each pair (a sentence of
# the prediction, a sentence of the needle) the words of one longest common subsequence, recovered from the
# end preferring to drop a prediction word only when that keeps a longer LCS; the union of those words over
# all pairs, as a set, over the distinct words of each side is the precision and recall.
def reference_score(prediction: str, needle: str) -> float:
    """kvpress's call: the needle as the hypothesis, the prediction as the reference; ROUGE-L's F."""
    hypothesis, reference = sentences(needle.strip()), sentences(prediction.strip())
    if not hypothesis or not reference:
        return 0.0
    union = union_lcs(reference, hypothesis)
    precision, recall = (
        len(union) / len(distinct_words(hypothesis)),
        len(union) / len(distinct_words(reference)),
    )
    return 100.0 * (2.0 * ((precision * recall) / (precision + recall + 1e-8)))


NEEDLE = "The best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day."
PIECES = [
    *NEEDLE.split(),
    "the",
    "THE",
    "park",
    "Park.",
    ".",
    "..",
    " ",
    "  ",
    "\n",
    "\t",
    ",",
    "is",
    "a",
    "a a",
    "day",
    "sandwich",
]
ADVERSARIAL = [
    "",
    " ",
    ".",
    "...",
    " . . ",
    NEEDLE,
    NEEDLE.lower(),
    NEEDLE.upper(),
    NEEDLE + " " + NEEDLE,
    "eat a sandwich and sit in Dolores Park on a sunny day.",
    "Dolores Park",
    "park dolores",
    "a a a a a",
    "The best thing to do in San Francisco is eat a sandwich. And sit in Dolores Park. On a sunny day.",
    "sunny day on a Park Dolores in sit and sandwich a eat is Francisco San in do to thing best The",
    "The\tbest\nthing  to do",
    "Answer: eat a sandwich and sit in Dolores Park on a sunny day",
    "I don't know.",
]


def test_needle_rouge_matches_the_reference_on_random_and_adversarial_cases():
    rng = random.Random(20260548)
    needles = [
        NEEDLE,
        "\n" + NEEDLE + "\n",
        "Figs are one of the secret ingredients. Of the perfect pizza.",
        "a",
    ]
    cases = [(text, needle) for text in ADVERSARIAL for needle in needles]
    while len(cases) < 6000:
        text = " ".join(rng.choice(PIECES) for _ in range(rng.randint(0, 30)))
        needle = (
            rng.choice(needles)
            if rng.random() < 0.8
            else " ".join(rng.choice(PIECES) for _ in range(rng.randint(0, 12)))
        )
        cases.append((text, needle))
    mismatches = []
    for text, needle in cases:
        sample = Sample("needle_in_haystack", "0", "", "", "", [needle], 64, "needle_rouge")
        if score_sample(sample, text) != reference_score(text, needle):
            mismatches.append((text, needle))
    assert len(cases) >= 5000 and mismatches == []
    scores = {round(reference_score(text, needle), 6) for text, needle in cases}
    assert 0.0 in scores and len(scores) > 100 and max(scores) == pytest.approx(100.0, abs=1e-5)
