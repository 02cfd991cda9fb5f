import json

import pytest
import torch
from click.testing import CliRunner
from safetensors import safe_open
from transformers import DynamicCache

from kvbench.bridge.models import load_model, load_tokenizer
from kvbench.cli import main
from kvbench.learned.common import MANIFEST_FILE, datagen
from kvbench.learned.common.config import DatagenConfig
from kvbench.learned.common.datagen import (
    capture_prompt,
    capture_whole_prompt,
    plan_shards,
    reconstruction_prompt_ids,
)
from kvbench.learned.kvp.checkpoint import load_agents, load_card
from kvbench.learned.kvp.press import KVPPress
from kvbench.tasks import load_samples
from kvbench.tasks.mixture import MIXTURES, Part
from kvbench.tasks.prompt import tokenize_sample


def test_the_capture_is_one_teacher_forced_eager_pass_over_the_whole_prompt(tiny_model):
    """Every stored tensor against one eager pass over context + question + continuation: utility (KVP),
    window attention and key norm features, and next-token log-probabilities (DistillCache)."""
    model = tiny_model(vocab_size=97, eos_token_id=1)
    context, question = list(range(3, 43)), [50, 51, 52]
    captured = capture_prompt(model, context, question, gen_tokens=5)
    continuation = captured["continuation_ids"].tolist()
    assert len(continuation) == 5 and captured["question_ids"].tolist() == question
    assert captured["keys"].shape == captured["values"].shape == (2, 2, 40, 16)
    assert captured["features"].shape == (2, 2, 40, 7) and captured["log_probs"].shape == (6, 97)

    model.set_attn_implementation("eager")
    with torch.no_grad():
        output = model(torch.tensor([context + question + continuation]), output_attentions=True)
    for layer, attention in enumerate(output.attentions):
        later = attention[0, :, 40:, :40].reshape(2, 2, -1, 40)  # (kv heads, group, queries, P)
        torch.testing.assert_close(captured["utility"][layer], later.amax(dim=1).mean(dim=1))
        keys = output.past_key_values.layers[layer].keys[0, :, :40]
        torch.testing.assert_close(captured["keys"][layer], keys.half(), atol=2e-3, rtol=1e-3)
        torch.testing.assert_close(captured["features"][layer, ..., 3], keys.norm(dim=-1).log())
        # The window is the context's last 32 queries; each reads the context up to itself only.
        window = attention[0, :, 8:40, :40].reshape(2, 2, 32, 40).mean(dim=1)  # group mean
        torch.testing.assert_close(captured["features"][layer, ..., 0], (window.mean(dim=1) + 1e-6).log())
    log_probs = output.logits[0, 42:].log_softmax(-1)  # at the question's last token and after
    torch.testing.assert_close(captured["log_probs"].float(), log_probs, atol=2e-3, rtol=1e-3)
    assert captured["log_probs"].argmax(-1)[:-1].tolist() == continuation  # greedy


def test_the_authors_target_ranks_the_whole_prompt_by_the_generated_queries_alone(tiny_model):
    """--target authors against one eager pass over prompt + generation: every prompt token is ranked (the
    question's too), and its utility is the sum over the generated tokens' queries (none of the prompt's)
    of the group's most attention; the generation stops at a stop token, which it keeps."""
    model = tiny_model(vocab_size=97, eos_token_id=1)
    prompt = list(range(3, 43)) + [50, 51, 52]
    captured = capture_whole_prompt(model, prompt, gen_tokens=6)
    generated = captured["continuation_ids"].tolist()
    assert len(generated) == 6 and captured["keys"].shape == (2, 2, 43, 16)
    model.set_attn_implementation("eager")
    with torch.no_grad():
        output = model(torch.tensor([prompt + generated]), output_attentions=True)
    assert output.logits[0, 42:-1].argmax(-1).tolist() == generated  # greedy
    for layer, attention in enumerate(output.attentions):
        future = attention[0, :, 43:, :43].reshape(2, 2, -1, 43)  # (kv heads, group, generated, P)
        torch.testing.assert_close(captured["utility"][layer], future.amax(dim=1).sum(dim=1))
    # A stop token ends the generation after it is fed: its query is the future's last.
    model.generation_config.eos_token_id = generated[2]
    stopped = capture_whole_prompt(model, prompt, gen_tokens=6)
    assert stopped["continuation_ids"].tolist() == generated[: generated.index(generated[2]) + 1]
    model.set_attn_implementation("sdpa")


