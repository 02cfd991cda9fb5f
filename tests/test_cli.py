"""The CLI through click's CliRunner: bad input is one line and exit 2 with nothing written; a real run."""

import json

import pytest
from click.testing import CliRunner

from kvbench import tasks
from kvbench.cli import main
from kvbench.results import load_rows


def invoke(*args):
    return CliRunner().invoke(main, list(args))


@pytest.mark.parametrize(
    "args, message",
    [
        (["run", "--press", "nope", "--ratio", "0.5"], "unknown press 'nope'"),
        (["run", "--press", "snapkv", "--ratio", "1.0"], "ratio must be in [0, 1)"),
        (["run", "--press", "snapkv", "--ratio", "-0.2"], "ratio must be in [0, 1)"),
        (["run", "--press", "snapkv", "--ratio", "0.5", "--task", "nope"], "unknown task 'nope'"),
        (["run", "--press", "snapkv", "--ratio", "0.5", "--suite", "nope"], "unknown suite 'nope'"),
        (["run", "--press", "snapkv", "--ratio", "0.5", "--samples", "0"], "--samples must be at least 1"),
        (
            ["run", "--press", "snapkv", "--ratio", "0.5", "--task", "vt", "--length", "100"],
            "below the minimum",
        ),
        (["run", "--press", "snapkv", "--ratio", "0.5", "--model", "no-such-model"], "unknown model"),
        (["run", "--press", "snapkv", "--ratio", "0.5", "--press-arg", "oops"], "key=value"),
        (["sweep", "--presses", "", "--ratios", "0.5"], "at least one"),
        (["sweep", "--presses", "snapkv,snapkv", "--ratios", "0.5"], "duplicate configs"),
        (["sweep", "--presses", "snapkv", "--ratios", "0.5,0.5"], "duplicate configs"),
        (["sweep", "--presses", "snapkv", "--ratios", "0.5,1.5"], "ratio must be in [0, 1)"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(args, message, tmp_path):
    out = tmp_path / "out"
    result = invoke(*args, "--out", str(out))
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
    assert not out.exists()


def test_unwritable_out_is_refused_before_any_work(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    result = invoke("run", "--press", "knorm", "--ratio", "0.5", "--out", str(blocker / "sub"))
    assert result.exit_code == 2 and "not writable" in result.output
    assert blocker.read_text() == "not a folder"


def test_presses_and_tasks_list_the_registries():
    presses = invoke("presses").output
    assert "h2o" in presses and "kvp" in presses and "[needs: eager]" in presses
    listing = invoke("tasks").output
    assert all(name in listing for name in tasks.task_names()) and "ruler-1k" in listing


def test_run_scores_the_embedded_model_and_resumes(tmp_path):
    out = tmp_path / "results"
    args = [
        "run",
        "--press",
        "snapkv",
        "--ratio",
        "0.5",
        "--task",
        "niah_single_1",
        "--length",
        "512",
        "--samples",
        "1",
        "--out",
        str(out),
    ]
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    rows = load_rows(out)
    assert len(rows) == 1
    row = rows.iloc[0]
    sample = tasks.load_samples(
        "niah_single_1",
        length=512,
        samples=1,
        seed=0,
        tokenizer=__import__("kvbench.models").models.load_tokenizer(),
    )[0]
    assert row.sample_id == sample.id and row.references == sample.references
    assert row.score == tasks.score_sample(sample, row.prediction)
    # snapkv at 0.5 keeps int(L/2) entries in each of 30 layers x 3 KV heads
    assert row.kv_total == row.context_tokens * 90 and row.kv_kept == (row.context_tokens // 2) * 90
    record = json.loads(next((out / "runs").glob("*.json")).read_text())
    assert record["config"]["configs"][0]["press"] == "snapkv" and "kvpress" in record["versions"]
    assert record["config"]["tasks"] == ["niah_single_1"] and record["config"]["length"] == 512

    again = invoke(*args)  # resumed: nothing left to compute, the row is not duplicated
    assert again.exit_code == 0
    assert (out / "rows.jsonl").read_text().count("\n") == 1
