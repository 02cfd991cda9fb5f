"""Results store: append-only rows, torn tails cut, corrupt lines skipped, resumable plans."""

import dataclasses
import gzip
import json
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import kvbench.harness.runner as runner
from kvbench.bridge.models import load_model
from kvbench.core import provenance
from kvbench.core.config import Config
from kvbench.store.results import ResultsStore, Row, config_id, load_rows, load_runs


def row(sample_id, score=50.0, press="knorm", ratio=0.5, content="c0", references=("x",)) -> Row:
    return Row(
        config_id=config_id("m", press, ratio, {}),
        model="m",
        press=press,
        ratio=ratio,
        task="vt",
        length=1024,
        seed=0,
        sample_id=sample_id,
        content_hash=content,
        references=list(references),
        score=score,
    )


def test_rows_round_trip_and_duplicates_keep_the_last(tmp_path):
    store = ResultsStore(tmp_path)
    store.append(row("0-0", 10.0))
    store.append(row("0-1", 20.0))
    ResultsStore(tmp_path).append(row("0-0", 30.0), force=True)  # a --force rerun
    store.append(row("0-0", 40.0))  # the key is there: not written again
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
from kvbench.store.results import ResultsStore, Row
store = ResultsStore(sys.argv[1])
for i in range(100_000):
    row = Row("c", "m", "knorm", 0.5, "t", 1, 0, str(i), content_hash="h", extra={"pad": "x" * 50_000})
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
                "kv_bytes": 8,
                "prefill_s": 0.0,
                "decode_s": 0.0,
            }
            for _ in configs
        ]

    monkeypatch.setattr(runner, "evaluate_sample", fake_evaluate)
    model, tokenizer = load_model(tiny_model_dir)
    configs = [Config("none", 0.0), Config("knorm", 0.5)]
    plan = runner.Plan(configs, ["niah_single_1"], 512, samples=2, model=tiny_model_dir)
    store = ResultsStore(tmp_path)
    frame = runner.run_plan(model, tokenizer, plan, store, progress=False)
    assert len(frame) == 4 and (frame.score == 100.0).all() and len(calls) == 2

    bigger = runner.Plan([*configs, Config("tova", 0.5)], ["niah_single_1"], 512, 3, model=tiny_model_dir)
    frame = runner.run_plan(model, tokenizer, bigger, ResultsStore(tmp_path), progress=False)
    assert calls[2:] == [("0-0", ["tova"]), ("0-1", ["tova"]), ("0-2", ["none", "knorm", "tova"])]
    assert len(frame) == 9 and len(load_rows(tmp_path)) == 9

    forced = runner.Plan(configs[:1], ["niah_single_1"], 512, samples=1, force=True, model=tiny_model_dir)
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
        keys = ("context_tokens", "kv_kept", "kv_total", "kv_bytes", "prefill_s", "decode_s")
        return [{"prediction": "x", **dict.fromkeys(keys, 1)} for _ in configs]

    monkeypatch.setattr(runner, "evaluate_sample", fake_evaluate)
    model, tokenizer = load_model(tiny_model_dir)
    for state in ("agents-a", "agents-a", "agents-b"):
        plan = runner.Plan([Config("kvp", 0.5, (), state)], ["niah_single_1"], 512, 1, model=tiny_model_dir)
        runner.run_plan(model, tokenizer, plan, ResultsStore(tmp_path), progress=False)
    assert calls == [["agents-a"], ["agents-b"]]
    rows = load_rows(tmp_path)
    assert rows["press_state"].tolist() == ["agents-a", "agents-b"] and rows["config_id"].nunique() == 2
    # Presses without learned state keep the ids they always had.
    assert config_id("m", "knorm", 0.5, {}, None) == config_id("m", "knorm", 0.5, {})


def fake_outputs(sample, configs) -> list[dict]:
    keys = ("context_tokens", "kv_kept", "kv_total", "kv_bytes", "prefill_s", "decode_s")
    return [{"prediction": sample.references[0], **dict.fromkeys(keys, 1)} for _ in configs]


def one_sample_plan(model_dir) -> runner.Plan:
    return runner.Plan(
        [Config("none", 0.0), Config("knorm", 0.5)], ["niah_single_1"], 512, 1, model=model_dir
    )


def test_a_sample_whose_content_changed_is_scored_again(tmp_path, monkeypatch, tiny_model_dir):
    """Regenerated task data with the same sample ids is recomputed, never served the old rows."""
    calls = []

    def fake_evaluate(model, tokenizer, sample, configs, batch_configs):
        calls.append(sample.content_hash())
        return fake_outputs(sample, configs)

    monkeypatch.setattr(runner, "evaluate_sample", fake_evaluate)
    model, tokenizer = load_model(tiny_model_dir)
    plan = one_sample_plan(tiny_model_dir)
    runner.run_plan(model, tokenizer, plan, ResultsStore(tmp_path), progress=False)
    runner.run_plan(model, tokenizer, plan, ResultsStore(tmp_path), progress=False)  # resumed: nothing new
    [sample] = runner.plan_samples(plan, tokenizer)
    changed = dataclasses.replace(sample, context=sample.context.replace("a", "b", 1))
    assert changed.id == sample.id and changed.content_hash() != sample.content_hash()
    monkeypatch.setattr(runner, "plan_samples", lambda plan, tokenizer: [changed])
    frame = runner.run_plan(model, tokenizer, plan, ResultsStore(tmp_path), progress=False)
    assert calls == [sample.content_hash(), changed.content_hash()]
    # Both versions stay in the file; the latest is what loads (and what the run returns).
    assert len((tmp_path / "rows.jsonl").read_text().splitlines()) == 4
    assert len(frame) == 2 and set(frame.content_hash) == {changed.content_hash()}
    assert set(load_rows(tmp_path).content_hash) == {changed.content_hash()}