def test_the_reconstruction_score_is_kvzips_max_attention_of_one_eager_pass_repeating_the_context(tiny_model):
    """Against one eager pass over context + request + context: the most attention any query after the
    context pays to each context token, over the KV group's heads and the queries; the other tensors are
    those of a capture without it (the pass runs on a cache cropped back to the context)."""
    model = tiny_model(vocab_size=97, eos_token_id=1)
    context, question, request = list(range(3, 43)), [50, 51, 52], [60, 61, 62, 63]
    plain = capture_prompt(model, context, question, gen_tokens=5)
    captured = capture_prompt(model, context, question, gen_tokens=5, reconstruction_ids=request)
    for name, tensor in plain.items():
        assert torch.equal(captured[name], tensor), name
    assert captured["reconstruction"].shape == (2, 2, 40)

    model.set_attn_implementation("eager")
    with torch.no_grad():
        output = model(torch.tensor([context + request + context]), output_attentions=True)
    for layer, attention in enumerate(output.attentions):
        repeat = attention[0, :, 40:, :40].reshape(2, 2, -1, 40)  # (kv heads, group, queries, P)
        torch.testing.assert_close(captured["reconstruction"][layer], repeat.amax(dim=(1, 2)))


def test_the_reconstruction_request_is_kvzips_before_the_templates_assistant_turn(embedded_tokenizer):
    """KVZip's request, then what the chat template writes after a user's content (the turn's end and the
    assistant's start), found in the template's own rendering, not written out by hand."""
    ids = reconstruction_prompt_ids(embedded_tokenizer)
    text = embedded_tokenizer.decode(ids)
    request = "\n\nRepeat the previous context exactly."
    assert text.startswith(request)
    rendered = embedded_tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=False
    )
    assert rendered.endswith("Hi" + text.removeprefix(request)) and text != request


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

    assert manifest["method"] == "shared" and manifest["mixture"] is None

    # A rerun finds everything done, under either press's name; other settings are refused.
    assert runner.invoke(main, datagen).exit_code == 0
    result = runner.invoke(main, ["distillcache", *datagen[1:]])
    assert result.exit_code == 0 and "0it" in result.output and f"6 prompts in {data}" in result.output
    assert json.loads((data / MANIFEST_FILE).read_text()) == manifest
    result = runner.invoke(main, [*datagen, "--seed", "20000"])
    assert result.exit_code == 2 and "other settings" in result.output
    # A store made before --reconstruction existed (no such key in its config) resumes without it.
    older = {**manifest, "config": {k: v for k, v in manifest["config"].items() if k != "reconstruction"}}
    (data / MANIFEST_FILE).write_text(json.dumps(older))
    assert runner.invoke(main, datagen).exit_code == 0
    result = runner.invoke(main, [*datagen, "--reconstruction"])
    assert result.exit_code == 2 and "other settings" in result.output

    # DistillCache trains from the same store.
    policy = tmp_path / "policy"
    train = ["distillcache", "train", "--model", tiny_model_dir, "--data", str(data), "--out", str(policy)]
    result = runner.invoke(main, [*train, "--steps", "2", "--eval-every", "2", "--samples", "2"])
    assert result.exit_code == 0, result.output
    card = json.loads((policy / "card.json").read_text())
    assert card["data"]["train_prompts"] == 4 and card["data"]["parts"][0]["task"] == "niah_single_1"

    train = ["kvp", "train", "--data", str(data), "--out", str(agents), "--steps", "6", "--eval-every", "3"]
    result = runner.invoke(main, [*train, "--rankings", "4", "--hidden", "8"])
    assert result.exit_code == 0, result.output
    assert "oracle -1.0000" in result.output
    assert load_card(agents)["heads"] == [0, 1, 2, 3]
    result = runner.invoke(main, [*train, "--utility", "reconstruction"])
    assert result.exit_code == 2 and "already holds learned state" in result.output
    result = runner.invoke(main, [*train, "--utility", "reconstruction", "--replace"])
    assert result.exit_code == 2 and "holds no reconstruction scores" in result.output
    result = runner.invoke(main, ["kvp", "report", str(agents)])
    assert "6 steps in" in result.output and ", utility future\n" in result.output

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
    datagen += ["--gen-tokens", "2", "--val-fraction", "0.5", "--reconstruction"]
    result = runner.invoke(main, datagen)
    assert result.exit_code == 0, result.output
    manifest = json.loads((data / MANIFEST_FILE).read_text())
    assert manifest["mixture"] == "tiny" and manifest["config"]["parts"] == [vars(part) for part in parts]
    assert manifest["config"]["reconstruction"] is True
    with safe_open(data / manifest["shards"][0]["file"], framework="pt") as shard:
        assert shard.get_tensor("reconstruction").shape == shard.get_tensor("utility").shape
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

    for arch, utility in (("compact", "mixed"), ("apple", "reconstruction")):
        train = ["kvp", "train", "--data", str(data), "--out", str(tmp_path / arch), "--arch", arch]
        train += ["--utility", utility]
        result = runner.invoke(
            main, [*train, "--steps", "3", "--tokens", "600", "--rankings", "4", "--hidden", "8"]
        )
        assert result.exit_code == 0, result.output
        result = runner.invoke(main, ["kvp", "report", str(tmp_path / arch)])
        assert result.output.startswith(f"{arch} agents (hidden 8) of {tiny_model_dir}, 3 steps")
        assert f", utility {utility}\n" in result.output
    apple, _ = load_agents(tmp_path / "apple")
    assert apple.positions == max(s["prompt_tokens"] for s in shards if s["split"] == "train")


