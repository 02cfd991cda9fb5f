"""predictions.csv's cells as kvbench's export writes them: what a spreadsheet would open as a formula is
quoted, numbers and JSON are exact, import gives every cell back, and the question asked is written."""

import csv
import json
from pathlib import Path

import pytest

from kvbench.harness.interop import spreadsheet_safe, unquoted
from kvbench.store.results import load_rows
from tests.harness.test_interop import invoke, reference_subset

# Text a spreadsheet opens as a formula (OWASP, "CSV Injection"), that text already quoted by its author,
# numbers (a spreadsheet reads them as numbers: no formula), and other text.
FORMULAS = ["=1+1", "+SUM(A1:A9)", "-2+3", "@SUM(1)", "\t=1", "\rx", '=HYPERLINK("http://x","y")', "=", "-"]
QUOTED = ["'=1+1", "''@x"]
NUMBERS = ["-3", "-0.5", "+1e3", "-inf", "8680107"]
TEXT = ["'quoted", " =1", "a=1", ""]
STARTS = ("=", "+", "-", "@", "\t", "\r")


@pytest.mark.parametrize("text", FORMULAS + QUOTED + NUMBERS + TEXT)
def test_a_cell_is_quoted_exactly_when_it_would_open_as_a_formula_and_comes_back(text):
    safe = spreadsheet_safe(text)
    assert unquoted(safe) == text
    assert (safe == "'" + text) == (text in FORMULAS + QUOTED) and (safe == text) == (
        text not in FORMULAS + QUOTED
    )
    assert not safe.startswith(STARTS) or text in NUMBERS  # what a spreadsheet reads as a formula


def test_export_quotes_formulas_keeps_numbers_and_import_gives_the_cells_back(tmp_path):
    results = reference_subset(tmp_path / "results")
    path = results / "rows.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    hostile = FORMULAS + QUOTED + NUMBERS + TEXT
    for index, row in enumerate(rows):
        row["prediction"] = hostile[index % len(hostile)]
        row["question"] = hostile[(index + 1) % len(hostile)]
        row["answer_prefix"] = "Answer:"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert invoke("export", "--format", "kvpress", results, tmp_path / "out").exit_code == 0

    written = {}
    for file in sorted((tmp_path / "out").rglob("predictions.csv")):
        with file.open(newline="") as handle:
            for line in csv.DictReader(handle):
                for column, cell in line.items():
                    assert not cell.startswith(STARTS) or cell in NUMBERS, (column, cell)
                assert float(line["compression_ratio"]) in (0.0, 0.5)  # a number, as it was
                written.setdefault(line["predicted_answer"], line["question"])
    assert {spreadsheet_safe(text) for text in hostile} <= set(written)
    assert "'=1+1" in written and "-3" in written and "'-2+3" in written

    assert invoke("import", "--format", "kvpress", tmp_path / "out", tmp_path / "back").exit_code == 0
    back = load_rows(tmp_path / "back")
    original = load_rows(results)
    assert sorted(back["prediction"]) == sorted(original["prediction"])
    assert sorted(back["question"].fillna("")) == sorted(original["question"])  # an empty cell: none
    assert set(back["answer_prefix"]) == {"Answer:"}


def test_an_exports_metrics_json_is_exact_whatever_the_predictions(tmp_path):
    """Quoting touches predictions.csv only: metrics.json holds the same scores as before."""
    results = reference_subset(tmp_path / "results")
    assert invoke("export", "--format", "kvpress", results, tmp_path / "plain").exit_code == 0
    path = results / "rows.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text(
        "".join(json.dumps({**row, "prediction": "=" + row["prediction"]}) + "\n" for row in rows)
    )
    assert invoke("export", "--format", "kvpress", results, tmp_path / "hostile").exit_code == 0
    for metrics in (tmp_path / "plain").rglob("metrics.json"):
        twin = tmp_path / "hostile" / metrics.relative_to(tmp_path / "plain")
        assert json.loads(twin.read_text()) == json.loads(metrics.read_text())


def test_a_runs_rows_hold_the_question_and_the_export_writes_it(tmp_path, monkeypatch, tiny_llama_dir):
    """kvpress's predictions.csv has question and answer_prefix columns: a run's rows hold them."""
    monkeypatch.chdir(tmp_path)
    args = ["run", "--press", "knorm", "--ratio", "0.5", "--task", "niah_single_1", "--length", 512]
    outcome = invoke(*args, "--samples", 2, "--model", tiny_llama_dir, "--out", "r")
    assert outcome.exit_code == 0, outcome.output
    rows = [json.loads(line) for line in Path("r/rows.jsonl").read_text().splitlines()]
    assert all(row["question"] and row["answer_prefix"] is not None for row in rows)
    assert invoke("export", "--format", "kvpress", "r", "out").exit_code == 0
    lines = [
        line
        for file in Path("out").rglob("predictions.csv")
        for line in csv.DictReader(file.open(newline=""))
    ]
    assert sorted(line["question"] for line in lines) == sorted(row["question"] for row in rows)
    assert sorted(line["answer_prefix"] for line in lines) == sorted(row["answer_prefix"] for row in rows)
