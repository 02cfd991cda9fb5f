import torch
from kvpress import DecodingPress

from kvbench.bridge.adapter import keep_cache_order
from kvbench.learned.common import model_shape
from kvbench.learned.common.datagen import capture_prompt
from kvbench.learned.distillcache.per_step import decode_rollout, per_step_loss
from kvbench.learned.distillcache.policy import keep_count
from kvbench.learned.distillcache.press import DistillCachePress, load_policy
from tests.learned.test_distillcache import prefill, random_policy


def test_a_rollout_reads_what_kvpress_decoding_press_gives_token_by_token(tmp_path, tiny_model):
    """The teacher-forced replay (stretches of `interval` tokens per forward, stored prefill features) gives
    the distributions of feeding the same tokens one at a time under kvpress's DecodingPress around the
    press, after the press's own prefill compression."""
    model = tiny_model(initializer_range=0.1)
    random_policy(model, tmp_path)
    policy, _, _ = load_policy(tmp_path, model_shape(model))
    ids = torch.randint(3, 128, (60,), generator=torch.Generator().manual_seed(3)).tolist()
    prompt = capture_prompt(model, ids[:48], ids[48:53], gen_tokens=12)
    ratio, interval = 0.5, 3
    rollout, decisions = decode_rollout(model, lambda f, layer: policy(f, layer), prompt, ratio, interval, 1)

    cache = prefill(model, torch.tensor([ids[:48]]), DistillCachePress(ratio, weights=str(tmp_path)))
    base = DistillCachePress(0.0, weights=str(tmp_path))
    keep_cache_order(base)  # as the engine's decoding presses do
    press = DecodingPress(base_press=base, compression_interval=interval, target_size=keep_count(48, ratio))
    question, continuation = prompt["question_ids"], prompt["continuation_ids"]
    pieces = [question, *continuation.split(1)]
    expected, position = [], 48
    with torch.no_grad(), press(model):
        for piece in pieces:
            positions = torch.arange(position, position + len(piece))[None]
            logits = model(input_ids=piece[None], past_key_values=cache, position_ids=positions).logits
            expected.append(logits[:, -1:].float().log_softmax(-1))
            position += len(piece)
    # The store holds keys and values in fp16 (datagen), the live cache in fp32: a rounding apart, where a
    # single entry kept differently moves log-probabilities by tenths.
    torch.testing.assert_close(rollout, torch.cat(expected, dim=1), atol=5e-3, rtol=0)
    assert len(decisions) > 2  # the replay did compress while decoding, more than once


def test_per_step_credit_gives_a_decision_no_credit_for_rewards_before_it():
    """Rewards that differ only at step 0 move the prefill decision and leave the later one untouched; a
    reward after both moves both."""
    early = torch.zeros(4, 6)
    early[:, 0] = torch.tensor([1.0, -1.0, 0.5, 0.0])
    for rewards, later_moves in ((early, False), (early.roll(4, dims=1), True)):
        log_probs = [torch.zeros(4, requires_grad=True), torch.zeros(4, requires_grad=True)]
        per_step_loss(rewards, log_probs, [0, 3]).backward()
        assert log_probs[0].grad.abs().sum() > 0
        assert (log_probs[1].grad.abs().sum() > 0) == later_moves


def test_per_step_training_end_to_end_saves_a_policy_validated_under_decode_time(tmp_path, tiny_model):
    from kvbench.learned.distillcache import train as training
    from tests.learned.test_distillcache import write_store

    model = tiny_model()
    write_store(model, tmp_path / "data")
    config = training.TrainConfig(
        steps=2, samples=2, eval_every=2, eval_ratios=[0.5], hidden=8, credit="per-step", interval=2
    )
    card = training.train(model, tmp_path / "data", tmp_path / "policy", config, log=lambda line: None)
    assert "decode-time, compressed every 2 steps" in card["validation"]["metric"]
    assert set(card["validation"]["kl"]) == {"distillcache", "knorm", "snapkv", "random"}
    policy, card_on_disk, _ = load_policy(tmp_path / "policy", model_shape(model))
    assert card_on_disk["training"]["credit"] == "per-step"
