import json
import re
from collections import Counter

import pytest

from kvbench.tasks import load_suite, ruler
from kvbench.tasks.base import Sample, TaskUnavailable

OFFLINE = [task for task in ruler.TASKS if not task.startswith("qa")]
NIAH_NEEDLE = re.compile(r"One of the special magic (\w+) for (\S+) is: ([\w-]+)\.")


@pytest.fixture
def tokenizer(embedded_tokenizer):
    return embedded_tokenizer


def full_tokens(sample: Sample, tokenizer) -> int:
    """RULER's length: the whole input (its answer prefix has a leading space) plus the generated tokens."""
    text = sample.context + sample.question + " " + sample.answer_prefix
    return len(tokenizer.encode(text, add_special_tokens=False)) + sample.max_new_tokens


def sample_with(references: list[str]) -> Sample:
    return Sample("t", "0", "", "", "", references, 10, "string_match_all")


# ---- metrics, hand-computed ----


def test_string_match_all_counts_the_fraction_of_references_found():
    sample = sample_with(["123", "456", "789"])
    assert ruler.string_match_all("the numbers are 123 and 456.", sample) == pytest.approx(200 / 3)
    assert ruler.string_match_all("nothing here", sample) == 0
    assert ruler.string_match_all("789, 456, 123", sample) == 100


def test_string_match_part_scores_100_when_any_reference_is_found():
    sample = sample_with(["Paris", "the city of Paris"])
    assert ruler.string_match_part("it is paris", sample) == 100
    assert ruler.string_match_part("London", sample) == 0


def test_metrics_ignore_case():
    sample = sample_with(["FOXRL", "abc-Def"])
    assert ruler.string_match_all("foxrl ABC-DEF", sample) == 100


def test_postprocessing_turns_control_characters_into_newlines_as_ruler():
    assert ruler.postprocess(" \x01 7\t8 \n") == "7\n8"
    # "12\x0034" becomes "12\n34", which no longer contains "1234".
    assert ruler.string_match_all("12\x0034", sample_with(["1234"])) == 0
    assert ruler.string_match_all("12\x0034", sample_with(["12\n34"])) == 100


def test_metric_names_match_the_samples(tokenizer):
    assert ruler.make_samples("vt", 1024, 1, 0, tokenizer, None)[0].metric == "string_match_all"
    assert set(ruler.METRICS) == {"string_match_all", "string_match_part"}


# ---- generators ----


@pytest.mark.parametrize("task", OFFLINE)
def test_generation_is_deterministic_and_seeded(task, tokenizer):
    length = ruler.min_length(task)
    first = ruler.make_samples(task, length, 2, 7, tokenizer, None)
    assert first == ruler.make_samples(task, length, 2, 7, tokenizer, None)
    assert [s.id for s in first] == ["7-0", "7-1"]
    assert first[0].context != first[1].context
    assert first[0].context != ruler.make_samples(task, length, 1, 8, tokenizer, None)[0].context
    assert all(s.meta == {"length": length} and s.task == task for s in first)


@pytest.mark.parametrize("task", OFFLINE)
def test_input_fills_the_requested_length(task, tokenizer):
    # One more haystack unit would not fit: a noise sentence is ~20 tokens, a uuid distractor needle ~50.
    tolerance = 128 if task == "niah_multikey_3" else 64
    for sample in ruler.make_samples(task, 1024, 3, 0, tokenizer, None):
        assert 1024 - tolerance <= full_tokens(sample, tokenizer) <= 1024
        assert sample.max_new_tokens == ruler.TOKENS_TO_GENERATE[ruler.family(task)]


def test_lengths_below_the_minimum_are_rejected(tokenizer):
    with pytest.raises(ValueError, match="at least 1024"):
        ruler.make_samples("vt", 512, 1, 0, tokenizer, None)
    with pytest.raises(ValueError, match="unknown RULER task"):
        ruler.make_samples("niah", 1024, 1, 0, tokenizer, None)


