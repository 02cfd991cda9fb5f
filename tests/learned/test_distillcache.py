import contextlib
import itertools
import json
import math

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import save_file
from transformers import DynamicCache

from kvbench.cli import main
from kvbench.learned.common import MANIFEST_FILE, SHARED, TrainingFileError, model_shape
from kvbench.learned.common.datagen import capture_prompt
from kvbench.learned.common.ranking import sample_rankings
from kvbench.learned.distillcache import train as training
from kvbench.learned.distillcache.policy import ARCHS, DistillCachePolicy, keep_order_log_prob, token_features
from kvbench.learned.distillcache.press import DistillCachePress, load_policy, save_policy
from kvbench.learned.distillcache.train import DistillData, TrainConfig, compressed_log_probs, kl_rewards
from kvbench.presses import build_press, press_state


def random_policy(model, directory, **card_changes) -> DistillCachePolicy:
    """A policy with a random (non-zero) output layer, saved with a card for `model`."""
    torch.manual_seed(1)
    policy = DistillCachePolicy(hidden=8)
    torch.nn.init.normal_(policy.net[2].weight)
    save_policy(directory, policy, {"model": {**vars(model_shape(model)), **card_changes}})
    return policy


def write_store(model, directory, prompts=3, length=40, method=SHARED) -> None:
    """A data store of random prompts (the last one validates), as datagen writes it."""
    directory.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(0)
    shards = []
    for index in range(prompts):
        ids = torch.randint(3, 128, (length + 6,), generator=generator).tolist()
        captured = capture_prompt(model, ids[:length], ids[length:], gen_tokens=4)
        save_file({k: v.contiguous() for k, v in captured.items()}, directory / f"p{index}.safetensors")
        split = "val" if index == prompts - 1 else "train"
        shards.append({"file": f"p{index}.safetensors", "split": split, "prompt_tokens": length})
    manifest = {"method": method, "model": vars(model_shape(model)), "config": {}, "shards": shards}
    (directory / MANIFEST_FILE).write_text(json.dumps(manifest))


def prefill(model, input_ids, press=None) -> DynamicCache:
    cache = DynamicCache()
    with torch.no_grad(), press(model) if press else contextlib.nullcontext():
        model.model(input_ids=input_ids, past_key_values=cache)
    return cache


def test_kl_reward_equals_an_independent_masked_computation(tiny_model):
    """The reward's compressed run equals the full sequence with evicted context hidden from later queries
    (a 4D mask in one eager pass), and r_t is minus torch's KL of the two distributions."""
    model = tiny_model()
    model.set_attn_implementation("eager")
    ids = torch.randint(3, 128, (1, 30 + 5 + 4), generator=torch.Generator().manual_seed(0))
    context, question, continuation = ids[:, :30], ids[:, 30:35], ids[:, 35:]
    with torch.no_grad():
        full_log_probs = model(ids).logits[0, 34:].log_softmax(-1)  # at the question's last token and after
    cache = prefill(model, context)
    prompt = {
        "keys": torch.stack([layer.keys[0] for layer in cache.layers]),
        "values": torch.stack([layer.values[0] for layer in cache.layers]),
        "question_ids": question[0],
        "continuation_ids": continuation[0],
        "log_probs": full_log_probs,
    }
    kept = torch.tensor(sorted(torch.randperm(30, generator=torch.Generator().manual_seed(1))[:12].tolist()))
    keep = kept.expand(1, 2, 2, -1)  # the same keep-set in every layer and head, so a mask can express it
    rewards = kl_rewards(full_log_probs, compressed_log_probs(model, prompt, keep))

    mask = torch.ones(39, 39).tril().bool()
    evicted = torch.ones(30, dtype=torch.bool)
    evicted[kept] = False
    mask[30:, :30] &= ~evicted
    additive = torch.zeros(1, 1, 39, 39).masked_fill(~mask, torch.finfo(torch.float32).min)
    with torch.no_grad():
        evict_log_probs = model(ids, attention_mask=additive).logits[0, 34:].log_softmax(-1)
    expected = -torch.nn.functional.kl_div(evict_log_probs, full_log_probs, log_target=True, reduction="none")
    torch.testing.assert_close(rewards[0], expected.sum(-1), atol=1e-5, rtol=1e-4)
    assert (rewards < 0).all()
    everything = kl_rewards(
        full_log_probs, compressed_log_probs(model, prompt, torch.arange(30).expand(1, 2, 2, -1))
    )
    torch.testing.assert_close(everything, torch.zeros_like(everything), atol=1e-5, rtol=0)


