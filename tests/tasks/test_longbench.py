import json
import zipfile

import pandas as pd
import pytest

from kvbench.tasks import load_samples, load_suite, score_sample
from kvbench.tasks import longbench as lb
from kvbench.tasks.base import Sample, TaskUnavailable
from kvbench.tasks.longbench_metrics import fuzz_ratio, normalize_answer

# Official THUDM/LongBench config/dataset2prompt.json entries, for hand comparison.
OFFICIAL_HOTPOTQA = (
    "Answer the question based on the given passages. Only give me the answer and do not output any other "
    "words.\n\nThe following are given passages.\n{context}\n\nAnswer the question based on the given "
    "passages. Only give me the answer and do not output any other words.\n\nQuestion: {input}\nAnswer:"
)
OFFICIAL_TREC = (
    "Please determine the type of the question below. Here are some examples of questions.\n\n"
    "{context}\n{input}"
)
OFFICIAL_LCC = "Please complete the code given below. \n{context}Next line of code:\n"
HUB_DATA_ZIP = lb.hub_data_zip  # the real one; the autouse fixture below replaces it


@pytest.fixture
def tokenizer(embedded_tokenizer):
    return embedded_tokenizer


@pytest.fixture(autouse=True)
def no_hub(monkeypatch):
    """Tests never touch the network: the hub's data.zip is absent unless a test provides one."""
    monkeypatch.setattr(lb, "hub_data_zip", lambda: None)


def row(index: int, context: str = "Passage one. Passage two.", question: str = "Who?", **fields) -> dict:
    return {
        "input": question,
        "context": context,
        "answers": ["Alice"],
        "length": 1000 * index,
        "dataset": "x",
        "language": "en",
        "all_classes": None,
        "_id": f"id{index}",
        **fields,
    }


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def samples_for(task, rows, tmp_path, tokenizer, length=7500, samples=20):
    write_jsonl(tmp_path / f"{lb.parse_task(task)[1]}.jsonl", rows)
    return lb.make_samples(task, length, samples, 0, tokenizer, tmp_path)


def test_tasks_cover_16_datasets_and_13_e_versions():
    assert sum(t.startswith("longbench/") for t in lb.TASKS) == 16
    e_tasks = {t for t in lb.TASKS if t.startswith("longbench-e/")}
    assert len(e_tasks) == 13
    assert not {"longbench-e/narrativeqa", "longbench-e/musique", "longbench-e/qmsum"} & e_tasks
    assert lb.parse_task("longbench-e/repobench-p") == ("repobench-p", "repobench-p_e")


def test_loads_first_rows_from_data_dir(tmp_path, tokenizer):
    samples = samples_for("longbench/hotpotqa", [row(i) for i in range(3)], tmp_path, tokenizer, samples=2)
    assert [s.id for s in samples] == ["id0", "id1"]
    first = samples[0]
    assert first.task == "longbench/hotpotqa"
    assert first.references == ["Alice"]
    assert (first.max_new_tokens, first.metric, first.answer_prefix) == (32, "qa_f1", "")
    assert first.meta == {"dataset": "hotpotqa", "length": 0, "all_classes": []}
    assert len(samples_for("longbench/hotpotqa", [row(0)], tmp_path, tokenizer, samples=5)) == 1


def test_longbench_e_reads_the_e_file(tmp_path, tokenizer):
    write_jsonl(tmp_path / "trec_e.jsonl", [row(0, all_classes=["Animal", "City"])])
    [sample] = lb.make_samples("longbench-e/trec", 7500, 20, 0, tokenizer, tmp_path)
    assert sample.meta["all_classes"] == ["Animal", "City"]
    with pytest.raises(TaskUnavailable, match=r"trec\.jsonl.*THUDM/LongBench") as error:
        lb.make_samples("longbench/trec", 7500, 20, 0, tokenizer, tmp_path)
    assert "\n" not in str(error.value)


def test_missing_data_without_data_dir_is_unavailable(tokenizer):
    with pytest.raises(TaskUnavailable, match="qasper_e"):
        lb.make_samples("longbench-e/qasper", 7500, 20, 0, tokenizer, None)


