"""Train a DistillCache policy: REINFORCE on keep-sets, rewarded by how close the compressed cache's
next-token distributions stay to the uncompressed model's (per-step KL), with the frozen model in the loop.

Per step: one training prompt and a few compression ratios drawn from `ratios`. The policy scores every
context entry of every (layer, KV head) from its stored features; for each ratio, K keep-sets per head are
drawn with Gumbel-top-k (Plackett-Luce without replacement), the model runs the question and the stored
continuation teacher-forced on each of the K compressed caches (one batch), and each keep-set's reward is
R = sum_t r_t, r_t = -KL(p_full,t || p_evict,t). The advantage is leave-one-out (RLOO: the mean of the other
K - 1 rewards is the baseline), divided by the group's std so that ratios and prompts weigh alike; the loss is
-advantage x (Plackett-Luce log-probability of the keep order, per pick) - entropy_bonus x (first-pick
entropy / log L). AdamW; an exponential moving average (EMA) of the weights is validated (deterministic
top-k on held-out prompts, mean KL per continuation step at fixed ratios) and the best EMA weights are saved.

`credit="per-step"` trains the same policy on decisions taken while decoding instead, each credited with the
reward that follows it (per_step.py), and validates under that decode-time replay.
"""

import copy
import math
import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from kvbench.core.provenance import git_commit
from kvbench.learned.common import TrainingFileError, model_shape
from kvbench.learned.common.ranking import sample_rankings
from kvbench.learned.distillcache.config import CREDITS, TENSORS, DistillData, TrainConfig  # noqa: F401
from kvbench.learned.distillcache.per_step import decision_log_prob, decode_rollout, per_step_loss
from kvbench.learned.distillcache.policy import (
    WINDOW,
    DistillCachePolicy,
    first_pick_entropy,
    keep_count,
    keep_order_log_prob,
)
from kvbench.learned.distillcache.press import save_policy

REFERENCES = ("knorm", "snapkv", "random")


def feature_statistics(data: DistillData) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and std of each feature over every entry of the training prompts."""
    sums, squares, count = torch.zeros(7, dtype=torch.float64), torch.zeros(7, dtype=torch.float64), 0
    for shard in data.train:
        features = data.load(shard, ["features"])["features"].flatten(0, 2).double()
        sums += features.sum(0)
        squares += features.square().sum(0)
        count += features.shape[0]
    mean = sums / count
    return mean.float(), (squares / count - mean.square()).clamp_min(1e-8).sqrt().float()


@torch.no_grad()
def compressed_log_probs(model, prompt: dict, keep: torch.Tensor) -> torch.Tensor:
    """Next-token log-probabilities (B, T + 1, vocab) of the model on B compressed caches, teacher-forced.

    keep: (B, layers, kv_heads, k) indices of the context entries each cache keeps. The question and the
    continuation are fed on top, at positions continuing from the uncompressed context's length (the
    query-agnostic protocol); the distributions are read at the question's last token and at each
    continuation token, where the stored p_full were read.
    """
    keys, values = prompt["keys"], prompt["values"]  # (layers, kv_heads, L, head_dim)
    batch, _, _, kept = keep.shape
    length, head_dim = keys.shape[2], keys.shape[3]
    cache = DynamicCache()
    for layer in range(keys.shape[0]):
        index = keep[:, layer, :, :, None].expand(-1, -1, -1, head_dim)
        for_layer = [
            tensor[layer].unsqueeze(0).expand(batch, -1, -1, -1).gather(2, index).to(model.dtype)
            for tensor in (keys, values)
        ]
        cache.update(*for_layer, layer)
    fed = torch.cat([prompt["question_ids"], prompt["continuation_ids"]]).to(model.device)
    n = fed.shape[0]
    logits = model(
        input_ids=fed.expand(batch, -1),
        past_key_values=cache,
        attention_mask=torch.ones(batch, kept + n, dtype=torch.long, device=model.device),
        position_ids=torch.arange(length, length + n, device=model.device).expand(batch, -1),
        logits_to_keep=prompt["log_probs"].shape[0],
    ).logits
    return logits.float().log_softmax(-1)


def kl_rewards(full_log_probs: torch.Tensor, evict_log_probs: torch.Tensor) -> torch.Tensor:
    """r_t = -KL(p_full,t || p_evict,t) for each cache and step: (T, V) and (B, T, V) -> (B, T)."""
    full = full_log_probs.float()
    return -(full.exp() * (full - evict_log_probs)).sum(-1)


def top_keep(scores: torch.Tensor, ratio: float) -> torch.Tensor:
    """Deterministic keep-set of scores (..., L): the top int(L (1 - ratio)), as the press keeps."""
    return scores.topk(keep_count(scores.shape[-1], ratio), dim=-1).indices


def reference_scores(features: torch.Tensor, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Scores (layers, kv_heads, L) of the reference presses from the stored features.

    knorm: -||k|| (kvpress's KnormPress); snapkv: the window's mean attention pooled with kernel 5 and the
    window itself kept (kvpress's SnapKVPress with window 32); random: uniform scores.
    """
    knorm = -features[..., 3]
    attention = features[..., 0].exp()
    pooled = F.avg_pool1d(attention.flatten(0, 1)[:, None], 5, stride=1, padding=2)[:, 0]
    snapkv = pooled.reshape(attention.shape).clone()
    snapkv[..., -WINDOW:] = snapkv.max() + 1
    random = torch.rand(features.shape[:-1], generator=generator)
    return {"knorm": knorm, "snapkv": snapkv, "random": random}