def test_keep_order_log_prob_matches_brute_force_enumeration():
    scores = torch.tensor([0.3, -1.2, 2.0, 0.7], dtype=torch.float64)
    keep = 2

    def ranking_probability(order):
        p, left = 1.0, list(range(4))
        for token in order:
            p *= math.exp(scores[token]) / sum(math.exp(scores[t]) for t in left)
            left.remove(token)
        return p

    total = 0.0
    for prefix in itertools.permutations(range(4), keep):
        brute = sum(
            ranking_probability(order) for order in itertools.permutations(range(4)) if order[:keep] == prefix
        )
        rest = [t for t in range(4) if t not in prefix]
        ranking = torch.tensor([[*prefix, *rest]])
        assert keep_order_log_prob(scores, ranking, keep).exp().item() == pytest.approx(brute, rel=1e-9)
        total += brute
    assert total == pytest.approx(1.0)

    # Gumbel-top-k draws keep orders with exactly these probabilities.
    draws = sample_rankings(scores.float(), 20000, torch.Generator().manual_seed(0))[:, :keep]
    first = (draws[:, 0] == 2) & (draws[:, 1] == 3)
    expected = keep_order_log_prob(scores, torch.tensor([[2, 3, 0, 1]]), keep).exp().item()
    assert first.float().mean().item() == pytest.approx(expected, abs=0.015)


@pytest.mark.parametrize("arch", ARCHS)
def test_training_steps_raise_the_reward_on_a_tiny_problem(monkeypatch, arch):
    """Reward = minus the number of 'needle' entries evicted, needles marked by a high key norm: a few
    REINFORCE steps make the sampled keep-sets better and the policy's top-k keep the needles."""
    torch.manual_seed(0)
    layers, heads, length = 2, 2, 24
    features = torch.randn(layers, heads, length, 7)
    needles = torch.zeros(layers, heads, length, dtype=torch.bool)
    needles[..., :6] = True
    features[..., 3] = needles.float() * 2 + 0.1 * torch.randn(layers, heads, length)
    prompt = {"features": features, "log_probs": torch.zeros(1, 5)}

    def fake_log_probs(model, prompt, keep):  # one "step" whose KL is the number of needles evicted
        kept = torch.zeros(keep.shape[0], layers, heads, length, dtype=torch.bool).scatter(-1, keep, True)
        evicted = (needles & ~kept).flatten(1).sum(-1).float()
        return torch.stack([torch.zeros_like(evicted)] * 4 + [-evicted], -1)[:, None]  # (B, 1, 5)

    monkeypatch.setattr(training, "compressed_log_probs", fake_log_probs)
    monkeypatch.setattr(training, "kl_rewards", lambda full, evict: evict[..., -1])
    config = TrainConfig(samples=8, lr=0.05, entropy_bonus=0.0)
    policy = DistillCachePolicy(hidden=8, arch=arch, heads=(layers, heads))
    optimizer = torch.optim.AdamW(policy.parameters(), lr=config.lr)
    generator = torch.Generator().manual_seed(0)
    rewards = [training.train_step(None, policy, optimizer, prompt, [0.5], config, generator)["rewards"][0.5]]
    for _ in range(40):
        rewards.append(
            training.train_step(None, policy, optimizer, prompt, [0.5], config, generator)["rewards"][0.5]
        )
    assert sum(rewards[-5:]) / 5 > rewards[0] / 2  # evicts fewer than half as many needles as at the start
    top = policy(features).topk(12, dim=-1).indices
    assert needles.gather(-1, top).sum() == needles.sum()


