"""The CLI through click's CliRunner: listings and real runs (bad input: tests/cli/test_bad_input.py)."""

import json
import os

import pytest
from click.testing import CliRunner

from kvbench import tasks
from kvbench.cli import main
from kvbench.store.results import load_rows


def invoke(*args):
    return CliRunner().invoke(main, list(args))


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
        tokenizer=__import__("kvbench.bridge.models").bridge.models.load_tokenizer(),
    )[0]
    assert row.sample_id == sample.id and row.references == sample.references
    assert row.score == tasks.score_sample(sample, row.prediction)
    # snapkv at 0.5 keeps int(L/2) entries in each of 30 layers x 3 KV heads
    assert row.kv_total == row.context_tokens * 90 and row.kv_kept == (row.context_tokens // 2) * 90
    record = json.loads(next((out / "runs").glob("*.json")).read_text())
    assert record["config"]["configs"][0]["press"] == "snapkv" and "kvpress" in record["versions"]
    assert record["hardware"]["cpus"] == os.cpu_count() and "gpu" not in record["hardware"]
    assert record["config"]["tasks"] == ["niah_single_1"] and record["config"]["length"] == 512

    again = invoke(*args)  # resumed: nothing left to compute, the row is not duplicated
    assert again.exit_code == 0
    assert (out / "rows.jsonl").read_text().count("\n") == 1


def test_a_memory_budget_runs_evictors_at_one_minus_memory_and_rows_record_it(tmp_path, tiny_model_dir):
    out = tmp_path / "results"
    common = ["--task", "niah_single_1", "--length", "512", "--samples", "1", "--model", tiny_model_dir]
    result = invoke("sweep", "--presses", "knorm", "--memory", "0.5,0.25", *common, "--out", str(out))
    assert result.exit_code == 0, result.output
    rows = load_rows(out).set_index("memory", drop=False)
    assert rows.loc[0.25, "ratio"] == 0.75 and rows.loc[0.5, "ratio"] == 0.5
    none = rows[rows.press == "none"].iloc[0]
    assert none.kv_bytes == none.kv_bytes_full and none.protocol == "query-agnostic"
    for memory in (0.5, 0.25):
        assert rows.loc[memory, "kv_bytes"] <= memory * rows.loc[memory, "kv_bytes_full"]
    # The same press by ratio is another config: a memory budget is part of what identifies a row.
    again = invoke("run", "--press", "knorm", "--ratio", "0.5", *common, "--out", str(out))
    assert again.exit_code == 0 and len(load_rows(out)) == 4


def test_streaming_rows_record_the_protocol_and_its_chunk(tmp_path, tiny_model_dir):
    out = tmp_path / "results"
    args = ["--task", "niah_single_1", "--length", "512", "--samples", "1", "--model", tiny_model_dir]
    result = invoke(
        "run",
        "--press",
        "tova",
        "--ratio",
        "0.5",
        "--protocol",
        "streaming",
        "--chunk",
        "64",
        *args,
        "--out",
        str(out),
    )
    assert result.exit_code == 0, result.output
    row = load_rows(out).iloc[0]
    assert row.protocol == "streaming" and row.protocol_args == {"chunk": 64}
    assert row.kv_kept == int(row.context_tokens * 0.5) * 2 * 2


def test_a_codec_budget_it_cannot_reach_is_refused_by_run_and_skipped_by_sweep(tmp_path, tiny_model_dir):
    out = tmp_path / "results"
    common = ["--task", "niah_single_1", "--length", "512", "--samples", "1", "--model", tiny_model_dir]
    refused = invoke("run", "--press", "quant", "--memory", "0.1", *common, "--out", str(out))
    assert refused.exit_code == 2 and "quant" in refused.output and not out.exists()
    swept = CliRunner().invoke(
        main, ["sweep", "--presses", "quant", "--memory", "0.5,0.1", *common, "--out", str(out)]
    )
    assert swept.exit_code == 0, swept.output
    assert "skipped quant at memory 0.1" in swept.output
    rows = load_rows(out)
    assert sorted(rows.press) == ["none", "quant"] and rows[rows.press == "quant"].memory.tolist() == [0.5]
    quant = rows[rows.press == "quant"].iloc[0]
    # A codec keeps every entry, in fewer bytes.
    assert quant.kv_kept == quant.kv_total and quant.kv_bytes <= 0.5 * quant.kv_bytes_full


BLANK_OUT = [
    ["run", "--press", "knorm", "--ratio", "0.5"],
    ["sweep", "--presses", "knorm", "--ratios", "0.5"],
    ["perplexity", "--presses", "knorm", "--ratios", "0.5"],
    ["speed", "--presses", "knorm", "--ratios", "0.5"],
    ["lm-eval", "--press", "knorm", "--ratio", "0.5", "--tasks", "kvbench_niah_single_1"],
    ["prefix-cache", "--budgets", "2"],
    ["check-press", "knorm", "--quick"],
    ["kvp", "datagen"],
    ["report", "results"],
]


@pytest.mark.parametrize(
    "args", BLANK_OUT, ids=lambda args: args[0] + (f" {args[1]}" if args[0] == "kvp" else "")
)
@pytest.mark.parametrize("blank", ["", "  "])
def test_a_blank_out_is_no_folder_not_the_current_one(tmp_path, monkeypatch, args, blank):
    """`--out ''` once wrote a report over the current folder's README.md: every --out refuses a blank."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "results").mkdir()
    result = CliRunner().invoke(main, [*args, "--out", blank])
    assert result.exit_code == 2 and "names no folder" in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1
    assert [path.name for path in tmp_path.iterdir()] == ["results"] and not any(
        (tmp_path / "results").iterdir()
    )


def test_models_lists_the_learned_states_shipped_for_each_model():
    """`kvbench models` names, under each built-in model, the presses whose state folder presses/PRESS/MODEL/
    holds a card: what runs on that model with no --press-arg weights."""
    from pathlib import Path

    from kvbench.bridge import builtin

    root = Path(__file__).resolve().parents[2] / "presses"
    result = CliRunner().invoke(main, ["models"])
    assert result.exit_code == 0, result.output
    listed = [line for line in result.output.splitlines() if line.startswith("  learned states shipped: ")]
    assert len(listed) == len(builtin.BUILTIN)
    for model, line in zip(builtin.BUILTIN, listed, strict=True):
        shipped = {card.parent.parent.name for card in root.glob(f"*/{model}/card.json")}
        assert set(line.removeprefix("  learned states shipped: ").split(", ")) == shipped
