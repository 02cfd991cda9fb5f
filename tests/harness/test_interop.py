"""kvbench export/import --format kvpress: the folders of kvpress's evaluation (kvbench.harness.interop)."""

import gzip
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvbench.cli import main
from kvbench.harness.interop import import_kvpress
from kvbench.store.results import load_rows

REFERENCE = Path(__file__).resolve().parents[2] / "results" / "reference" / "rows.jsonl.gz"


def reference_subset(folder: Path) -> Path:
    """A few (press, ratio, task) of the committed reference, kvp's several configs included."""
    with gzip.open(REFERENCE, "rt") as file:
        rows = [json.loads(line) for line in file]
    keep = [
        row
        for row in rows
        if row["task"] in ("niah_single_1", "cwe") and row["press"] in ("none", "knorm", "kvp")
        if row["ratio"] in (0.0, 0.5)
    ]
    folder.mkdir(parents=True)
    (folder / "rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in keep))
    return folder


def invoke(*args: str):
    return CliRunner().invoke(main, [str(arg) for arg in args])


def scores_by_config(rows, suffix: str = "") -> list[tuple]:
    """Sorted (press, ratio, task, mean score) per config; `suffix` taken off imported press names."""
    means = rows.groupby(["config_id", "press", "ratio", "task"])["score"].mean().round(6)
    return sorted(
        (press.removesuffix(suffix), ratio, task, score) for (_, press, ratio, task), score in means.items()
    )


def test_export_then_import_gives_back_the_scores(tmp_path):
    results = reference_subset(tmp_path / "results")
    outcome = invoke("export", "--format", "kvpress", results, tmp_path / "kvpress")
    assert outcome.exit_code == 0, outcome.output
    folder = tmp_path / "kvpress" / "ruler__1024__smollm2-135m__knorm__0.50"
    assert sorted(path.name for path in folder.iterdir()) == [
        "config.yaml",
        "metrics.json",
        "predictions.csv",
    ]
    # kvp has several configs at 0.5: kvpress's numbered subfolders keep them apart.
    assert (tmp_path / "kvpress" / "ruler__1024__smollm2-135m__kvp__0.50" / "1" / "metrics.json").is_file()
    assert (tmp_path / "kvpress" / "ruler__1024__smollm2-135m__no_press__0.00").is_dir()
    metrics = json.loads((folder / "metrics.json").read_text())
    original = load_rows(results)
    assert set(original["seed"]) == {0} and "\nseed: 0\n" in (folder / "config.yaml").read_text()  # not 42
    knorm = original[(original["press"] == "knorm") & (original["ratio"] == 0.5)]
    assert metrics == {
        task: {"string_match": round(knorm[knorm["task"] == task]["score"].mean(), 2)}
        for task in ("cwe", "niah_single_1")
    }
    outcome = invoke("import", "--format", "kvpress", tmp_path / "kvpress", tmp_path / "back")
    assert outcome.exit_code == 0, outcome.output
    back = load_rows(tmp_path / "back")
    assert len(back) == len(original)
    assert scores_by_config(back, " (kvpress)") == scores_by_config(original)
    assert set(back["press"]) == {"none (kvpress)", "knorm (kvpress)", "kvp (kvpress)"}
    assert all(meta["imported"] == "kvpress" for meta in back["meta"])


def write_kvpress_folder(
    root: Path, press: str, ratio: float, predictions: list[tuple], query_aware=False
) -> Path:
    """One folder as kvpress's evaluate.py writes it for ruler at 4096 (get_results_dir, _save_results with
    numpy list cells and its set-ordered columns, json.dump(indent=4), save_config's YAML)."""
    name = f"ruler__4096__Qwen--Qwen3-8B__{press}__{ratio:.2f}" + ("__query_aware" if query_aware else "")
    folder = root / name
    folder.mkdir(parents=True)
    lines = ["answer_prefix,max_new_tokens,task,compression_ratio,predicted_answer,question,answer"]
    scores: dict[str, list[float]] = {}
    for task, answers, predicted, score in predictions:
        cell = "[" + " ".join(f"'{answer}'" for answer in answers) + "]"
        lines.append(
            f'" Answer:",128,{task},{ratio},"{predicted}","What is the special magic number?","{cell}"'
        )
        scores.setdefault(task, []).append(score)
    (folder / "predictions.csv").write_text("\n".join(lines) + "\n")
    metrics = {task: {"string_match": round(sum(s) / len(s), 2)} for task, s in sorted(scores.items())}
    (folder / "metrics.json").write_text(json.dumps(metrics, indent=4))
    (folder / "config.yaml").write_text(
        "dataset: ruler\ndata_dir: '4096'\nmodel: Qwen/Qwen3-8B\ndevice: cuda:0\n"
        f"press_name: {press}\ncompression_ratio: {ratio}\nkey_channel_compression_ratio: null\n"
        "fraction: 1.0\nmax_new_tokens: null\nmax_context_length: null\n"
        f"query_aware: {'true' if query_aware else 'false'}\nneedle_depth: null\ncompression_interval: null\n"
        "target_size: null\nhidden_states_buffer_size: null\noutput_dir: ./results_lb\nlog_level: INFO\n"
        f"model_kwargs: {{}}\npress_init_command: {press}()\nseed: 42\nfp8: false\n"
    )
    return folder


def leaderboard_like(root: Path) -> Path:
    write_kvpress_folder(
        root, "no_press", 0.0, [("niah_single_1", ["11"], "11", 100.0), ("vt", ["A", "B"], "A B", 100.0)]
    )
    write_kvpress_folder(
        root, "knorm", 0.5, [("niah_single_1", ["11"], "12", 0.0), ("vt", ["A", "B"], "A only", 50.0)]
    )
    write_kvpress_folder(
        root, "snapkv", 0.5, [("niah_single_1", ["11"], "11", 100.0), ("vt", ["A", "B"], "B", 50.0)], True
    )
    return root


def test_a_kvpress_folder_imports_and_reports(tmp_path):
    kvpress = leaderboard_like(tmp_path / "results_lb")
    outcome = invoke("import", "--format", "kvpress", kvpress, tmp_path / "imported")
    assert outcome.exit_code == 0, outcome.output
    assert "Warning" not in outcome.output  # the published scores are what the predictions give
    rows = load_rows(tmp_path / "imported")
    knorm = rows[rows["press"] == "knorm (kvpress)"]
    assert sorted(knorm["score"]) == [0.0, 50.0] and set(knorm["length"]) == {4096}
    assert set(rows[rows["press"] == "snapkv (kvpress)"]["protocol"]) == {"query-aware"}
    outcome = invoke("report", tmp_path / "imported", "--out", tmp_path / "report")
    assert outcome.exit_code == 0, outcome.output
    readme = (tmp_path / "report" / "README.md").read_text()
    assert "knorm (kvpress)" in readme and "none (kvpress)" in readme and "snapkv (kvpress)" in readme


def test_a_published_score_its_predictions_do_not_give_is_said(tmp_path):
    folder = write_kvpress_folder(tmp_path / "lb", "knorm", 0.5, [("vt", ["A"], "A", 100.0)])
    (folder / "metrics.json").write_text(json.dumps({"vt": {"string_match": 10.0}}, indent=4))
    with pytest.warns(UserWarning, match="metrics.json: vt is published as 10.0"):
        import_kvpress(tmp_path / "lb", tmp_path / "out")


def refused(outcome, *words: str) -> None:
    assert outcome.exit_code == 2, outcome.output
    lines = outcome.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error:"), outcome.output
    assert all(word in lines[0] for word in words), lines[0]


def test_bad_inputs_are_refused_in_one_line_and_nothing_is_written(tmp_path):
    results = reference_subset(tmp_path / "results")
    (tmp_path / "taken").mkdir()
    refused(invoke("export", "--format", "kvpress", results, tmp_path / "taken"), "exists")
    assert not any((tmp_path / "taken").iterdir())

    agent = tmp_path / "agent"
    agent.mkdir()
    row = json.loads((results / "rows.jsonl").read_text().splitlines()[0])
    (agent / "rows.jsonl").write_text(json.dumps({**row, "task": "agent/tools"}) + "\n")
    refused(invoke("export", "--format", "kvpress", agent, tmp_path / "out"), "agent/tools", "no counterpart")
    (agent / "rows.jsonl").write_text(
        json.dumps({**row, "protocol": "streaming", "protocol_args": {"chunk": 8}}) + "\n"
    )
    refused(invoke("export", "--format", "kvpress", agent, tmp_path / "out"), "streaming")

    refused(invoke("import", "--format", "kvpress", results, tmp_path / "out"), "not kvpress's")
    kvpress = leaderboard_like(tmp_path / "lb")
    knorm = kvpress / "ruler__4096__Qwen--Qwen3-8B__knorm__0.50"
    config = (knorm / "config.yaml").read_text()
    (knorm / "config.yaml").write_text(config.replace("press_name: knorm\n", ""))
    refused(invoke("import", "--format", "kvpress", kvpress, tmp_path / "out"), "config.yaml", "press_name")
    (knorm / "config.yaml").write_text(config.replace("dataset: ruler", "dataset: scbench"))
    refused(invoke("import", "--format", "kvpress", kvpress, tmp_path / "out"), "config.yaml", "scbench")
    (knorm / "config.yaml").write_text(config.replace("dataset: ruler", "dataset: loogle"))
    refused(invoke("import", "--format", "kvpress", kvpress, tmp_path / "out"), "metrics.json", "rouge-l")
    (knorm / "config.yaml").write_text(config)
    (knorm / "metrics.json").write_text(json.dumps({"vt": {"accuracy": 1.0}}))
    refused(
        invoke("import", "--format", "kvpress", kvpress, tmp_path / "out"), "metrics.json", "string_match"
    )
    (knorm / "metrics.json").unlink()
    refused(
        invoke("import", "--format", "kvpress", kvpress, tmp_path / "out"), "metrics.json", "no such file"
    )
    (knorm / "metrics.json").write_text(json.dumps({"vt": {"string_match": 50.0}}))
    text = (knorm / "predictions.csv").read_text()
    (knorm / "predictions.csv").write_text(text.replace("predicted_answer", "prediction"))
    refused(
        invoke("import", "--format", "kvpress", kvpress, tmp_path / "out"),
        "predictions.csv",
        "predicted_answer",
    )
    assert not (tmp_path / "out").exists()
    assert [path.name for path in tmp_path.iterdir() if path.name.startswith(".")] == []


KNORM = "ruler__4096__Qwen--Qwen3-8B__knorm__0.50"


def replace_in(name: str, old: str, new: str):
    def mutate(folder: Path) -> None:
        path = folder / KNORM / name
        assert old in path.read_text()
        path.write_text(path.read_text().replace(old, new, 1))

    return mutate


def rerun(folder: Path) -> None:
    """kvpress's get_results_dir: a config run again lands in a numbered subfolder of the first."""
    again = folder / KNORM / "1"
    again.mkdir()
    for name in ("config.yaml", "metrics.json", "predictions.csv"):
        (again / name).write_text((folder / KNORM / name).read_text())


def short_row(folder: Path) -> None:
    path = folder / KNORM / "predictions.csv"
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], lines[1].rsplit(",", 2)[0], *lines[2:]]) + "\n")