@pytest.mark.parametrize("arch", ARCHS)
def test_train_end_to_end_on_a_tiny_store_saves_a_policy_the_press_loads(tmp_path, tiny_model, arch):
    model = tiny_model()
    write_store(model, tmp_path / "data")
    config = TrainConfig(steps=3, samples=2, eval_every=2, eval_ratios=[0.5], hidden=8, arch=arch)
    card = training.train(model, tmp_path / "data", tmp_path / "policy", config, log=lambda line: None)
    assert set(card["validation"]["kl"]) == {"distillcache", "knorm", "snapkv", "random"}
    assert [row["step"] for row in card["validation"]["history"]] == [0, 2, 3]
    policy, card_on_disk, digest = load_policy(tmp_path / "policy", model_shape(model))
    assert card_on_disk["method"] == "distillcache" and len(digest) == 12
    assert policy.arch == card_on_disk["policy"]["arch"] == arch
    press = build_press("distillcache", 0.5, weights=str(tmp_path / "policy"))
    prefill(model, torch.randint(3, 128, (1, 20)), press)
    assert press_state(press) == digest


def test_per_head_policy_with_the_shared_weights_in_every_head_scores_as_the_shared_one():
    torch.manual_seed(0)
    shared = DistillCachePolicy(hidden=8)
    torch.nn.init.normal_(shared.net[2].weight)
    per_head = DistillCachePolicy(hidden=8, arch="per-head", heads=(3, 2))
    first, second = shared.net[0], shared.net[2]
    with torch.no_grad():
        per_head.w1.copy_(first.weight.T.expand(3, 2, -1, -1))
        per_head.b1.copy_(first.bias.expand(3, 2, -1))
        per_head.w2.copy_(second.weight[0].expand(3, 2, -1))
        per_head.b2.fill_(second.bias.item())
        every_layer = torch.randn(3, 2, 10, 7)  # training's layout: (layers, kv_heads, L, 7)
        torch.testing.assert_close(per_head(every_layer), shared(every_layer))
        one_layer = torch.randn(4, 2, 10, 7)  # the press's: (batch, kv_heads, L, 7) of one layer
        torch.testing.assert_close(per_head(one_layer, 2), shared(one_layer))
        # Changing one head's weights changes that head's scores only, and only in its layer.
        per_head.w2[2, 1] += 1
        changed = ~torch.isclose(per_head(one_layer, 2), shared(one_layer))
        assert changed[:, 1].all() and not changed[:, 0].any()
        torch.testing.assert_close(per_head(one_layer, 1), shared(one_layer))


@pytest.mark.parametrize("arch", ARCHS)
def test_a_knorm_start_ranks_entries_as_knorm_does(arch):
    """Keep the entries with the smallest keys: the order of kvpress's KnormPress, for both archs."""
    torch.manual_seed(0)
    policy = DistillCachePolicy(hidden=8, arch=arch, heads=(3, 2))
    policy.feature_mean.copy_(torch.randn(7))
    policy.feature_std.copy_(torch.rand(7) + 0.5)
    policy.start_as_knorm()
    features = policy.feature_mean + policy.feature_std * torch.randn(3, 2, 50, 7)  # z-scores ~ N(0, 1)
    key_norm = features[..., 3]
    assert torch.equal(policy(features).argsort(-1), (-key_norm).argsort(-1))
    assert torch.equal(policy(features[1:2], 1).argsort(-1), (-key_norm[1:2]).argsort(-1))


