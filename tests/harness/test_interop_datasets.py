"""kvbench export/import --format kvpress beyond RULER: LongBench, LongBench-E, LongBench-v2, InfiniteBench,
LooGLE, needle in a haystack, AIME25 and MATH-500 (kvbench.harness.interop), and ZeroSCROLLS refused.

kvbench's rows are built here as its loaders make them (task, references, meta) and scored with kvbench's
metrics; kvpress's folders are written here as its evaluate.py writes them (evaluation/evaluate.py, each
benchmark's calculate_metrics.py and create_huggingface_dataset.py in NVIDIA/kvpress)."""

import json
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from click.testing import CliRunner

from kvbench.cli import main
from kvbench.core.errors import KvbenchWarning
from kvbench.harness.interop import import_kvpress
from kvbench.store.results import Row, config_id, load_rows
from kvbench.tasks import score_sample
from kvbench.tasks.base import Sample

MODEL = "smollm2-135m"
KNORM = "smollm2-135m__knorm__0.50"
NEEDLE = "The best thing to do in San Francisco is eat a sandwich."
CLOZE = json.dumps({"<mask-0>": "Bob", "<mask-1>": "Ann"})


def invoke(*args):
    return CliRunner().invoke(main, [str(arg) for arg in args])


def refused(outcome, *words: str) -> None:
    assert outcome.exit_code == 2, outcome.output
    lines = outcome.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error:"), outcome.output
    assert all(word in lines[0] for word in words), lines[0]


# ---- kvbench's rows ----


def kvbench_row(task, sample_id, prediction, references, metric, meta=None, length=2048, **flags) -> dict:
    """A row as `kvbench run` writes it (`press` and `ratio` in flags, knorm at 0.5 by default), scored with
    kvbench's metric."""
    press, ratio = flags.pop("press", "knorm"), flags.pop("ratio", 0.5)
    sample = Sample(task, sample_id, "", "", "", references, 1, metric, meta=meta or {}, **flags)
    return Row(
        config_id=config_id(MODEL, press, ratio, {}),
        model=MODEL,
        press=press,
        ratio=ratio,
        task=task,
        length=length,
        seed=0,
        sample_id=sample_id,
        prediction=prediction,
        references=references,
        score=score_sample(sample, prediction),
        meta=meta or {},
    ).to_dict()