def test_reads_the_hub_zip_layout(tmp_path, tokenizer, monkeypatch):
    archive = tmp_path / "data.zip"
    with zipfile.ZipFile(archive, "w") as data_zip:
        data_zip.writestr("data/qasper.jsonl", json.dumps(row(4)) + "\n")
    monkeypatch.setattr(lb, "hub_data_zip", lambda: archive)
    [sample] = lb.make_samples("longbench/qasper", 7500, 20, 0, tokenizer, None)
    assert sample.id == "id4"


def test_bad_arguments_raise(tmp_path, tokenizer):
    with pytest.raises(ValueError, match="length"):
        lb.make_samples("longbench/qasper", 100, 20, 0, tokenizer, tmp_path)
    with pytest.raises(ValueError, match="samples"):
        lb.make_samples("longbench/qasper", 7500, 0, 0, tokenizer, tmp_path)


@pytest.mark.parametrize(
    ("task", "official", "question"),
    [
        ("longbench/hotpotqa", OFFICIAL_HOTPOTQA, "Question: Who?\nAnswer:"),
        ("longbench/trec", OFFICIAL_TREC, "Who?"),
        ("longbench/lcc", OFFICIAL_LCC, "Next line of code:\n"),
    ],
)
def test_prompt_is_the_official_template_split_at_the_question(task, official, question, tmp_path, tokenizer):
    data = row(0, context="Some {braces} text.", question="Who?")
    [sample] = samples_for(task, [data], tmp_path, tokenizer)
    assert sample.context + sample.question == official.format(**data)
    assert sample.question == question


def test_every_dataset_splits_into_the_official_prompt(tmp_path, tokenizer):
    for name in lb.DATASETS:
        data = row(0, context="CONTEXT-TEXT", question="INPUT-TEXT")
        [sample] = samples_for(f"longbench/{name}", [data], tmp_path, tokenizer)
        assert sample.context + sample.question == lb.PROMPTS[name].format(**data), name
        assert "CONTEXT-TEXT" in sample.context and "CONTEXT-TEXT" not in sample.question, name
        if "{input}" in lb.PROMPTS[name]:
            assert "INPUT-TEXT" in sample.question and "INPUT-TEXT" not in sample.context, name


def test_chat_template_first_line_and_generation_length_per_dataset(tmp_path, tokenizer):
    no_chat = {"trec", "triviaqa", "samsum", "lcc", "repobench-p"}
    first_line = {"trec", "triviaqa", "samsum"}
    official_max_new_tokens = {"narrativeqa": 128, "multifieldqa_en": 64, "gov_report": 512, "triviaqa": 32}
    for name in lb.DATASETS:
        [sample] = samples_for(f"longbench/{name}", [row(0)], tmp_path, tokenizer)
        assert sample.chat_template == (name not in no_chat), name
        assert sample.first_line == (name in first_line), name
        if name in official_max_new_tokens:
            assert sample.max_new_tokens == official_max_new_tokens[name]


def test_middle_truncation_keeps_head_and_tail_token_halves(tmp_path, tokenizer):
    words = " ".join(f"word{i}" for i in range(3000))
    data = row(0, context=words, question="Which word comes first?")
    [sample] = samples_for("longbench/hotpotqa", [data], tmp_path, tokenizer, length=300)
    ids = tokenizer(OFFICIAL_HOTPOTQA.format(**data)).input_ids
    assert len(ids) > 300
    expected = tokenizer.decode(ids[:150]) + tokenizer.decode(ids[-150:])
    assert sample.context + sample.question == expected
    assert sample.question == "Question: Which word comes first?\nAnswer:"
    assert sample.context.startswith("Answer the question based on the given passages.")
    assert "word0 word1" in sample.context and "word2999" in sample.context
    assert "word1500" not in sample.context