# Each a kvpress folder damaged in one way, and words its one line says.
DAMAGED = {
    "data-dir-superscript": (replace_in("config.yaml", "data_dir: '4096'", "data_dir: '²'"), ["data_dir"]),
    "data-dir-arabic-digits": (
        replace_in("config.yaml", "data_dir: '4096'", "data_dir: '٤٠٩٦'"),
        ["data_dir"],
    ),
    "data-dir-fullwidth": (
        replace_in("config.yaml", "data_dir: '4096'", "data_dir: '４０９６'"),
        ["data_dir"],
    ),
    "model-nul": (replace_in("config.yaml", "model: Qwen/Qwen3-8B", 'model: "Qwen\\0"'), ["model", "U+0000"]),
    "model-rlo": (replace_in("config.yaml", "model: Qwen/Qwen3-8B", 'model: "Qwen\\u202e"'), ["U+202E"]),
    "press-bell": (replace_in("config.yaml", "press_name: knorm", 'press_name: "kn\\a"'), ["U+0007"]),
    "row-short": (short_row, ["predictions.csv line 2", "columns of its header"]),
    "row-long": (replace_in("predictions.csv", '"What is', '"x","What is'), ["columns of its header"]),
    "rerun": (rerun, ["kvpress reran it", KNORM + "/1"]),
}