V2 = {"domain": "QA", "sub_domain": "Legal"}
# Per dataset, (task, sample id, prediction, references, metric, meta, flags) as its loader makes them.
SAMPLES = {
    "longbench": [
        ("longbench/qasper", "q1", "the cat", ["the cat"], "qa_f1", {"length": 3000}, {}),
        ("longbench/qasper", "q2", "a dog sat", ["the cat sat"], "qa_f1", {"length": 900}, {}),
        (
            "longbench/trec",
            "t1",
            "Location\nPerson",
            ["Location"],
            "classification",
            {"dataset": "trec", "length": 500, "all_classes": ["Location", "Person"]},
            {"first_line": True},
        ),
    ],
    "longbench-e": [
        ("longbench-e/qasper", "e1", "the cat", ["the cat"], "qa_f1", {"length": 3000}, {}),
        ("longbench-e/qasper", "e2", "a dog", ["the cat"], "qa_f1", {"length": 5000}, {}),
        ("longbench-e/qasper", "e3", "the cat", ["the cat", "a cat"], "qa_f1", {"length": 9000}, {}),
    ],
    "longbench-v2": [
        (
            "longbench-v2",
            "v1",
            "The correct answer is (B)",
            ["B"],
            "longbench_v2_accuracy",
            {**V2, "difficulty": "hard", "length_class": "long"},
            {},
        ),
        (
            "longbench-v2/short",
            "v2",
            "The correct answer is A",
            ["C"],
            "longbench_v2_accuracy",
            {**V2, "difficulty": "easy", "length_class": "short"},
            {},
        ),
    ],
    "infinitebench": [
        (
            "infinitebench/passkey",
            "0",
            "71432.",
            ["71432"],
            "infinitebench_passkey",
            {"label": ["71432"]},
            {},
        ),
        ("infinitebench/code_run", "1", "It is 4", ["4"], "infinitebench_code_run", {"label": [4]}, {}),
        ("infinitebench/math_find", "2", "9", ["9"], "infinitebench_math_find", {"label": [9]}, {}),
        (
            "infinitebench/math_calc",
            "3",
            "[1, 4, 7]",
            ["[1, 4, 8]"],
            "infinitebench_math_calc",
            {"label": [[1, 4, 8]]},
            {},
        ),
        (
            "infinitebench/longbook_choice_eng",
            "4",
            "B",
            ["Georgie", "B"],
            "infinitebench_longbook_choice_eng",
            {"label": ["Georgie", "B"]},
            {},
        ),
        (
            "infinitebench/code_debug",
            "5",
            "func_a",
            ["func_a", "C"],
            "infinitebench_code_debug",
            {"label": ["func_a", "C"]},
            {},
        ),
    ],
    "loogle": [
        (
            "loogle/shortdep_qa",
            "0.0",
            "Paris is the capital",
            ["The capital is Paris"],
            "loogle_rouge_l",
            {},
            {},
        ),
        ("loogle/shortdep_qa", "0.1", "", ["Berlin"], "loogle_rouge_l", {}, {}),
        ("loogle/shortdep_cloze", "0.0", "{'<mask-0>': 'Bob'}", [CLOZE], "loogle_exact_match", {}, {}),
        ("loogle/shortdep_cloze", "0.1", "Bob and Ann", [CLOZE], "loogle_exact_match", {}, {}),
    ],
    "needle_in_haystack": [
        (
            "needle_in_haystack",
            "2048-0",
            f"{NEEDLE} Yes.",
            [NEEDLE],
            "needle_rouge",
            {"length": 2048, "depth": 0},
            {},
        ),
        (
            "needle_in_haystack",
            "1024-50",
            "The park.",
            [NEEDLE],
            "needle_rouge",
            {"length": 1024, "depth": 50},
            {},
        ),
    ],
    "aime25": [
        ("aime25", "0", "so \\boxed{70}", ["70"], "math_equivalence", {}, {}),
        ("aime25", "1", "\\boxed{070}", ["70"], "math_equivalence", {}, {}),
    ],
    "math500": [
        ("math500", "test/a/1.json", "\\boxed{\\frac{14}{3}}", ["\\frac{14}{3}"], "math_equivalence", {}, {}),
        ("math500", "test/a/2.json", "\\boxed{5}", ["5"], "math_equivalence", {}, {}),
    ],
}