def test_prompt_within_length_is_untouched_and_one_token_over_is_cut(tmp_path, tokenizer):
    data = row(0, context=" ".join(f"w{i}" for i in range(400)))
    official = OFFICIAL_HOTPOTQA.format(**data)
    n_tokens = len(tokenizer(official).input_ids)
    [fits] = samples_for("longbench/hotpotqa", [data], tmp_path, tokenizer, length=n_tokens)
    assert fits.context + fits.question == official
    [cut] = samples_for("longbench/hotpotqa", [data], tmp_path, tokenizer, length=n_tokens - 1)
    ids = tokenizer(official).input_ids
    half = (n_tokens - 1) // 2
    assert cut.context + cut.question == tokenizer.decode(ids[:half]) + tokenizer.decode(ids[-half:])


def test_question_longer_than_half_the_budget_becomes_the_kept_tail(tmp_path, tokenizer):
    abstract = " ".join(f"abstract{i}" for i in range(400))
    data = row(0, context=" ".join(f"p{i}" for i in range(2000)), question=abstract)
    [sample] = samples_for("longbench/passage_retrieval_en", [data], tmp_path, tokenizer, length=256)
    ids = tokenizer(lb.PROMPTS["passage_retrieval_en"].format(**data)).input_ids
    assert sample.context == tokenizer.decode(ids[:128])
    assert sample.question == tokenizer.decode(ids[-128:])


def sample_with(metric: str, references: list[str], first_line: bool = False, all_classes=()) -> Sample:
    return Sample(
        task="longbench/x",
        id="0",
        context="",
        question="",
        answer_prefix="",
        references=references,
        max_new_tokens=8,
        metric=metric,
        first_line=first_line,
        meta={"all_classes": list(all_classes)},
    )


def score(metric, prediction, references, **kwargs) -> float:
    return lb.METRICS[metric](prediction, sample_with(metric, references, **kwargs))


def test_qa_f1_normalises_and_takes_the_best_reference():
    assert normalize_answer("The  Quick, brown fox!") == "quick brown fox"
    # prediction {cat, sat} vs reference {cat, sat, down}: precision 1, recall 2/3, F1 0.8
    assert score("qa_f1", "The cat sat.", ["A cat sat down"]) == pytest.approx(80.0)
    assert score("qa_f1", "The cat sat.", ["dog", "cat sat", "a cat sat down"]) == pytest.approx(100.0)
    assert score("qa_f1", "", ["cat"]) == 0.0
    assert score("qa_f1", "the a an", ["the"]) == 0.0  # both normalise to nothing


def test_first_line_cut_applies_before_scoring():
    assert score("qa_f1", "\n\nParis\nThe capital is London", ["Paris"], first_line=True) == 100.0
    # {paris, capital, is, london} vs {paris}: precision 1/4, recall 1, F1 0.4
    assert score("qa_f1", "\n\nParis\nThe capital is London", ["Paris"]) == pytest.approx(40.0)


def test_rouge_l_f():
    # The rouge package counts distinct words: the LCS "the cat on the mat" holds 4 of the 5 on each side.
    assert score("rouge", "the cat sat on the mat", ["the cat lay on the mat"]) == pytest.approx(80.0)
    assert score("rouge", "", ["the cat"]) == 0.0
    assert score("rouge", "...", ["the cat"]) == 0.0  # no sentence left once split on "."


def test_classification_with_all_classes():
    classes = ["Animal", "City", "Other location", "location"]
    assert score("classification", "City", ["City"], all_classes=classes) == 100.0
    assert score("classification", "Animal or City", ["City"], all_classes=classes) == 50.0
    assert score("classification", "Animal", ["City"], all_classes=classes) == 0.0
    # "location" is a strict substring of the reference, so it does not dilute the match
    assert score("classification", "Other location", ["Other location"], all_classes=classes) == 100.0
    # the official loop skips the entry after a removed one: "color" survives, so 1/2
    quirk = ["food", "color", "food color"]
    assert score("classification", "food color", ["food color"], all_classes=quirk) == 50.0