def test_rows_without_a_content_hash_resume_when_their_references_match(tmp_path):
    """Rows written before content hashes (the committed reference folders) count as done for a sample
    with the references they recorded, and only then."""
    store = ResultsStore(tmp_path)
    store.append(row("0-0", content=None, references=["7"]))
    store = ResultsStore(tmp_path)
    assert store.claim([row("0-0", content="new", references=["7"])]) == []
    assert store.claim([row("0-0", content="new", references=["8"])]) == [
        row("0-0", content="new", references=["8"])
    ]
    assert store.claim([row("0-0", content="new", references=["7"])], force=True) != []


REPO = Path(__file__).resolve().parents[2]
COMMITTED = sorted((REPO / "results").glob("reference*/rows.jsonl.gz"))


@pytest.mark.parametrize("path", COMMITTED, ids=[path.parent.name for path in COMMITTED])
def test_committed_rows_load_as_rows_and_write_back_unchanged(path):
    lines = gzip.decompress(path.read_bytes()).decode().splitlines()
    for line in lines:
        data = json.loads(line)
        parsed = Row.from_dict(data)
        assert {key: value for key, value in parsed.to_dict().items() if key in data} == data
        # Rows written before content keys have no hash; later ones a 12-hex-digit one.
        assert parsed.content_hash is None or len(parsed.content_hash) == 12
        assert (parsed.nll if parsed.protocol == "perplexity" else parsed.score) is not None
    assert len(load_rows(path.parent)) > 0.9 * len(lines)


def test_a_committed_folder_resumes_without_recomputing(tmp_path, embedded_tokenizer):
    """The reference sweep's first RULER sample, planned today, is found done in the committed rows."""
    shutil.copy(REPO / "results" / "reference" / "rows.jsonl.gz", tmp_path / "rows.jsonl.gz")
    configs = [Config("none", 0.0), Config("knorm", 0.5), Config("tova", 0.9)]
    plan = runner.Plan(configs, ["niah_single_1"], 1024, 1)
    [unit] = runner.plan_units(plan, runner.plan_samples(plan, embedded_tokenizer))
    with ResultsStore(tmp_path) as store:
        assert store.claim(runner.unit_rows(plan, unit)) == []


# Two of these run at once on one folder: each plans 12 samples x 3 configs, one config per unit, with a
# slow fake model; they start together (a barrier on ready files) and print how many rows they computed.
CONCURRENT_WRITER = """
import sys, time
from pathlib import Path
from types import SimpleNamespace
import kvbench.harness.runner as runner
from kvbench.core.config import Config
from kvbench.store.results import ResultsStore
from kvbench.tasks import Sample

out, name = Path(sys.argv[1]), sys.argv[2]
samples = [Sample("t", str(i), "ctx", "q?", "A:", [str(i)], 4, "string_match_all") for i in range(12)]
computed = []

def fake_evaluate(model, tokenizer, sample, configs, batch_configs):
    time.sleep(0.05)
    computed.extend(configs)
    return [{"prediction": sample.references[0]} for _ in configs]

runner.evaluate_sample = fake_evaluate
runner.plan_samples = lambda plan, tokenizer: samples
plan = runner.Plan([Config("none", 0.0), Config("knorm", 0.5), Config("tova", 0.5)], ["t"], 64, 12,
                   batch_configs=1, model="m")
(out.parent / f"ready-{name}").touch()
while len(list(out.parent.glob("ready-*"))) < 2:
    time.sleep(0.01)
with ResultsStore(out) as store:
    frame = runner.run_plan(SimpleNamespace(config=SimpleNamespace(kvbench_name="m")), None, plan, store,
                            progress=False)
print(len(computed), len(frame))
"""


def test_two_processes_on_one_folder_never_duplicate_a_row(tmp_path):
    out = tmp_path / "out"
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", CONCURRENT_WRITER, str(out), name], stdout=subprocess.PIPE, text=True
        )
        for name in ("a", "b")
    ]
    counts = [tuple(map(int, writer.communicate(timeout=300)[0].split())) for writer in writers]
    assert all(writer.returncode == 0 for writer in writers)
    keys = [
        tuple(json.loads(line)[k] for k in ("config_id", "sample_id")) for line in open(out / "rows.jsonl")
    ]
    assert len(keys) == len(set(keys)) == 36  # every row once
    computed = [count for count, _ in counts]
    assert sum(computed) == 36 and min(computed) > 0  # the work was split, none of it done twice
    assert all(returned == 36 for _, returned in counts)  # each run returns every row of its plan
    assert not list((out / "claims").glob("*.json"))  # claims are dropped when the writers close


def test_a_run_record_holds_its_command_as_a_shell_takes_it_back(monkeypatch):
    """A report shows each run's command to be copied into a shell: arguments with spaces, pipes or angle
    brackets are quoted (they were joined by spaces, and `a|b.jsonl` pasted back ran a pipeline)."""
    argv = ["kvbench", "run", "--data", "a|b <c>.jsonl", "--press", "x y=my press.py:P", "--ratio", "0.5"]
    monkeypatch.setattr(sys, "argv", argv)
    assert shlex.split(provenance.run_record({}, {}, "cpu", "now")["command"]) == argv