def test_press_keeps_exactly_the_top_scored_entries_of_each_head(tmp_path, tiny_model):
    model = tiny_model()
    policy = random_policy(model, tmp_path)
    input_ids = torch.randint(0, 128, (1, 45))
    inputs = {}
    hooks = [
        layer.self_attn.register_forward_hook(
            lambda module, args, kwargs, out: inputs.__setitem__(module.layer_idx, kwargs["hidden_states"]),
            with_kwargs=True,
        )
        for layer in model.model.layers
    ]
    full = prefill(model, input_ids)
    for hook in hooks:
        hook.remove()
    compressed = prefill(model, input_ids, build_press("distillcache", 0.4, weights=str(tmp_path)))
    n_kept = int(45 * (1 - 0.4))
    for layer in range(2):
        keys, values = full.layers[layer].keys, full.layers[layer].values
        module = model.model.layers[layer].self_attn
        features = token_features(module, inputs[layer], keys, values, model.model.rotary_emb, 44, 2)
        top = policy(features).topk(n_kept, dim=-1).indices.unsqueeze(-1).expand(-1, -1, -1, keys.shape[-1])
        assert compressed.layers[layer].keys.shape == (1, 2, n_kept, 16)
        torch.testing.assert_close(compressed.layers[layer].keys, keys.gather(2, top))
        torch.testing.assert_close(compressed.layers[layer].values, values.gather(2, top))


def test_features_at_prefill_match_the_stored_ones(tiny_model):
    """Datagen stores what the press computes: the same function on the same prefill."""
    model = tiny_model()
    ids = torch.randint(3, 128, (30,)).tolist()
    captured = capture_prompt(model, ids[:25], ids[25:], gen_tokens=2)
    assert captured["features"].shape == (2, 2, 25, 7)
    assert torch.isfinite(captured["features"]).all()
    torch.testing.assert_close(captured["features"][1, :, :, 6], torch.full((2, 25), 0.5))
    assert captured["log_probs"].shape[0] == len(captured["continuation_ids"]) + 1


def one_line_error(call, match):
    with pytest.raises(TrainingFileError, match=match) as error:
        call()
    assert "\n" not in str(error.value)


def test_bad_weights_are_one_line_errors(tmp_path, tiny_model):
    model = tiny_model()
    shape = model_shape(model)
    one_line_error(
        lambda: load_policy(tmp_path / "nowhere", shape), "no distillcache weights.*datagen.*train"
    )
    random_policy(model, tmp_path / "other", num_layers=30)
    one_line_error(lambda: load_policy(tmp_path / "other", shape), "were made for")
    random_policy(model, tmp_path / "corrupt")
    (tmp_path / "corrupt" / DistillCachePress.state_file).write_bytes(b"not safetensors")
    one_line_error(lambda: load_policy(tmp_path / "corrupt", shape), "policy.safetensors is corrupt")
    random_policy(model, tmp_path / "kvp")
    card = json.loads((tmp_path / "kvp" / "card.json").read_text())
    (tmp_path / "kvp" / "card.json").write_text(json.dumps({**card, "method": "kvp"}))
    one_line_error(lambda: load_policy(tmp_path / "kvp", shape), "holds kvp weights")
    (tmp_path / "kvp" / "card.json").write_text("{truncated")
    one_line_error(lambda: load_policy(tmp_path / "kvp", shape), "card.json is corrupt")
    with pytest.raises(TrainingFileError, match="no distillcache weights"):
        prefill(
            model, torch.randint(0, 128, (1, 10)), build_press("distillcache", 0.5, weights=str(tmp_path))
        )


def test_bad_data_stores_are_one_line_errors(tmp_path, tiny_model):
    model = tiny_model()
    one_line_error(
        lambda: DistillData(tmp_path / "nowhere"), "no distillcache data.*kvbench distillcache datagen"
    )
    write_store(model, tmp_path / "kvp", prompts=2)
    manifest = json.loads((tmp_path / "kvp" / MANIFEST_FILE).read_text())
    del manifest["method"]  # KVP's stores from before the field: KVP's
    (tmp_path / "kvp" / MANIFEST_FILE).write_text(json.dumps(manifest))
    one_line_error(
        lambda: DistillData(tmp_path / "kvp"), "is a kvp data store, which lacks what distillcache"
    )
    (tmp_path / "kvp" / MANIFEST_FILE).write_text(json.dumps({**manifest, "method": "distillcache"}))
    assert (
        len(DistillData(tmp_path / "kvp").train) == 1
    )  # DistillCache's own stores from before the shared one
    (tmp_path / "kvp" / MANIFEST_FILE).write_text("[1, 2")
    one_line_error(lambda: DistillData(tmp_path / "kvp"), "manifest.json is corrupt")
    write_store(model, tmp_path / "cut", prompts=2)
    (tmp_path / "cut" / "p0.safetensors").write_bytes(b"\x00" * 10)
    data = DistillData(tmp_path / "cut")
    one_line_error(lambda: data.load(data.train[0]), "p0.safetensors is unreadable.*datagen")