@pytest.mark.parametrize("name", sorted(DAMAGED))
def test_a_damaged_kvpress_folder_is_one_line_and_nothing_is_written(tmp_path, name):
    mutate, words = DAMAGED[name]
    kvpress = leaderboard_like(tmp_path / "lb")
    mutate(kvpress)
    refused(invoke("import", "--format", "kvpress", kvpress, tmp_path / "out"), *words)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("errno_name", ["ENOSPC", "EFBIG", "EDQUOT"])
def test_export_that_cannot_write_is_one_line_and_leaves_nothing(tmp_path, monkeypatch, errno_name):
    import builtins
    import errno

    results = reference_subset(tmp_path / "results")
    real_open, written = builtins.open, []

    def failing_open(path, mode="r", *args, **kwargs):
        if "w" in mode and "kvpress" in str(path):
            written.append(path)
            if len(written) == 3:  # past the first files: a disk that fills half way
                raise OSError(getattr(errno, errno_name), "no room")
        return real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", failing_open)
    outcome = invoke("export", "--format", "kvpress", results, tmp_path / "kvpress")
    monkeypatch.undo()
    assert outcome.exit_code == 1, outcome.output  # not the user's input: exit 1, as every write failure
    assert outcome.output == f"Error: {tmp_path / 'kvpress'}: cannot write (no room); nothing was written\n"
    assert not (tmp_path / "kvpress").exists() and len(written) == 3
    assert [path.name for path in tmp_path.iterdir() if path.name.startswith(".")] == []