def test_retrieval_and_count_share_of_numbers():
    assert score("retrieval", "Paragraph 3", ["Paragraph 3"]) == 100.0
    assert score("retrieval", "Paragraph 3 or Paragraph 13", ["Paragraph 3"]) == 50.0
    assert score("retrieval", "I do not know", ["Paragraph 3"]) == 0.0
    assert score("count", "There are 7 unique paragraphs out of 10.", ["7"]) == 50.0
    assert score("count", "7", ["7"]) == 100.0


def test_code_sim_uses_the_first_code_line():
    assert score("code_sim", "```python\n# set x\nx = foo(1)\ny = 2", ["x = foo(1)"]) == 100.0
    # SequenceMatcher: 8 matching chars of 9 + 9 -> round(100 * 16 / 18) = 89
    assert score("code_sim", "\n// done\nreturn a;", ["return b;"]) == 89.0
    assert score("code_sim", "# only comments", ["x"]) == 0.0


# (prediction line, reference line, fuzzywuzzy 0.18.0's fuzz.ratio without python-Levenshtein, as LongBench
# scores code_sim). rapidfuzz's fuzz.ratio gives 12.5, 40.0 and 57.8 on the three rows marked *.
FUZZYWUZZY_RATIOS = [
    ("x = foo(1)", "x = foo(1)", 100),
    ("", "", 100),  # equal strings before the empty-string rule
    ("", "return a;", 0),
    ("return a;", "return b;", 89),
    ("axxxxxxx", "ayyyyyyy", 12),  # * 12.5, rounded half to even
    ("ab", "ba", 50),
    ("        if (node == null) return;", "        if (node == null) { return; }", 94),
    ("    return self._cache.get(key)", "        return self._cache[key]", 81),
    ("public void setName(String name) {", "    this.name = name;", 36),  # *
    ("for i in range(len(xs)):", "for i, x in enumerate(xs):", 68),
    ("int count = list.size();", "int n = items.length;", 49),  # *
    ("résumé = données[0]", "resume = donnees[0]", 84),
]


@pytest.mark.parametrize(("prediction", "reference", "expected"), FUZZYWUZZY_RATIOS)
def test_code_sims_ratio_is_fuzzywuzzys(prediction, reference, expected):
    assert fuzz_ratio(prediction, reference) == expected
    assert score("code_sim", prediction, [reference]) == expected


def test_code_sims_ratio_on_long_lines_keeps_difflibs_autojunk():
    # Past 200 characters SequenceMatcher treats frequent characters as junk: fuzzywuzzy scores this 82,
    # where the matching without autojunk would give 93.
    reference = "self.assertEqual(response.status_code, 200, msg=f'bad status for {url}: {response.text!r}') "
    reference *= 3
    prediction = reference.replace("200", "201").replace("bad", "unexpected")
    assert fuzz_ratio(prediction, reference) == 82


def test_registry_loads_and_scores_longbench(tmp_path, tokenizer):
    write_jsonl(tmp_path / "passage_count.jsonl", [row(0, answers=["4"])])
    [sample] = load_samples(
        "longbench/passage_count", length=7500, samples=1, seed=0, tokenizer=tokenizer, data_dir=tmp_path
    )
    assert score_sample(sample, "4") == 100.0
    assert score_sample(sample, "3 or 4") == 50.0
    suite = load_suite("longbench")
    assert set(suite.tasks) == {t for t in lb.TASKS if t.startswith("longbench/")}
    assert (suite.length, suite.samples) == (None, 20)  # the model's own limit, as THUDM's pred.py
    assert set(load_suite("longbench-e").tasks) == {t for t in lb.TASKS if t.startswith("longbench-e/")}


def test_longbench_average_by_category_and_overall():
    averages = lb.longbench_average(
        {"longbench/qasper": 10.0, "longbench/narrativeqa": 20.0, "longbench/hotpotqa": 60.0}
    )
    assert averages == {"Single-Doc QA": 15.0, "Multi-Doc QA": 60.0, "Average": 30.0}
    with pytest.raises(ValueError, match="twice"):
        lb.longbench_average({"longbench/qasper": 1.0, "longbench-e/qasper": 2.0})