@torch.no_grad()
def validate(model, data: DistillData, scorers: dict, ratios: list[float]) -> dict[str, dict[str, float]]:
    """Mean KL per continuation step over the validation prompts, per scorer and ratio.

    scorers: name -> function(features, prompt index) -> scores (layers, kv_heads, L).
    """
    totals = {name: {str(r): 0.0 for r in ratios} for name in scorers}
    for index, shard in enumerate(data.val):
        prompt = data.load(shard)
        all_scores = {name: scorer(prompt["features"], index) for name, scorer in scorers.items()}
        for ratio in ratios:
            keep = torch.stack([top_keep(scores, ratio) for scores in all_scores.values()])
            kl = -kl_rewards(prompt["log_probs"], compressed_log_probs(model, prompt, keep)).mean(-1)
            for name, value in zip(all_scores, kl.tolist(), strict=True):
                totals[name][str(ratio)] += value / len(data.val)
    return totals


@torch.no_grad()
def validate_decoding(model, data: DistillData, scorers: dict, ratios: list[float], interval: int) -> dict:
    """validate under the decode-time protocol (per_step.decode_rollout, deterministic): mean KL per
    continuation step over the validation prompts, per scorer and ratio.

    scorers: name -> function(features, layer) -> scores, features (batch, kv_heads, n, 7) of one layer.
    """
    totals = {name: {str(r): 0.0 for r in ratios} for name in scorers}
    for shard in data.val:
        prompt = data.load(shard)
        for ratio in ratios:
            for name, scorer in scorers.items():
                log_probs, _ = decode_rollout(model, scorer, prompt, ratio, interval, 1)
                kl = -kl_rewards(prompt["log_probs"], log_probs).mean().item()
                totals[name][str(ratio)] += kl / len(data.val)
    return totals


def decoding_references(seed: int) -> dict:
    """The reference scorers of validate_decoding, from the features a decision sees."""
    generator = torch.Generator().manual_seed(seed)
    return {name: (lambda f, layer, name=name: reference_scores(f, generator)[name]) for name in REFERENCES}


def mean_kl(table: dict[str, float]) -> float:
    return sum(table.values()) / len(table)


def train_step(model, policy, optimizer, prompt: dict, ratios: list[float], config, generator) -> dict:
    """One REINFORCE step on one prompt; returns the loss and the mean reward per ratio."""
    scores = policy(prompt["features"])  # (layers, kv_heads, L)
    length = scores.shape[-1]
    loss = -config.entropy_bonus * first_pick_entropy(scores).mean() / math.log(length)
    rewards_by_ratio = {}
    for ratio in ratios:
        kept = keep_count(length, ratio)
        rankings = sample_rankings(scores.detach(), config.samples, generator)  # (layers, heads, K, L)
        keep = rankings[..., :kept].permute(2, 0, 1, 3)
        rewards = kl_rewards(prompt["log_probs"], compressed_log_probs(model, prompt, keep)).sum(-1)
        others = (rewards.sum() - rewards) / (len(rewards) - 1)  # leave-one-out baseline
        advantage = (rewards - others) / (rewards.std() + 1e-6)
        log_prob = keep_order_log_prob(scores, rankings, kept).sum((0, 1)) / (scores[..., 0].numel() * kept)
        loss = loss - (advantage * log_prob).mean() / len(ratios)
        rewards_by_ratio[ratio] = rewards.mean().item()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return {"loss": loss.item(), "rewards": rewards_by_ratio}


def per_step_train_step(
    model, policy, optimizer, prompt: dict, ratios: list[float], config, generator
) -> dict:
    """One REINFORCE step with per-decision credit (per_step.py) on one prompt; the loss and mean return
    per ratio."""
    scores = policy(prompt["features"])
    loss = -config.entropy_bonus * first_pick_entropy(scores).mean() / math.log(scores.shape[-1])
    rewards_by_ratio = {}
    for ratio in ratios:
        sampler = lambda features, layer: policy(features, layer).detach()  # noqa: E731
        log_probs, decisions = decode_rollout(
            model, sampler, prompt, ratio, config.interval, config.samples, generator
        )
        rewards = kl_rewards(prompt["log_probs"], log_probs)
        loss = loss + per_step_loss(
            rewards, [decision_log_prob(policy, d) for d in decisions], [d.first_step for d in decisions]
        ) / len(ratios)
        rewards_by_ratio[ratio] = rewards.sum(-1).mean().item()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return {"loss": loss.item(), "rewards": rewards_by_ratio}


