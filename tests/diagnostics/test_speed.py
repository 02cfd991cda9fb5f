"""`kvbench speed`: the allocated bytes it reports are the cache's real storage, its costs resume, and bad
input is one line before the model loads."""

import json

import pytest
import torch
from click.testing import CliRunner
from transformers import DynamicCache

from kvbench.cli import main
from kvbench.core.errors import DataFileError
from kvbench.diagnostics import speed


def test_allocated_bytes_count_each_storage_once():
    cache = DynamicCache()
    buffer = torch.zeros(2, 1, 2, 10, 4)  # keys and values as two views of one buffer: counted once
    cache.update(buffer[0], buffer[1], 0)
    cache.update(
        torch.zeros(1, 2, 3, 4, dtype=torch.float16), torch.zeros(1, 2, 3, 4, dtype=torch.float16), 1
    )
    assert speed.allocated_bytes(cache) == buffer.nbytes + 2 * 2 * 3 * 4 * 2


@pytest.fixture
def costs(tiny_llama_dir, tmp_path, one_thread):
    plan = speed.plan_speed("knorm,quant", "64", tmp_path / "out", memory="0.25", new_tokens=2, repeats=1)
    return {cost.press: cost for cost in speed.run_speed(plan, tiny_llama_dir)}, plan


def test_allocated_bytes_are_the_kept_entries_storage_and_codecs_store_dequantised(costs):
    """knorm at memory 0.25 keeps a quarter of the entries, stored at float32: a quarter of the full
    cache's storage, twice its 16-bit accounting. quant's codes are dequantised before attention reads
    them: its storage is the full cache's, far above the bytes it accounts for."""
    costs, _ = costs
    knorm, quant = costs["knorm"], costs["quant"]
    full = 2 * 2 * 64 * 2 * 16 * 4  # layers x (keys, values) x tokens x KV heads x head dim x float32
    assert knorm.allocated_bytes_full == quant.allocated_bytes_full == full
    assert knorm.allocated_bytes == full // 4 and knorm.accounted_bytes == full // 4 // 2
    assert quant.allocated_bytes == full and quant.accounted_bytes < 0.25 * quant.accounted_bytes_full
    assert knorm.prefill_s > 0 and knorm.decode_tokens_per_s > 0


def test_a_second_run_resumes_and_a_damaged_file_is_refused(costs, tiny_llama_dir, monkeypatch):
    _, plan = costs
    path = plan.out / speed.COSTS_FILE
    before = path.read_text()
    again = speed.plan_speed("knorm,quant", "64", plan.out, memory="0.25", new_tokens=2, repeats=1)
    monkeypatch.setattr("kvbench.bridge.models.load_model", fail_if_loaded)
    assert len(speed.run_speed(again, tiny_llama_dir)) == 2 and path.read_text() == before
    row = json.loads(before.splitlines()[0])
    path.write_text(before + json.dumps({**row, "prefill_s": "fast"}) + "\n")
    with pytest.raises(DataFileError, match="line 3"):
        speed.plan_speed("knorm", "64", plan.out, memory="0.25")


def test_head_wise_masks_count_as_evicted_and_never_outlive_their_press(tiny_llama_dir, tmp_path, one_thread):
    """AnDPro (kvpress's AdaKV underneath) masks the entries it evicts and keeps them allocated: accounted
    as the engine counts them (a quarter of the entries at memory 0.25), allocated in full, and its masks
    are cleared before the next uncompressed prefill."""
    from kvbench.bridge.adapter import masked_entries
    from kvbench.bridge.models import load_model

    plan = speed.plan_speed("andpro", "64", tmp_path / "out", memory="0.25", new_tokens=2, repeats=2)
    [andpro] = speed.run_speed(plan, tiny_llama_dir)
    assert andpro.allocated_bytes == andpro.allocated_bytes_full
    assert andpro.accounted_bytes == pytest.approx(0.25 * andpro.accounted_bytes_full, rel=0.05)
    model, _ = load_model(tiny_llama_dir)
    config = plan.configs[0]
    from kvbench.presses import config_press

    ids = torch.randint(0, model.config.vocab_size, (1, 64))
    speed.measure_cost(model, config, config_press(config), ids, plan, "cpu")
    assert masked_entries(model) == 0


def fail_if_loaded(*args, **kwargs):
    raise AssertionError("a bad input must fail before the model loads")


@pytest.mark.parametrize(
    "args, culprit",
    [
        (["--lengths", "0"], "--lengths"),
        (["--lengths", "abc"], "--lengths"),
        (["--lengths", ","], "--lengths"),
        (["--lengths", "128,256,128"], "--lengths names 128 twice"),
        (["--lengths", "100000"], "exceed the 8192-token context of model 'smollm2-135m'"),
        (["--lengths", "128,8192"], "--lengths 8192 and 32 new tokens exceed the 8192-token context"),
        (["--repeats", "0"], "--repeats"),
        (["--new-tokens", "nan"], "--new-tokens"),
        (["--presses", "nope"], "nope"),
        (["--memory", "2"], "memory"),
        (["--memory", "0.5", "--ratios", "0.5"], "exactly one"),
        (["--press-arg", "window=abc"], "window"),
        (["--out", "{tmp}/file"], "is a file"),
        (["--out", "{tmp}/damaged"], "costs.jsonl line 1"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(args, culprit, tmp_path, monkeypatch):
    (tmp_path / "file").write_text("x")
    (tmp_path / "damaged").mkdir()
    (tmp_path / "damaged" / speed.COSTS_FILE).write_text("{not json\n")
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    monkeypatch.setattr("kvbench.bridge.models.load_model", fail_if_loaded)
    args = [arg.replace("{tmp}", str(tmp_path)) for arg in args]
    if "--out" not in args:
        args += ["--out", str(tmp_path / "out")]
    result = CliRunner().invoke(main, ["speed", "--presses", "knorm", *args])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and culprit in lines[0], result.output
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before