def test_largest_fitting_finds_the_boundary_from_any_guess():
    def tokens_at(n):  # affine with a wobble, like real tokenization
        return 50 + 7 * n + n % 3

    expected = max(n for n in range(1, 1000) if tokens_at(n) <= 1050)
    for guess in (None, 1, 100, expected, expected + 1, 5000):
        assert ruler.largest_fitting(tokens_at, 1050, 1, 10**6, guess) == expected
    calls = []
    ruler.largest_fitting(lambda n: calls.append(n) or tokens_at(n), 1050, 1, 10**6, expected)
    assert len(set(calls)) <= 3  # a right guess: the lowest size, the guess and its neighbour
    assert ruler.largest_fitting(tokens_at, 10**9, 1, 300, None) == 300
    with pytest.raises(ValueError):
        ruler.largest_fitting(tokens_at, 10, 1, 300, None)


@pytest.mark.parametrize("task", [t for t in OFFLINE if t.startswith("niah")])
def test_needles_hold_the_answers_to_the_question(task, tokenizer):
    config = ruler.NIAH[task]
    for sample in ruler.make_samples(task, 512, 3, 0, tokenizer, None):
        needles = NIAH_NEEDLE.findall(sample.context)
        values_of = {}
        for value_type, key, value in needles:
            assert value_type == config.value_type
            values_of.setdefault(key, []).append(value)
        query = re.search(r"for (.+) mentioned in the provided text\?$", sample.question).group(1)
        keys = re.split(r", and |, ", query)
        assert len(keys) == config.queries
        assert sample.answer_prefix.endswith(
            f"for {query} mentioned in the provided text " + ("is" if len(sample.references) == 1 else "are")
        )
        assert sorted(sample.references) == sorted(value for key in keys for value in values_of[key])
        assert all(len(values_of[key]) == config.values for key in keys)
        if config.haystack == "needle":
            assert len(needles) > 1  # the haystack is made of distractor needles
        else:
            assert len(needles) == max(config.keys, config.queries) * config.values
        if config.haystack == "noise":
            lines = sample.context.splitlines()[1:]
            assert {line for line in lines if not NIAH_NEEDLE.fullmatch(line)} == {ruler.NOISE}


def test_niah_prompt_is_rulers_singular_wording(tokenizer):
    sample = ruler.make_samples("niah_single_1", 512, 1, 0, tokenizer, None)[0]
    key = NIAH_NEEDLE.search(sample.context).group(2)
    assert sample.context.startswith(
        "A special magic number is hidden within the following text. Make sure to memorize it. "
        "I will quiz you about the number afterwards.\n"
    )
    assert sample.context.endswith(".\n")
    assert sample.question == f"What is the special magic number for {key} mentioned in the provided text?"
    assert sample.answer_prefix == f"The special magic number for {key} mentioned in the provided text is"


def follow_chain(text: str, value: str) -> list[str]:
    """The variables a chain of `VAR X = ...` lines assigns `value` to, in the order they appear."""
    names = [re.search(rf"^VAR (\w+) = {value}$", text, re.M).group(1)]
    while match := re.search(rf"^VAR (\w+) = VAR {names[-1]} $", text, re.M):
        assert text.index(match.group(0)) > text.index(f"VAR {names[-1]} =")
        names.append(match.group(1))
    return names


def test_vt_chain_leads_to_the_references(tokenizer):
    for sample in ruler.make_samples("vt", 1024, 3, 0, tokenizer, None):
        value = re.search(r"assigned the value (\d+) in the text above\.$", sample.question).group(1)
        example, task_part = sample.context.rsplit("Memorize and track", 1)
        assert follow_chain(task_part, value) == sample.references
        assert [len(name) for name in sample.references] == [5] * 5
        # The solved example before it: its answer is its own 3-letter chain.
        example_value = re.search(r"assigned the value (\d+), they are:", example).group(1)
        example_answer = example.rsplit("they are: ", 1)[1].split()
        assert follow_chain(example, example_value) == example_answer and len(example_answer[0]) == 3
        assert sample.answer_prefix == (
            "Answer: According to the chain(s) of variable assignment in the text above, 5 variables are "
            f"assigned the value {value}, they are: "
        )