def test_longbench_e_buckets_by_word_length():
    rows = pd.DataFrame(
        {
            "press": ["knorm"] * 5,
            "task": ["longbench-e/qasper"] * 4 + ["longbench/qasper"],
            "score": [10.0, 30.0, 50.0, 70.0, 99.0],
            "meta": [{"length": n} for n in (100, 3999, 4000, 12000, 100)],
        }
    )
    table = lb.longbench_e_buckets(rows)
    assert table.loc[("knorm", "longbench-e/qasper")].tolist() == [20.0, 50.0, 70.0]


def test_hub_zip_comes_from_the_cache_or_not_at_all_when_offline(monkeypatch, tmp_path):
    import huggingface_hub  # read by hub_data_zip when called

    monkeypatch.setattr(lb, "hub_data_zip", HUB_DATA_ZIP)
    monkeypatch.setattr(huggingface_hub, "is_offline_mode", lambda: True)
    monkeypatch.setattr(lb, "hub_is_reachable", lambda: pytest.fail("offline mode must not probe the hub"))
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda *args, **kwargs: None)
    assert lb.hub_data_zip() is None
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda *a, **k: str(tmp_path / "data.zip"))
    assert lb.hub_data_zip() == tmp_path / "data.zip"


def test_official_length_is_thudms_per_model_max_length():
    # THUDM/LongBench config/model2maxlen.json: 4k, 8k, 16k and 32k models.
    assert [lb.official_length(n) for n in (4096, 8192, 16384, 32768)] == [3500, 7500, 15500, 31500]


def test_a_truncated_prompt_is_cut_in_the_middle_and_warned_about(tmp_path, tokenizer, caplog):
    rows = [row(0, context="start " + "filler " * 600 + "end"), row(1)]
    with caplog.at_level("WARNING", logger="kvbench.tasks.longbench"):
        long, short = samples_for("longbench/hotpotqa", rows, tmp_path, tokenizer, length=300)
    assert "longbench/hotpotqa: 1 of 2 prompts truncated in the middle to 300 tokens" in caplog.text
    prompt = long.context + long.question
    assert prompt.startswith("Answer the question") and prompt.endswith("Question: Who?\nAnswer:")
    assert "start" in prompt and "end" in prompt and prompt.count("filler") < 600
    assert len(tokenizer(prompt).input_ids) <= 302  # the halves re-tokenize to about the same count
    assert "filler" not in short.context


def test_without_length_the_cli_truncates_to_the_models_own_limit(tmp_path, tokenizer, caplog, tiny_model):
    """A 1500-token model: THUDM's rule gives 1000 - 500 = 500 tokens; the row records that length."""
    from click.testing import CliRunner

    from kvbench.cli import main
    from kvbench.store.results import load_rows

    model_dir = tmp_path / "model"
    tiny_model("llama", len(tokenizer), max_position_embeddings=1500).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    data = tmp_path / "data"
    data.mkdir()
    write_jsonl(data / "hotpotqa.jsonl", [row(0, context="start " + "filler " * 1200 + "end")])
    out = tmp_path / "out"
    args = ["run", "--press", "knorm", "--ratio", "0.5", "--task", "longbench/hotpotqa", "--samples", "1"]
    with caplog.at_level("WARNING", logger="kvbench.tasks.longbench"):
        result = CliRunner().invoke(
            main, [*args, "--data-dir", str(data), "--model", str(model_dir), "--out", str(out)]
        )
    assert result.exit_code == 0, result.output
    assert "1 of 1 prompts truncated in the middle to 500 tokens" in caplog.text
    [scored] = load_rows(out).to_dict("records")
    assert scored["length"] == 500 and 490 <= scored["context_tokens"] <= 500 + 40  # plus the chat template
    # Asking for more than the model's context is refused before any work.
    again = CliRunner().invoke(
        main,
        [*args, "--length", "2000", "--data-dir", str(data), "--model", str(model_dir), "--out", str(out)],
    )
    assert again.exit_code == 2 and "--length 2000 exceeds the 1500-token context" in again.output
