"""Results store: append-only rows, torn tails cut, corrupt lines skipped, resumable plans."""

import json
import signal
import subprocess
import sys
import time

import pytest

import kvbench.runner as runner
from kvbench.engine import Config
from kvbench.models import load_model
from kvbench.results import ResultsStore, config_id, load_rows, load_runs


def row(sample_id, score=50.0, press="knorm", ratio=0.5):
    return {
        "config_id": config_id("m", press, ratio, {}),
        "model": "m",
        "press": press,
        "ratio": ratio,
        "press_args": {},
        "task": "vt",
        "length": 1024,
        "seed": 0,
        "sample_id": sample_id,
        "score": score,
    }


def test_rows_round_trip_and_duplicates_keep_the_last(tmp_path):
    store = ResultsStore(tmp_path)
    store.append(row("0-0", 10.0))
    store.append(row("0-1", 20.0))
    store.append(row("0-0", 30.0))  # a --force rerun
    frame = load_rows(tmp_path)
    assert sorted(zip(frame.sample_id, frame.score, strict=True)) == [("0-0", 30.0), ("0-1", 20.0)]
    assert ResultsStore(tmp_path).has(row("0-1")) and not ResultsStore(tmp_path).has(row("0-2"))


def test_a_torn_last_line_is_cut_when_the_store_opens(tmp_path):
    ResultsStore(tmp_path).append(row("0-0"))
    with open(tmp_path / "rows.jsonl", "a") as file:
        file.write('{"config_id": "abc", "task": "v')  # killed mid-write
    store = ResultsStore(tmp_path)
    store.append(row("0-1"))
    lines = (tmp_path / "rows.jsonl").read_text().splitlines()
    assert [json.loads(line)["sample_id"] for line in lines] == ["0-0", "0-1"]


def test_corrupt_lines_are_skipped_with_file_and_line(tmp_path):
    store = ResultsStore(tmp_path)
    store.append(row("0-0"))
    with open(tmp_path / "rows.jsonl", "a") as file:
        file.write("not json\n[1, 2]\n")
    store.append(row("0-1"))
    message = r"rows.jsonl:2: skipped 2 corrupt results rows \(lines 2, 3\)"
    with pytest.warns(UserWarning, match=message) as caught:
        frame = load_rows(tmp_path)
    assert len(caught) == 1  # one warning per file, however many bad lines
    assert sorted(frame.sample_id) == ["0-0", "0-1"]


# Appends rows 0..N that the store lacks (a resumed run), saying when it has written its first one.
WRITER = """
import sys
from kvbench.results import ResultsStore
store = ResultsStore(sys.argv[1])
for i in range(100_000):
    row = {"config_id": "c", "task": "t", "length": 1, "seed": 0, "sample_id": str(i), "pad": "x" * 50_000}
    if not store.has(row):
        store.append(row)
        print("writing", flush=True)
"""


def test_kill_9_never_leaves_a_partial_or_duplicated_row(tmp_path):
    for pause in (0.05, 0.2, 0.5):
        writer = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], stdout=subprocess.PIPE)
        writer.stdout.readline()
        time.sleep(pause)
        writer.send_signal(signal.SIGKILL)
        writer.wait()
        store = ResultsStore(tmp_path)  # what a rerun does first: cut a torn tail, if any
        ids = [json.loads(line)["sample_id"] for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
        assert ids == [str(i) for i in range(len(ids))]  # whole rows, no duplicates, no gaps
        assert len(store.done) == len(ids)


def test_a_rerun_computes_only_what_is_missing(tmp_path, monkeypatch, tiny_model_dir):
    calls = []

    def fake_evaluate(model, tokenizer, sample, configs, batch_configs):
        calls.append((sample.id, [c.press for c in configs]))
        return [
            {
                "prediction": sample.references[0],
                "context_tokens": 1,
                "kv_kept": 1,
                "kv_total": 2,
                "kv_bytes_kept": 8,
                "prefill_s": 0.0,
                "decode_s": 0.0,
            }
            for _ in configs
        ]

    monkeypatch.setattr(runner, "evaluate_sample", fake_evaluate)
    model, tokenizer = load_model(tiny_model_dir)
    configs = [Config("none", 0.0), Config("knorm", 0.5)]
    plan = runner.Plan(configs=configs, tasks=["niah_single_1"], length=512, samples=2)
    store = ResultsStore(tmp_path)
    frame = runner.run_plan(model, tokenizer, plan, store, progress=False)
    assert len(frame) == 4 and (frame.score == 100.0).all() and len(calls) == 2

    bigger = runner.Plan(
        configs=[*configs, Config("tova", 0.5)], tasks=["niah_single_1"], length=512, samples=3
    )
    frame = runner.run_plan(model, tokenizer, bigger, ResultsStore(tmp_path), progress=False)
    assert calls[2:] == [("0-0", ["tova"]), ("0-1", ["tova"]), ("0-2", ["none", "knorm", "tova"])]
    assert len(frame) == 9 and len(load_rows(tmp_path)) == 9

    forced = runner.Plan(configs=configs[:1], tasks=["niah_single_1"], length=512, samples=1, force=True)
    runner.run_plan(model, tokenizer, forced, ResultsStore(tmp_path), progress=False)
    assert calls[-1] == ("0-0", ["none"]) and len(load_rows(tmp_path)) == 9
    records = load_runs([tmp_path])
    assert len(records) == 3 and all(r["finished"] for r in records)
    assert records[0]["summary"]["none@0.0"]["niah_single_1"] == 100.0


def test_rows_of_other_learned_state_are_other_results(tmp_path, monkeypatch, tiny_model_dir):
    """Retrained KVP agents (another press_state) must be scored again, never served the old agents' rows."""
    calls = []

    def fake_evaluate(model, tokenizer, sample, configs, batch_configs):
        calls.append([c.press_state for c in configs])
        keys = ("context_tokens", "kv_kept", "kv_total", "kv_bytes_kept", "prefill_s", "decode_s")
        return [{"prediction": "x", **dict.fromkeys(keys, 1)} for _ in configs]

    monkeypatch.setattr(runner, "evaluate_sample", fake_evaluate)
    model, tokenizer = load_model(tiny_model_dir)
    for state in ("agents-a", "agents-a", "agents-b"):
        plan = runner.Plan(
            configs=[Config("kvp", 0.5, (), state)], tasks=["niah_single_1"], length=512, samples=1
        )
        runner.run_plan(model, tokenizer, plan, ResultsStore(tmp_path), progress=False)
    assert calls == [["agents-a"], ["agents-b"]]
    rows = load_rows(tmp_path)
    assert rows["press_state"].tolist() == ["agents-a", "agents-b"] and rows["config_id"].nunique() == 2
    # Presses without learned state keep the ids they always had.
    assert config_id("m", "knorm", 0.5, {}, None) == config_id("m", "knorm", 0.5, {})
