import json

import pytest
import torch
from click.testing import CliRunner
from transformers import DynamicCache

from kvbench.cli import main
from kvbench.kvp import datagen
from kvbench.kvp.checkpoint import load_agents, load_card
from kvbench.kvp.datagen import MANIFEST_FILE, DatagenConfig, capture_prompt, plan_shards
from kvbench.models import load_model
from kvbench.presses.kvp import KVPPress
from kvbench.tasks.mixture import MIXTURES, Part


def test_utility_is_the_teacher_forced_attention_of_the_later_queries(tiny_model):
    model = tiny_model(vocab_size=97, eos_token_id=1)
    context, question = list(range(3, 23)), [30, 31, 32]
    captured = capture_prompt(model, context, question, gen_tokens=5)
    assert len(captured["generated"]) == 5
    assert captured["keys"].shape == captured["values"].shape == (2, 2, 20, 16)

    # Reference: one eager pass over context + question + continuation, every query after the context.
    model.set_attn_implementation("eager")
    full = torch.tensor([context + question + captured["generated"]])
    with torch.no_grad():
        output = model(full, output_attentions=True, past_key_values=DynamicCache())
    for layer, attention in enumerate(output.attentions):
        later = attention[0, :, 20:, :20].reshape(2, 2, -1, 20)  # (kv heads, group, queries, P)
        torch.testing.assert_close(captured["utility"][layer], later.amax(dim=1).mean(dim=1))
        torch.testing.assert_close(
            captured["keys"][layer], output.past_key_values.layers[layer].keys[0, :, :20].half()
        )


@pytest.mark.parametrize("tiny_model_dir", ["llama"], indirect=True)
def test_datagen_train_report_and_run_end_to_end(tmp_path, tiny_model_dir):
    runner = CliRunner()
    data, agents = tmp_path / "data", tmp_path / "agents"
    datagen = [
        "kvp",
        "datagen",
        "--model",
        tiny_model_dir,
        "--out",
        str(data),
        "--tasks",
        "niah_single_1,niah_single_2",
    ]
    datagen += ["--length", "512", "--samples", "3", "--gen-tokens", "4", "--val-fraction", "0.34"]
    result = runner.invoke(main, datagen)
    assert result.exit_code == 0, result.output
    manifest = json.loads((data / MANIFEST_FILE).read_text())
    assert [s["split"] for s in manifest["shards"]] == ["val"] * 2 + ["train"] * 4
    assert [s["task"] for s in manifest["shards"]] == ["niah_single_1", "niah_single_2"] * 3
    assert {s["sample_id"] for s in manifest["shards"]} == {"10000-0", "10000-1", "10000-2"}

    # A rerun finds everything done; other settings in the same folder are refused.
    assert runner.invoke(main, datagen).exit_code == 0
    result = runner.invoke(main, [*datagen, "--seed", "20000"])
    assert result.exit_code == 2 and "other settings" in result.output

    train = ["kvp", "train", "--data", str(data), "--out", str(agents), "--steps", "6", "--eval-every", "3"]
    result = runner.invoke(main, [*train, "--rankings", "4", "--hidden", "8"])
    assert result.exit_code == 0, result.output
    assert "oracle -1.0000" in result.output
    assert load_card(agents)["heads"] == [0, 1, 2, 3]

    result = runner.invoke(main, ["kvp", "report", str(agents), "--plot", str(tmp_path / "kvp.png")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "kvp.png").stat().st_size > 0 and "recency" in result.output

    model, _ = load_model(tiny_model_dir)
    press = KVPPress(compression_ratio=0.5, agents=str(agents))
    cache = DynamicCache()
    with torch.no_grad(), press(model):
        model.model(input_ids=torch.arange(10, 110).unsqueeze(0), past_key_values=cache)
    assert [cache.get_seq_length(layer) for layer in range(2)] == [50, 50]


@pytest.mark.parametrize("tiny_model_dir", ["llama"], indirect=True)
def test_mixture_datagen_at_two_lengths_resumes_and_trains_both_archs(tmp_path, tiny_model_dir, monkeypatch):
    parts = [Part("niah_single_1", 512, 2), Part("agent_system_fact", 1024, 2), Part("niah_single_1", 640, 2)]
    monkeypatch.setitem(MIXTURES, "tiny", parts)
    runner = CliRunner()
    data = tmp_path / "data"
    datagen = ["kvp", "datagen", "--model", tiny_model_dir, "--out", str(data), "--mixture", "tiny"]
    datagen += ["--gen-tokens", "2", "--val-fraction", "0.5"]
    result = runner.invoke(main, datagen)
    assert result.exit_code == 0, result.output
    manifest = json.loads((data / MANIFEST_FILE).read_text())
    assert manifest["mixture"] == "tiny" and manifest["config"]["parts"] == [vars(part) for part in parts]
    shards = manifest["shards"]
    # Sample-major: every part's sample 0 (validation), then every part's sample 1.
    assert [(s["task"], s["length"], s["split"]) for s in shards] == [
        (part.task, part.length, split) for split in ("val", "train") for part in parts
    ]
    # The task's second part draws with the next seed: other needles, not the same ones at another length.
    assert [s["sample_id"] for s in shards[:3]] == ["10000-0", "10000-0", "10001-0"]
    tokens = {s["length"]: s["prompt_tokens"] for s in shards}
    assert tokens[512] < tokens[640] < tokens[1024] <= 1024

    # A run stopped after two shards continues with the other four and leaves the first two as they were.
    first = (data / shards[0]["file"]).read_bytes()
    (data / MANIFEST_FILE).write_text(json.dumps({**manifest, "shards": shards[:2]}))
    for shard in shards[2:]:
        (data / shard["file"]).unlink()
    assert runner.invoke(main, datagen).exit_code == 0
    assert json.loads((data / MANIFEST_FILE).read_text())["shards"] == shards
    assert (data / shards[0]["file"]).read_bytes() == first

    for arch in ("compact", "apple"):
        train = ["kvp", "train", "--data", str(data), "--out", str(tmp_path / arch), "--arch", arch]
        result = runner.invoke(
            main, [*train, "--steps", "3", "--tokens", "600", "--rankings", "4", "--hidden", "8"]
        )
        assert result.exit_code == 0, result.output
        result = runner.invoke(main, ["kvp", "report", str(tmp_path / arch)])
        assert result.output.startswith(f"{arch} agents (hidden 8) of {tiny_model_dir}, 3 steps")
    apple, _ = load_agents(tmp_path / "apple")
    assert apple.positions == max(s["prompt_tokens"] for s in shards if s["split"] == "train")


def test_a_task_whose_samples_ignore_the_seed_is_refused(monkeypatch, embedded_tokenizer):
    config = DatagenConfig([Part("niah_single_1", 512, 1)])
    assert len(plan_shards(config, embedded_tokenizer)) == 1
    real = datagen.load_samples
    monkeypatch.setattr(datagen, "load_samples", lambda task, **kwargs: real(task, **{**kwargs, "seed": 7}))
    with pytest.raises(ValueError, match="niah_single_1 samples do not change with the seed"):
        plan_shards(config, embedded_tokenizer)


def test_a_mixture_with_a_part_twice_is_refused():
    with pytest.raises(ValueError, match="task 'vt' at length 1024 twice"):
        DatagenConfig([Part("vt", 1024, 2), Part("cwe", 1024, 2), Part("vt", 1024, 3)])
