"""benchmarks/substrate_study.py: bad sizes, names and folders are one line and exit 2 before any training;
a study split over processes (--models) and merged (--merge) is summarised over every seed."""

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "substrate_study.py"
TINY = ["--layers", "1", "--d-model", "8", "--heads", "2", "--context", "16", "--steps", "2", "--n-eval", "2"]


def script():
    spec = importlib.util.spec_from_file_location("substrate_study", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--models", "relu"], "no model of the design"),
        (["--d-model", "6", "--heads", "4"], "even integer"),
        (["--models", "gate-relu"], "no model of the design"),
        (["--context", "5000"], "at most 4096"),
        (["--layers", "0"], "at least 1"),
        (["--steps", "nan"], "whole number"),
        (["--seeds", "0,x"], "whole number"),
        (["--merge", "no/such/folder"], "no rows.jsonl"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, message, tmp_path, capsys):
    assert script().main([*argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_split_runs_merge_into_one_summary(tmp_path):
    main = script().main
    for seed in ("0", "1"):
        argv = [*TINY, "--models", "softmax-nogate-rope", "--seeds", seed, "--out", str(tmp_path / seed)]
        assert main(argv) == 0
    assert main(["--merge", str(tmp_path / "0"), str(tmp_path / "1"), "--out", str(tmp_path / "all")]) == 0
    rows = [json.loads(line) for line in (tmp_path / "all" / "rows.jsonl").read_text().splitlines()]
    assert {r["seed"] for r in rows} == {0, 1}
    assert {r["config"]["n_layer"] for r in rows} == {1} and {r["config"]["context"] for r in rows} == {16}
    summary = (tmp_path / "all" / "summary.csv").read_text()
    assert "softmax-nogate-rope" in summary and ",2," in summary  # two seeds per cell
    # Merging again, or a folder already merged, keeps every row once.
    merged = (tmp_path / "all" / "rows.jsonl").read_text()
    assert main(["--merge", str(tmp_path / "0"), "--out", str(tmp_path / "all")]) == 0
    assert (tmp_path / "all" / "rows.jsonl").read_text() == merged


@pytest.mark.parametrize("damage", ["", "{not json\n", '{"model": "m"}\n'])
def test_a_damaged_rows_file_is_one_line_and_nothing_is_written(damage, tmp_path, capsys):
    main = script().main
    ok = str(tmp_path / "ok")
    assert main([*TINY, "--models", "softmax-nogate-rope", "--seeds", "0", "--out", ok]) == 0
    before = (tmp_path / "ok" / "rows.jsonl").read_text()
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "rows.jsonl").write_text(damage)
    assert main(["--merge", str(tmp_path / "bad"), "--out", str(tmp_path / "ok")]) == 2
    err = capsys.readouterr().err
    assert "rows.jsonl" in err and err.count("\n") == 1
    assert (tmp_path / "ok" / "rows.jsonl").read_text() == before