@pytest.mark.parametrize(("length", "common", "uncommon"), [(1024, 6, 1), (4096, 30, 3)])
def test_cwe_references_are_the_most_common_words(length, common, uncommon, tokenizer):
    sample = ruler.make_samples("cwe", length, 1, 0, tokenizer, None)[0]
    listing = sample.context.rsplit("Memorize the ones that appear most often.\n", 1)[1]
    entries = re.findall(r"(\d+)\. (\S+)", listing)
    assert [int(number) for number, _ in entries] == list(range(1, len(entries) + 1))
    counts = Counter(word for _, word in entries)
    assert {counts[word] for word in sample.references} == {common}
    assert {count for word, count in counts.items() if word not in sample.references} == {uncommon}
    assert len(sample.references) == 10


def test_fwe_references_are_the_three_most_frequent_coded_words(tokenizer):
    for sample in ruler.make_samples("fwe", 1024, 3, 0, tokenizer, None):
        coded = sample.context.split("Find the three most frequently appeared coded words. ", 1)[1].split()
        counts = Counter(coded).most_common()
        assert counts[0][0] == "..."
        assert [word for word, _ in counts[1:4]] == sample.references
        assert counts[3][1] > counts[4][1]  # no tie with the fourth word


def test_min_lengths_are_enough(tokenizer):
    for task in OFFLINE:
        (sample,) = ruler.make_samples(task, ruler.min_length(task), 1, 0, tokenizer, None)
        assert full_tokens(sample, tokenizer) <= ruler.min_length(task)


def test_suites_use_known_tasks_at_valid_lengths():
    for name in ("ruler-1k", "ruler-4k", "ruler-smoke"):
        suite = load_suite(name)
        assert suite.tasks and suite.samples > 0 and suite.description
        assert all(suite.length >= ruler.min_length(task) for task in suite.tasks)
    assert load_suite("ruler-1k").tasks == OFFLINE and load_suite("ruler-4k").length == 4096


# ---- question answering, from fixture files in the official formats ----


def squad_fixture(articles: int = 2, paragraphs: int = 30) -> dict:
    data = []
    for a in range(articles):
        rows = []
        for p in range(paragraphs):
            qas = [
                {
                    "question": f"Who wrote part {a}.{p}?",
                    "id": f"{a}{p}",
                    "is_impossible": False,
                    "answers": [{"text": f"Author {a}{p}", "answer_start": 0}, {"text": f"author {a}{p}!"}],
                },
                {
                    "question": f"Unanswerable {a}.{p}?",
                    "id": f"u{a}{p}",
                    "is_impossible": True,
                    "answers": [],
                },
            ]
            rows.append(
                {
                    "context": f"Part {a}.{p} of article {a} was written by Author {a}{p} in a cabin.",
                    "qas": qas[::-1] if p == 0 else qas,
                }
            )
        data.append({"title": f"Article {a}", "paragraphs": rows})
    return {"version": "v2.0", "data": data}


def hotpot_fixture(examples: int = 3) -> list[dict]:
    return [
        {
            "_id": str(e),
            "question": f"Which city links fact {e}?",
            "answer": f"City {e}",
            "type": "bridge",
            "level": "easy",
            "supporting_facts": [[f"Title {e}-0", 0]],
            "context": [
                [f"Title {e}-{p}", [f"Sentence one of {e}-{p}. ", f"Sentence two of {e}-{p}."]]
                for p in range(10)
            ],
        }
        for e in range(examples)
    ]


@pytest.fixture
def offline_hub(monkeypatch):
    def unreachable(task):
        raise ConnectionError("hub unreachable")

    monkeypatch.setattr(ruler, "from_hub", unreachable)