def test_a_task_whose_samples_ignore_the_seed_is_refused(monkeypatch, embedded_tokenizer):
    config = DatagenConfig([Part("niah_single_1", 512, 1)], val_fraction=1.0)
    assert len(plan_shards(config, embedded_tokenizer)) == 1
    real = datagen.load_samples
    monkeypatch.setattr(datagen, "load_samples", lambda task, **kwargs: real(task, **{**kwargs, "seed": 7}))
    with pytest.raises(ValueError, match="niah_single_1 samples do not change with the seed"):
        plan_shards(config, embedded_tokenizer)


def test_a_mixture_with_a_part_twice_is_refused():
    with pytest.raises(ValueError, match="task 'vt' at length 1024 twice"):
        DatagenConfig([Part("vt", 1024, 2), Part("cwe", 1024, 2), Part("vt", 1024, 3)])


@pytest.mark.parametrize("tiny_model_dir", ["llama"], indirect=True)
def test_the_authors_recipe_end_to_end_datagen_then_train(tmp_path, tiny_model_dir):
    """`datagen --target authors` ranks whole prompts (context + question) and stores a KVP-only store that
    DistillCache refuses; `train --recipe authors` trains the apple agent with its settings on the card."""
    runner = CliRunner()
    data, agents = tmp_path / "data", tmp_path / "agents"
    datagen = ["kvp", "datagen", "--model", tiny_model_dir, "--out", str(data), "--tasks", "niah_single_1"]
    datagen += ["--length", "512", "--samples", "3", "--gen-tokens", "3", "--val-fraction", "0.34"]
    result = runner.invoke(main, [*datagen, "--target", "authors"])
    assert result.exit_code == 0, result.output
    manifest = json.loads((data / MANIFEST_FILE).read_text())
    assert manifest["method"] == "kvp" and manifest["config"]["target"] == "authors"
    shard = manifest["shards"][0]
    sample = load_samples(
        "niah_single_1", length=512, samples=1, seed=10000, tokenizer=load_tokenizer(tiny_model_dir)
    )
    prompt = tokenize_sample(load_tokenizer(tiny_model_dir), sample[0])
    assert shard["prompt_tokens"] == prompt.context_ids.shape[1] + prompt.question_ids.shape[1]
    result = runner.invoke(main, [*datagen, "--target", "authors", "--reconstruction"])
    assert (
        result.exit_code == 2 and "--reconstruction scores the context of --target kvbench" in result.output
    )
    train = [
        "distillcache",
        "train",
        "--model",
        tiny_model_dir,
        "--data",
        str(data),
        "--out",
        str(tmp_path / "p"),
    ]
    result = runner.invoke(main, train)
    assert result.exit_code == 2 and "lacks what distillcache trains on" in result.output

    train = ["kvp", "train", "--data", str(data), "--out", str(agents), "--recipe", "authors"]
    result = runner.invoke(
        main, [*train, "--steps", "4", "--prompts", "2", "--eval-every", "2", "--hidden", "8"]
    )
    assert result.exit_code == 0, result.output
    recipe = load_card(agents)["training"]
    assert recipe["recipe"] == "authors" and recipe["arch"] == "apple" and recipe["position_rows"] == 6000
    assert (recipe["baseline"], recipe["rankings"], recipe["tokens"]) == ("batch", 1, None)
    assert (recipe["grad_clip"], recipe["advantage_clip"], recipe["reward_floor"]) == (5.0, 2.0, -200.0)
    assert (recipe["lr"], recipe["weight_decay"], recipe["ema_burnin"]) == (5e-5, 1e-3, 100)
    assert recipe["standardise"] is False and recipe["loss_per_step"] and recipe["normalise_advantages"]