def train(
    model, data_dir: Path | list[Path], out_dir: Path, config: TrainConfig, command: str = "", log=print
) -> dict:
    """Train on the data in `data_dir` (one folder or several) with `model` frozen; save the best EMA policy
    (by validation) to out_dir."""
    started = time.perf_counter()
    data = DistillData(data_dir)
    shape = model_shape(model)
    if not data.shape.fits(shape):
        raise TrainingFileError(
            f"DistillCache data at {data.where} was made for {data.shape.describe()}, "
            f"not for {shape.describe()}; "
            f"make data for this model with: {data.hint(shape.name, 'DIR')}"
        )
    model.requires_grad_(False).eval()
    torch.manual_seed(config.seed)
    generator = torch.Generator().manual_seed(config.seed)
    policy = DistillCachePolicy(config.hidden, config.arch, (shape.num_layers, shape.num_kv_heads))
    mean, std = feature_statistics(data)
    policy.feature_mean.copy_(mean)
    policy.feature_std.copy_(std)
    if config.init == "knorm":
        policy.start_as_knorm()
    ema = copy.deepcopy(policy).requires_grad_(False)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=config.lr, weight_decay=config.weight_decay)

    if config.credit == "per-step":
        step_function = per_step_train_step
        references = validate_decoding(
            model, data, decoding_references(config.seed), config.eval_ratios, config.interval
        )

        def validate_ema() -> dict[str, float]:
            scorer = {"policy": lambda f, layer: ema(f, layer)}
            return validate_decoding(model, data, scorer, config.eval_ratios, config.interval)["policy"]

    else:
        step_function = train_step
        reference_generator = torch.Generator().manual_seed(config.seed)
        fixed = [
            reference_scores(data.load(s, ["features"])["features"], reference_generator) for s in data.val
        ]
        references = validate(
            model,
            data,
            {name: (lambda f, i, name=name: fixed[i][name]) for name in REFERENCES},
            config.eval_ratios,
        )

        def validate_ema() -> dict[str, float]:
            return validate(model, data, {"policy": lambda f, i: ema(f)}, config.eval_ratios)["policy"]

    log("references " + " | ".join(f"{name} {mean_kl(kl):.4f}" for name, kl in references.items()))

    best = validate_ema()
    best_state, best_step = copy.deepcopy(ema.state_dict()), 0
    history = [{"step": 0, "kl": mean_kl(best), "seconds": round(time.perf_counter() - started, 1)}]
    log(f"step 0 policy kl {mean_kl(best):.4f} ({config.init} start)")
    step_seconds = []
    for step in range(1, config.steps + 1):
        tick = time.perf_counter()
        shard = data.train[torch.randint(len(data.train), (1,), generator=generator).item()]
        chosen = torch.randperm(len(config.ratios), generator=generator)[: config.ratios_per_step]
        result = step_function(
            model, policy, optimizer, data.load(shard), [config.ratios[i] for i in chosen], config, generator
        )
        with torch.no_grad():
            for average, current in zip(ema.parameters(), policy.parameters(), strict=True):
                average.lerp_(current, 1 - config.ema)
        step_seconds.append(time.perf_counter() - tick)
        if step % config.eval_every == 0 or step == config.steps:
            kl = validate_ema()
            seconds = round(time.perf_counter() - started, 1)
            history.append({"step": step, "kl": mean_kl(kl), "seconds": seconds})
            if mean_kl(kl) < mean_kl(best):
                best, best_state, best_step = kl, copy.deepcopy(ema.state_dict()), step
            rewards = " ".join(f"{r}:{v:.3f}" for r, v in result["rewards"].items())
            log(
                f"step {step} loss {result['loss']:.4f} train reward {rewards} | val kl {mean_kl(kl):.4f} "
                f"(best {mean_kl(best):.4f} at {best_step}) | {seconds:.0f}s"
            )
    policy.load_state_dict(best_state)
    card = {
        "model": asdict(data.shape),
        "training": {
            **asdict(config),
            "seconds": round(time.perf_counter() - started, 1),
            "seconds_per_step": round(sum(step_seconds) / len(step_seconds), 2),
            "best_step": best_step,
            "command": command,
        },
        "data": data.summary(),
        "validation": {
            "metric": "mean KL(p_full || p_evict) per continuation step, held-out prompts, lower is better"
            + (
                f"; decode-time, compressed every {config.interval} steps"
                if config.credit == "per-step"
                else ""
            ),
            "kl": {"distillcache": best, **references},
            "history": history,
        },
        "git_commit": git_commit(),
    }
    save_policy(Path(out_dir), policy, card)
    log(f"saved the policy to {out_dir}: validation kl {mean_kl(best):.4f} (step {best_step})")
    return card