@pytest.mark.parametrize("task", ["qa_1", "qa_2"])
def test_qa_without_data_is_unavailable(task, tmp_path, tokenizer, offline_hub):
    with pytest.raises(
        TaskUnavailable, match=re.escape(str(tmp_path / ruler.QA_FILES[task])) + ".*hub unreachable"
    ):
        ruler.make_samples(task, 2048, 1, 0, tokenizer, tmp_path)
    with pytest.raises(TaskUnavailable, match=f"--data-dir with {ruler.QA_FILES[task]}"):
        ruler.make_samples(task, 2048, 1, 0, tokenizer, None)


def test_squad_samples_from_the_official_file(tmp_path, tokenizer, offline_hub):
    (tmp_path / "dev-v2.0.json").write_text(json.dumps(squad_fixture()))
    samples = ruler.make_samples("qa_1", 1024, 2, 0, tokenizer, tmp_path)
    # Answerable questions in file order; the unanswerable one listed first is skipped.
    assert [s.question.rsplit("Question: ", 1)[1] for s in samples] == [
        "Who wrote part 0.0?",
        "Who wrote part 0.1?",
    ]
    assert samples[0].references == ["Author 00", "author 00!"]
    assert samples[0].metric == "string_match_part" and samples[0].answer_prefix == "Answer:"
    documents = re.findall(r"Document (\d+):\n(.+)", samples[0].context)
    assert [int(i) for i, _ in documents] == list(range(1, len(documents) + 1))
    texts = [text for _, text in documents]
    # All paragraphs of the gold article come first as distractors, then others fill up to the length.
    assert all(f"Part 0.{p} of article 0" in " ".join(texts) for p in range(30))
    assert 30 < len(texts) < 60
    assert 1024 - 64 <= full_tokens(samples[0], tokenizer) <= 1024
    assert samples[0].context.startswith("Answer the question based on the given documents.")
    assert samples[0].question.startswith("Answer the question based on the given documents.")


def test_hotpot_samples_from_the_official_file(tmp_path, tokenizer, offline_hub):
    (tmp_path / "hotpot_dev_distractor_v1.json").write_text(json.dumps(hotpot_fixture()))
    samples = ruler.make_samples("qa_2", 2048, 2, 0, tokenizer, tmp_path)
    assert samples[1].question.endswith("Question: Which city links fact 1?")
    assert samples[1].references == ["City 1"]
    for p in range(10):  # every paragraph of the question's own example is in the context
        assert f"Title 1-{p}\nSentence one of 1-{p}. Sentence two of 1-{p}." in samples[1].context
    with pytest.raises(ValueError, match="has 3 questions"):
        ruler.make_samples("qa_2", 2048, 4, 0, tokenizer, tmp_path)


@pytest.fixture
def forget_qa_data():
    yield
    ruler.qa_data.cache_clear()  # the fake hub data must not outlive the test


def test_hub_rows_give_the_same_samples_as_the_official_files(
    tmp_path, tokenizer, monkeypatch, forget_qa_data
):
    import datasets

    squad, hotpot = squad_fixture(), hotpot_fixture()
    squad_rows = [
        {
            "title": article["title"],
            "context": p["context"],
            "question": qa["question"],
            "answers": {"text": [a["text"] for a in qa["answers"]]},
        }
        for article in squad["data"]
        for p in article["paragraphs"]
        for qa in p["qas"]
    ]
    hotpot_rows = [
        {
            "question": e["question"],
            "answer": e["answer"],
            "context": {"title": [t for t, _ in e["context"]], "sentences": [s for _, s in e["context"]]},
        }
        for e in hotpot
    ]
    rows = {"rajpurkar/squad_v2": squad_rows, "hotpotqa/hotpot_qa": hotpot_rows}
    monkeypatch.setattr(datasets, "load_dataset", lambda name, config=None, split=None: rows[name])
    (tmp_path / "dev-v2.0.json").write_text(json.dumps(squad))
    (tmp_path / "hotpot_dev_distractor_v1.json").write_text(json.dumps(hotpot))
    for task, length in (("qa_1", 1024), ("qa_2", 2048)):
        from_hub = ruler.make_samples(task, length, 2, 3, tokenizer, None)
        assert from_hub == ruler.make_samples(task, length, 2, 3, tokenizer, tmp_path)