def results_folder(folder: Path, dataset: str) -> Path:
    """kvbench rows of `dataset`: knorm at 0.5 with the predictions above, none (ratio 0) with the
    reference (the prediction where the reference is not an answer: the cloze's, math's)."""
    rows = []
    for task, sample_id, prediction, references, metric, meta, flags in SAMPLES[dataset]:
        rows.append(kvbench_row(task, sample_id, prediction, references, metric, meta, **flags))
        right = prediction if metric in ("loogle_exact_match", "math_equivalence") else references[-1]
        none = {"press": "none", "ratio": 0.0, **flags}
        rows.append(kvbench_row(task, sample_id, right, references, metric, meta, **none))
    folder.mkdir(parents=True)
    (folder / "rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return folder


def scores(rows, suffix: str = "") -> list[tuple]:
    """Sorted (press, ratio, task, score) of the rows, `suffix` taken off press names; longbench-v2's subsets
    as longbench-v2, which they come back as."""
    columns = (rows["press"], rows["ratio"], rows["task"], rows["score"])
    return sorted(
        (press.removesuffix(suffix), ratio, task.split("/")[0] if "v2" in task else task, round(score, 6))
        for press, ratio, task, score in zip(*columns, strict=True)
    )


ROUND_TRIP = {  # a folder of each export
    "longbench": f"longbench__qasper__{KNORM}__max_context2048",
    "longbench-e": f"longbench-e__qasper_e__{KNORM}__max_context2048",
    "longbench-v2": f"longbench-v2__0shot__{KNORM}__max_context2048",
    "infinitebench": f"infinitebench__code_debug__{KNORM}__max_context2048",
    "loogle": f"loogle__shortdep_cloze__{KNORM}__max_context2048",
    "needle_in_haystack": f"needle_in_haystack__{KNORM}__max_context1024__needle_depth50",
    "aime25": f"aime25__{KNORM}__max_context2048",
    "math500": "math500__smollm2-135m__no_press__0.00__max_context2048",
}


@pytest.mark.parametrize("dataset", list(ROUND_TRIP))
def test_export_then_import_gives_back_the_scores(tmp_path, dataset):
    results = results_folder(tmp_path / "results", dataset)
    outcome = invoke("export", "--format", "kvpress", results, tmp_path / "kvpress")
    assert outcome.exit_code == 0, outcome.output
    folder = tmp_path / "kvpress" / ROUND_TRIP[dataset]
    assert sorted(path.name for path in folder.iterdir()) == [
        "config.yaml",
        "metrics.json",
        "predictions.csv",
    ]
    assert yaml.safe_load((folder / "config.yaml").read_text())["dataset"] == dataset
    with warnings.catch_warnings():
        warnings.simplefilter("error", KvbenchWarning)  # the exported figures are what the rows give back
        import_kvpress(tmp_path / "kvpress", tmp_path / "back")
    original, back = load_rows(results), load_rows(tmp_path / "back")
    assert scores(back, " (kvpress)") == scores(original)
    assert all(meta["imported"] == "kvpress" for meta in back["meta"])


def exported_metrics(tmp_path, dataset: str, folder: str):
    results = results_folder(tmp_path / "results", dataset)
    assert invoke("export", "--format", "kvpress", results, tmp_path / "kvpress").exit_code == 0
    return json.loads((tmp_path / "kvpress" / folder / "metrics.json").read_text())


def test_exported_metrics_have_kvpress_shapes(tmp_path):
    lb = exported_metrics(tmp_path / "lb", "longbench", f"longbench__qasper__{KNORM}__max_context2048")
    assert lb == 75.0  # the mean of 100 and 50 (F1 of "dog sat" against "cat sat"), rounded to 2
    e = exported_metrics(tmp_path / "e", "longbench-e", f"longbench-e__qasper_e__{KNORM}__max_context2048")
    assert e == {"0-4k": 100.0, "4-8k": 0.0, "8k+": 100.0}
    v2 = exported_metrics(tmp_path / "v2", "longbench-v2", f"longbench-v2__0shot__{KNORM}__max_context2048")
    assert v2 == {"average": 0.5, "easy": 0.0, "hard": 1.0, "long": 1.0, "short": 0.0}
    ib = exported_metrics(
        tmp_path / "ib", "infinitebench", f"infinitebench__passkey__{KNORM}__max_context2048"
    )
    assert ib == 1.0
    cloze = exported_metrics(tmp_path / "lg", "loogle", f"loogle__shortdep_cloze__{KNORM}__max_context2048")
    assert cloze == {"shortdep_cloze": {"exact_match": round(1 / 3, 4)}}  # 1 mask of 2, 0 of 1 (no dict)
    name = f"needle_in_haystack__{KNORM}__max_context2048__needle_depth0"
    found = exported_metrics(tmp_path / "n", "needle_in_haystack", name)
    assert len(found) == 1 and set(found[0]) == {"rouge-1", "rouge-2", "rouge-l"}
    assert 0.5 < found[0]["rouge-l"]["f"] < 1.0
    # kvpress's string match, not math-verify: "070" is not "70", yet kvbench's row scores it 100.
    aime = exported_metrics(tmp_path / "a", "aime25", f"aime25__{KNORM}__max_context2048")
    assert aime == {"correct": 1, "answered": 2, "accuracy": 0.5, "total": 2}
    math500 = exported_metrics(tmp_path / "m", "math500", f"math500__{KNORM}__max_context2048")
    assert math500["accuracy"] == 0.5  # kvpress reads "\frac{14" of \boxed{\frac{14}{3}}


def test_export_keeps_longbench_lengths_apart(tmp_path):
    rows = [
        kvbench_row("longbench/qasper", "q1", "the cat", ["the cat"], "qa_f1", {"length": 10}, length=length)
        for length in (1024, 2048)
    ]
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert invoke("export", "--format", "kvpress", tmp_path / "results", tmp_path / "kvpress").exit_code == 0
    assert sorted(path.name for path in (tmp_path / "kvpress").iterdir()) == [
        f"longbench__qasper__{KNORM}__max_context1024",
        f"longbench__qasper__{KNORM}__max_context2048",
    ]


# ---- kvpress's folders ----

FIELDS = (  # EvaluationConfig's fields, in order, as save_config writes them (no threshold, no head ratio)
    "dataset data_dir model device press_name compression_ratio key_channel_compression_ratio fraction "
    "max_new_tokens max_context_length query_aware needle_depth compression_interval target_size "
    "hidden_states_buffer_size output_dir log_level model_kwargs press_init_command seed fp8"
).split()


def array(*values: str):
    """A list cell of kvpress's datasets: a numpy array, which pandas writes as numpy prints it."""
    return np.array(values, dtype=object)


def table(columns: str, *rows: tuple) -> list[dict]:
    """Dataset rows (with their context) and predictions, by column."""
    return [dict(zip(columns.split(), row, strict=True)) for row in rows]


def kvpress_folder(root: Path, dataset: str, lines: list[dict], metrics, **config) -> Path:
    """One folder as evaluate.py writes it: get_results_dir's name, predictions.csv with the columns in set
    order (`list(set(df.columns) - {"context"})`), metrics.json by json.dump(indent=4), save_config's YAML."""
    values = {"dataset": dataset, "model": "Qwen/Qwen3-8B", "device": "cuda:0", "press_name": "knorm"}
    values |= {"compression_ratio": 0.5, "fraction": 1.0, "query_aware": False, "output_dir": "./results"}
    values |= {"log_level": "INFO", "model_kwargs": {}, "seed": 42, "fp8": False, **config}
    values["press_init_command"] = f"{values['press_name']}()"
    ratio = f"{values['compression_ratio']:.2f}"
    parts = [dataset, values.get("data_dir"), "Qwen--Qwen3-8B", values["press_name"], ratio]
    if values.get("max_context_length") is not None:
        parts.append(f"max_context{values['max_context_length']}")
    if values["query_aware"]:
        parts.append("query_aware")
    if dataset == "needle_in_haystack":
        parts.append(f"needle_depth{values['needle_depth']}")
    folder = root / "__".join(part for part in parts if part)
    folder.mkdir(parents=True)
    frame = pd.DataFrame(lines)
    frame["compression_ratio"] = values["compression_ratio"]
    frame[list(set(frame.columns) - {"context"})].to_csv(folder / "predictions.csv", index=False)
    (folder / "metrics.json").write_text(json.dumps(metrics, indent=4))
    config_yaml = {name: values.get(name) for name in FIELDS}
    (folder / "config.yaml").write_text(
        yaml.dump(config_yaml, default_flow_style=False, indent=2, sort_keys=False)
    )
    return folder


def imported(tmp_path, root: Path):
    """Import `root` with no warning (every published figure given back), and its rows."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", KvbenchWarning)
        import_kvpress(root, tmp_path / "imported")
    return load_rows(tmp_path / "imported")


def by_id(rows) -> dict:
    return dict(zip(rows["sample_id"], zip(rows["score"], rows["meta"], strict=True), strict=True))


LONGBENCH = (
    "context question answers length dataset language all_classes _id answer_prefix task max_new_tokens"
)


def test_kvpress_longbench_folders_import(tmp_path):
    root = tmp_path / "kvpress"
    columns = f"{LONGBENCH} predicted_answer"
    qasper = table(
        columns,
        (
            "doc",
            "Q?",
            array("the cat"),
            3100,
            "qasper",
            "en",
            None,
            "abc",
            "Answer:",
            "qasper",
            148,
            " the cat",
        ),
        (
            "doc",
            "Q?",
            array("a dog", "the dog"),
            8200,
            "qasper",
            "en",
            None,
            "def",
            "Answer:",
            "qasper",
            148,
            "no",
        ),
    )
    kvpress_folder(root, "longbench", qasper, 50.0, data_dir="qasper")
    buckets = {"0-4k": 100.0, "4-8k": float("nan"), "8k+": 0.0}  # json.dump's NaN: np.mean of no scores
    kvpress_folder(root, "longbench-e", qasper, buckets, data_dir="qasper_e")
    classes = array("Location", "Person")
    trec = table(
        columns,
        (
            "doc",
            "Q?",
            array("Location"),
            500,
            "trec",
            "en",
            classes,
            "t1",
            "Type:",
            "trec",
            84,
            "Location\nPerson",
        ),
    )
    kvpress_folder(root, "longbench", trec, 100.0, data_dir="trec", max_context_length=4096)
    rows = imported(tmp_path, root)
    assert sorted(set(rows["task"])) == ["longbench-e/qasper", "longbench/qasper", "longbench/trec"]
    lb = by_id(rows[rows["task"] == "longbench/qasper"])
    assert lb["abc"][0] == 100.0 and lb["def"][0] == 0.0 and lb["abc"][1]["kvpress_score"] == 50.0
    e = by_id(rows[rows["task"] == "longbench-e/qasper"])
    assert e["abc"][1]["kvpress_score"] == 100.0 and e["def"][1]["kvpress_score"] == 0.0
    trec_rows = rows[rows["task"] == "longbench/trec"]
    assert list(trec_rows["length"]) == [4096] and list(trec_rows["score"]) == [100.0]  # its first line


def test_kvpress_longbench_v2_folder_imports(tmp_path):
    columns = (
        "_id domain sub_domain difficulty length question choice_A choice_B choice_C choice_D answer context "
        "max_new_tokens answer_prefix predicted_answer"
    )
    choices = ("x", "y", "z", "w")
    lines = table(
        columns,
        (
            "a1",
            "Code",
            "Repo",
            "hard",
            "long",
            "Q",
            *choices,
            "B",
            "doc",
            16,
            "",
            "The correct answer is (B).",
        ),
        (
            "a2",
            "QA",
            "Legal",
            "easy",
            "short",
            "Q",
            *choices,
            "D",
            "doc",
            16,
            "",
            "**The correct answer is D**",
        ),
        ("a3", "QA", "Legal", "easy", "short", "Q", *choices, "A", "doc", 16, "", "I think C"),
    )
    metrics = {"average": 2 / 3, "easy": 0.5, "hard": 1.0, "long": 1.0, "short": 0.5}
    kvpress_folder(tmp_path / "kvpress", "longbench-v2", lines, metrics, data_dir="0shot")
    rows = imported(tmp_path, tmp_path / "kvpress")
    assert set(rows["task"]) == {"longbench-v2"}
    found = by_id(rows)
    assert [found[i][0] for i in ("a1", "a2", "a3")] == [100.0, 100.0, 0.0]
    assert found["a1"][1]["length_class"] == "long" and found["a1"][1]["difficulty"] == "hard"
    assert found["a1"][1]["kvpress_score"] == pytest.approx(200 / 3)


INFINITEBENCH = "context question answer_prefix answer task max_new_tokens predicted_answer"
OPTIONS = (
    "\n\nOnly one of the following options is correct, tell me the answer using one single letter (A, B, C, "
    "or D). Don't say anything else.\nA. Ann\nB. Georgie\nC. Bob\nD. Eve"
)


def test_kvpress_infinitebench_folders_import(tmp_path):
    root = tmp_path / "kvpress"
    passkey = table(
        INFINITEBENCH,
        ("...", "What is the pass key?", "The pass key is:", array("71432"), "passkey", 26, " 71432"),
        ("...", "What is the pass key?", "The pass key is:", array("11111"), "passkey", 26, " 2"),
    )
    kvpress_folder(root, "infinitebench", passkey, 0.5, data_dir="passkey")
    prefix = "The letter of the correct answer is"
    choice = table(
        INFINITEBENCH,
        ("...", "Who walks?" + OPTIONS, prefix, array("B"), "longbook_choice_eng", 60, "answer is: Georgie"),
    )
    kvpress_folder(root, "infinitebench", choice, 1.0, data_dir="longbook_choice_eng")
    # Query-aware: the question is compressed with the context, predictions.csv's question is empty.
    choice = table(INFINITEBENCH, ("...Who walks?", "", prefix, array("B"), "longbook_choice_eng", 60, "B"))
    kvpress_folder(root, "infinitebench", choice, 1.0, data_dir="longbook_choice_eng", query_aware=True)
    rows = imported(tmp_path, root)
    passkeys = rows[rows["task"] == "infinitebench/passkey"]
    assert sorted(passkeys["score"]) == [0.0, 100.0] and {m["kvpress_score"] for m in passkeys["meta"]} == {
        50.0
    }
    chosen = rows[rows["task"] == "infinitebench/longbook_choice_eng"]
    assert list(chosen["score"]) == [100.0, 100.0]
    assert sorted(map(tuple, chosen["references"])) == [("B",), ("Georgie", "B")]


def test_kvpress_infinitebench_code_run_published_zero_is_said(tmp_path):
    # kvpress's copy of the scorer compares the label "4" (a string) with the int 4: its code_run scores 0.
    lines = table(INFINITEBENCH, ("...", "", "The return value is:", array("4"), "code_run", 25, " 4"))
    kvpress_folder(tmp_path / "kvpress", "infinitebench", lines, 0.0, data_dir="code_run")
    with pytest.warns(KvbenchWarning, match="score is published as 0.0; its predictions give 100.00"):
        import_kvpress(tmp_path / "kvpress", tmp_path / "out")
    assert list(load_rows(tmp_path / "out")["score"]) == [100.0]


LOOGLE = "context question answer_prefix answer task max_new_tokens predicted_answer"


def test_kvpress_loogle_folders_import(tmp_path):
    root = tmp_path / "kvpress"
    prediction, answer = "Paris is the capital", "The capital is Paris"
    qa = table(LOOGLE, ("...", "\nQuestion: Capital?\n", "Answer: ", answer, "shortdep_qa", 300, prediction))
    recall = kvbench_row("loogle/shortdep_qa", "x", prediction, [answer], "loogle_rouge_l")["score"] / 100
    figures = {"bleu1": 0.2, "bleu4": 0.0, "rouge-1": 0.9, "rouge-2": 0.3, "rouge-l": recall, "meteor": 0.4}
    kvpress_folder(root, "loogle", qa, {"shortdep_qa": {**figures, "bert": 0.8}}, data_dir="shortdep_qa")
    question = "\n Question: <mask-0> met <mask-1>. What are the masked entities?\n"
    cloze = table(
        LOOGLE,
        ("...", question, "Answer:", CLOZE, "shortdep_cloze", 50, "{'<mask-0>': 'Bob', '<mask-1>': 'Ann'}"),
        ("...", question, "Answer:", CLOZE, "shortdep_cloze", 50, "Bob, Ann"),
    )
    # get_exact_match: 2 masks of 2, then a prediction that is no dict: 0 of 1.
    metrics = {"shortdep_cloze": {"exact_match": round(2 / 3, 4), "partial_match": round(2 / 3, 4)}}
    kvpress_folder(root, "loogle", cloze, metrics, data_dir="shortdep_cloze")
    rows = imported(tmp_path, root)
    assert list(rows[rows["task"] == "loogle/shortdep_qa"]["score"]) == [pytest.approx(100 * recall)]
    cloze_rows = rows[rows["task"] == "loogle/shortdep_cloze"]
    assert sorted(cloze_rows["score"]) == [0.0, 100.0]
    assert [m["kvpress_score"] for m in cloze_rows["meta"]] == [pytest.approx(66.67)] * 2


def test_kvpress_needle_folder_imports(tmp_path):
    from rouge import Rouge

    prediction = f"{NEEDLE} Indeed."
    columns = "context needle needle_depth question answer_prefix max_new_tokens predicted_answer"
    lines = table(columns, ("<book>", NEEDLE, 50, "What is the best thing?", "Answer:", 64, prediction))
    metrics = [Rouge().get_scores(NEEDLE.strip(), prediction.strip())[0]]
    kvpress_folder(
        tmp_path / "kvpress", "needle_in_haystack", lines, metrics, max_context_length=4096, needle_depth=50
    )
    rows = imported(tmp_path, tmp_path / "kvpress")
    assert list(rows["sample_id"]) == ["4096-50"] and list(rows["length"]) == [4096]
    assert rows["score"].iloc[0] == pytest.approx(100 * metrics[0]["rouge-l"]["f"])
    assert rows["meta"].iloc[0]["depth"] == 50


@pytest.mark.parametrize(
    "dataset, answer, predictions, correct, scores",
    [
        # kvpress's string match: "070" is not "70"; kvbench's math-verify: both are 70.
        ("aime25", "70", ["so \\boxed{70}", "\\boxed{070}"], 1, [100.0, 100.0]),
        # kvpress reads "\frac{14" of the first box; math-verify finds the fraction.
        ("math500", "\\frac{14}{3}", ["\\boxed{\\frac{14}{3}}", "none"], 0, [0.0, 100.0]),
    ],
)
def test_kvpress_math_folders_import(tmp_path, dataset, answer, predictions, correct, scores):
    columns = "context question answer_prefix answer max_new_tokens predicted_answer"
    lines = table(columns, *((" ", "Problem", "", answer, 32000, prediction) for prediction in predictions))
    answered = sum("boxed{" in prediction for prediction in predictions)
    metrics = {"correct": correct, "answered": answered, "accuracy": correct / 2, "total": 2}
    kvpress_folder(tmp_path / "kvpress", dataset, lines, metrics)
    rows = imported(tmp_path, tmp_path / "kvpress")
    assert set(rows["task"]) == {dataset} and sorted(rows["score"]) == scores
    assert {m["kvpress_score"] for m in rows["meta"]} == {50.0 * correct}


# ---- refused ----


def test_bad_kvpress_folders_are_refused_in_one_line_and_nothing_is_written(tmp_path):
    def attempt(name, dataset, lines, metrics, *words, **config):
        kvpress_folder(tmp_path / name, dataset, lines, metrics, **config)
        refused(invoke("import", "--format", "kvpress", tmp_path / name, tmp_path / "out"), *words)
        assert not (tmp_path / "out").exists()

    passkey = table(INFINITEBENCH, ("...", "", "", array("1"), "passkey", 26, "1"))
    # Another dataset's metrics.json (ruler's) in an infinitebench folder.
    ruler = {"passkey": {"string_match": 100.0}}
    attempt("a", "infinitebench", passkey, ruler, "metrics.json", data_dir="passkey")
    # A column the scorer reads, missing.
    lines = table("_id difficulty answer predicted_answer", ("a1", "hard", "B", "The correct answer is B"))
    attempt("b", "longbench-v2", lines, {"average": 1.0}, "predictions.csv", "'length'", data_dir="0shot")
    # Another dataset's task, metrics.json without the figure import reads, a cloze answer without masks.
    qa = [{**passkey[0], "answer": "1"}]
    attempt("c", "loogle", qa, {"passkey": {"rouge-l": 1.0}}, "'passkey'", "loogle", data_dir="passkey")
    qa = [{**qa[0], "task": "shortdep_qa"}]
    attempt("d", "loogle", qa, {"shortdep_qa": {"bleu1": 1.0}}, "shortdep_qa.rouge-l", data_dir="shortdep_qa")
    cloze = [{**qa[0], "answer": "Bob", "task": "shortdep_cloze"}]
    attempt("e", "loogle", cloze, {"shortdep_cloze": {"exact_match": 0.0}}, "predictions.csv", "masks")
    # What kvpress's runs of a dataset set, missing.
    needle = table("needle needle_depth predicted_answer", (NEEDLE, 10, NEEDLE))
    attempt("f", "needle_in_haystack", needle, [], "config.yaml", "max_context_length", needle_depth=10)
    math = table("answer predicted_answer", ("70", "70"))
    attempt("g", "aime25", math, {"correct": 1}, "metrics.json", "accuracy")
    # code_debug's letter alone, without the question's options: kvbench's scorer needs the function.
    debug = [{**passkey[0], "answer": array("B"), "task": "code_debug"}]
    attempt("h", "infinitebench", debug, 0.0, "predictions.csv", "function", data_dir="code_debug")
    # A number's answer that is not one.
    find = [{**passkey[0], "answer": array("nine"), "task": "math_find"}]
    attempt("k", "infinitebench", find, 0.0, "predictions.csv", "not numbers", data_dir="math_find")
    # No counterpart: ZeroSCROLLS's test split, a DecodingPress.
    scrolls = table("answer task predicted_answer", ("", "qasper", "x"))
    attempt("i", "zero_scrolls", scrolls, {}, "config.yaml", "test split", "validation")
    decoding = {"press_name": "decoding_knorm", "compression_interval": 16}
    attempt("j", "aime25", math, {"accuracy": 1.0}, "config.yaml", "DecodingPress", **decoding)
    assert [path.name for path in tmp_path.iterdir() if path.name.startswith(".")] == []


def test_zero_scrolls_rows_are_not_exported(tmp_path):
    row = kvbench_row("zero_scrolls/qasper", "z1", "yes", ["yes"], "zero_scrolls_f1")
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "rows.jsonl").write_text(json.dumps(row) + "\n")
    outcome = invoke("export", "--format", "kvpress", tmp_path / "results", tmp_path / "out")
    refused(outcome, "zero_scrolls/qasper", "validation split")
    assert not (tmp_path / "out").exists()