def test_several_stores_train_as_their_union(tmp_path, tiny_model):
    """A shared store and an older DistillCache one (e.g. two mixture parts made apart) train together."""
    model = tiny_model()
    write_store(model, tmp_path / "a", prompts=2)
    write_store(model, tmp_path / "b", prompts=3, length=30, method="distillcache")
    data = DistillData([tmp_path / "a", tmp_path / "b"])
    assert (len(data.train), len(data.val)) == (3, 2)
    assert [data.load(shard)["keys"].shape[2] for shard in data.train] == [40, 30, 30]
    assert [folder["prompts"] for folder in data.summary()["folders"]] == [2, 3]


def test_cli_refuses_a_bad_store_with_exit_2_and_writes_nothing(tmp_path):
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / MANIFEST_FILE).write_text(json.dumps({"model": {}, "config": {}, "shards": []}))
    result = CliRunner().invoke(
        main, ["distillcache", "train", "--data", str(tmp_path / "store"), "--out", str(tmp_path / "out")]
    )
    assert result.exit_code == 2, result.output
    assert "kvp data store" in result.output and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()
    result = CliRunner().invoke(main, ["distillcache", "report", str(tmp_path / "none")])
    assert result.exit_code == 2 and "no distillcache weights" in result.output


def test_decode_time_in_the_engine_answers_as_kvpress_decoding_press(monkeypatch, tmp_path, tiny_model):
    """Decode-time: the engine's batch wraps the press in kvpress's DecodingPress; the answer is the one
    kvpress's pipeline gives with PrefillDecodingPress around the same policy."""
    from kvpress import DecodingPress, KVPressTextGenerationPipeline, PrefillDecodingPress

    from kvbench.bridge.models import load_tokenizer
    from kvbench.core.config import Config
    from kvbench.learned.distillcache.press import DistillCachePress
    from kvbench.tasks.prompt import tokenize_sample
    from tests.engine.test_engine import decoded_token_ids, engine_token_ids, word_soup_sample

    tokenizer = load_tokenizer()
    model = tiny_model("llama", len(tokenizer), initializer_range=0.1, attn_implementation="sdpa")
    random_policy(model, tmp_path)
    sample = word_soup_sample(150, max_new_tokens=20)
    weights = (("weights", str(tmp_path)),)
    configs = [
        Config("distillcache", 0.5, weights, protocol="decode-time", protocol_args=(("interval", 4),)),
        Config("distillcache", 0.5, weights),
    ]
    engine_ids, results = engine_token_ids(monkeypatch, model, tokenizer, sample, configs)

    target = int(tokenize_sample(tokenizer, sample).context_ids.shape[1] * 0.5)
    base = DistillCachePress(0.0, weights=str(tmp_path))
    from kvbench.bridge.adapter import keep_cache_order

    keep_cache_order(base)  # as the engine's decoding presses do (kvpress issue #173)
    decoding = DecodingPress(base_press=base, compression_interval=4, target_size=target)
    press = PrefillDecodingPress(
        prefilling_press=DistillCachePress(0.5, weights=str(tmp_path)), decoding_press=decoding
    )
    pipeline = KVPressTextGenerationPipeline(model=model, tokenizer=tokenizer, device=model.device)
    calls = decoded_token_ids(monkeypatch, tokenizer)
    pipeline(
        sample.context,
        question=sample.question,
        answer_prefix=sample.answer_prefix,
        press=press,
        max_new_tokens=20,
    )
    assert engine_ids[0] == calls[0]
    assert results[0]["kv_kept"] <= results[1]["kv_kept"] + 4 * 2 * 2
