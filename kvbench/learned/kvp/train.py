"""Train KVP agents from stored data (never loads the LLM); every selected head at once, batched over heads.

Per step: a few training prompts, and of each a random subset of its tokens (an agent scores every token
alone, so ranking random subsets teaches the same pairwise order as ranking whole prompts, at a fraction of
the cost; positions keep their place in the whole prompt). Prompts may differ in length (a mixture): a step
draws min(tokens, its shortest prompt's length) tokens of each of its prompts, so they stack, and each
token's position features come from its own prompt's length. Each head scores those tokens, K rankings are
drawn from the Plackett-Luce distribution of the scores, each ranking's reward is -(normalised cost), and
REINFORCE with a leave-one-out baseline (RLOO) pushes up the log-probability of the better-than-average
rankings. AdamW with linear warm-up then cosine decay; an exponential moving average (EMA) of the weights
is what gets validated (deterministic ranking of whole prompts) and saved, and each head keeps its own best
EMA weights by validation reward (heads are independent, so the per-head best is simply each one's best).

The authors' recipe (config.AUTHORS, `kvbench kvp train --recipe authors`) runs the same loop with their
settings: one ranking per prompt, the baseline over the step's batch of prompts, advantages z-scored and
clipped, rewards clamped, the loss a mean over decisions, each head's gradient norm clipped, the EMA after a
burn-in, raw inputs and a 6000-row position table for the apple agent.
"""

import copy
import math
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

from kvbench.core.errors import BadInput
from kvbench.core.provenance import git_commit
from kvbench.learned.common import TrainingData, TrainingFileError
from kvbench.learned.common.ranking import plackett_luce_log_prob, sample_rankings
from kvbench.learned.kvp.agent import StackedAgents, build_agents
from kvbench.learned.kvp.checkpoint import ModelShape, card_utility, save_agents
from kvbench.learned.kvp.config import (  # noqa: F401 (this module's API)
    RECIPE_CONFIGS,
    UTILITIES,
    UTILITY_TENSORS,
    TrainConfig,
)
from kvbench.learned.kvp.reward import (
    normalised_cost,
    random_normalised_cost,
    ranking_by_score,
)

REFERENCES = ("oracle", "random", "knorm", "recency")


class KVPData(TrainingData):
    """KVP's view of one or more data stores (kvbench.learned.common.TrainingData): shared stores
    (kvbench.learned.common.datagen) or ones made by KVP's own datagen before them (keys, values and utility
    only). `utility` names the target (UTILITIES); a store without the reconstruction score is refused.
    """

    method, label = "kvp", "KVP"

    def __init__(self, directories: Path | list[Path], utility: str = "future"):
        super().__init__(directories)
        if utility not in UTILITIES:
            raise BadInput(f"unknown KVP utility {utility!r} (choose one of: {', '.join(UTILITIES)})")
        self.utility = utility
        if utility != "future":
            lacking = [
                str(directory)
                for directory, manifest in zip(self.directories, self.manifests, strict=True)
                if not manifest["config"].get("reconstruction")
            ]
            if lacking:
                raise TrainingFileError(
                    f"{lacking[0]} holds no reconstruction scores, which --utility {utility} trains on; "
                    f"make data with: {self.hint(out='DIR')} --reconstruction"
                )

    def load(self, shard: dict, heads: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """keys, values (fp16, (heads, P, head_dim)) and utility (fp32, (heads, P)) of one prompt."""
        names = ("keys", "values", *UTILITY_TENSORS[self.utility])
        tensors = self.read_tensors(shard, names)
        keys, values, *targets = (tensors[name].flatten(0, 1)[heads] for name in names)
        if len(targets) == 1:
            return keys, values, targets[0]
        scaled = [
            target / target.sum(-1, keepdim=True).clamp_min(torch.finfo(target.dtype).tiny)
            for target in targets
        ]
        return keys, values, sum(scaled) / len(scaled)


def select_heads(shape: ModelShape, layers: list[int] | None, kv_heads: list[int] | None) -> list[int]:
    """Flat head indices (layer * num_kv_heads + kv_head) of the chosen layers and KV heads (default: all)."""
    layers = list(range(shape.num_layers)) if layers is None else layers
    kv_heads = list(range(shape.num_kv_heads)) if kv_heads is None else kv_heads
    for name, chosen, limit in (
        ("layer", layers, shape.num_layers),
        ("KV head", kv_heads, shape.num_kv_heads),
    ):
        bad = [i for i in chosen if not 0 <= i < limit]
        if bad:
            raise BadInput(f"{name} {bad[0]} out of range: {shape.name} has {limit}")
    return [layer * shape.num_kv_heads + head for layer in layers for head in kv_heads]


def feature_statistics(data: KVPData, heads: list[int]) -> list[torch.Tensor]:
    """Per-head mean and std of key and value features over all training tokens (every prompt weighs by
    its length): 4 x (heads, head_dim)."""
    sums = torch.zeros(2, len(heads), data.shape.head_dim, dtype=torch.float64)
    squares = torch.zeros_like(sums)
    count = 0
    for shard in data.train:
        keys, values, _ = data.load(shard, heads)
        features = torch.stack([keys, values]).double()
        sums += features.sum(dim=2)
        squares += features.square().sum(dim=2)
        count += keys.shape[1]
    mean = sums / count
    std = (squares / count - mean.square()).clamp_min(1e-8).sqrt()
    return [mean[0].float(), std[0].float(), mean[1].float(), std[1].float()]


def token_batch(
    data: KVPData, heads: list[int], tokens: int | None, prompts: int, generator: torch.Generator
):
    """Random tokens of `prompts` random training prompts, stacked over prompts: of each prompt the same
    number, min(tokens, the shortest chosen prompt's length) (tokens None: the shortest's length).

    keys, values: (prompts, heads, T, head_dim); positions (prompts, T): the tokens' places in their
    prompts; lengths (prompts,): the prompts' lengths; utility: (prompts, heads, T).
    """
    chosen_prompts = [
        data.load(data.train[index], heads)
        for index in torch.randint(len(data.train), (prompts,), generator=generator).tolist()
    ]
    count = min(tokens or math.inf, *(keys.shape[1] for keys, _, _ in chosen_prompts))
    batch = {"keys": [], "values": [], "positions": [], "utility": []}
    for keys, values, utility in chosen_prompts:
        chosen = torch.randperm(keys.shape[1], generator=generator)[:count]
        batch["keys"].append(keys[:, chosen])
        batch["values"].append(values[:, chosen])
        batch["positions"].append(chosen)
        batch["utility"].append(utility[:, chosen])
    lengths = torch.tensor([keys.shape[1] for keys, _, _ in chosen_prompts])
    keys, values, positions, utility = (
        torch.stack(batch[name]) for name in ("keys", "values", "positions", "utility")
    )
    return keys, values, positions, lengths, utility


def reference_rewards(val: list[tuple]) -> dict[str, torch.Tensor]:
    """Per-head mean validation reward of the rankings oracle (-1), random (expected), knorm and recency."""
    rewards = {name: [] for name in REFERENCES}
    for keys, _, utility in val:
        positions = torch.arange(utility.shape[-1], dtype=torch.float32).expand_as(utility)
        rewards["oracle"].append(-torch.ones(utility.shape[0]))
        rewards["random"].append(-random_normalised_cost(utility))
        # kvpress's knorm keeps the keys of lowest norm; recency keeps the latest tokens.
        knorm = ranking_by_score(-keys.float().norm(dim=-1))
        rewards["knorm"].append(-normalised_cost(utility, knorm).squeeze(-1))
        rewards["recency"].append(-normalised_cost(utility, ranking_by_score(positions)).squeeze(-1))
    return {name: torch.stack(values).mean(0) for name, values in rewards.items()}


@torch.no_grad()
def validation_reward(agents: StackedAgents, val: list[tuple]) -> torch.Tensor:
    """Per-head mean reward of the deterministic ranking (sort by score) over the validation prompts."""
    rewards = []
    for keys, values, utility in val:
        scores = agents(keys[None], values[None])[0]
        rewards.append(-normalised_cost(utility, ranking_by_score(scores)).squeeze(-1))
    return torch.stack(rewards).mean(0)


def validation_cost_on(
    agents: StackedAgents, card: dict, data_dirs: Path | list[Path], utility: str | None = None
) -> tuple[dict, int]:
    """Mean normalised cost (1 = oracle) over the heads, of the agents and the reference rankings, on the
    validation prompts of other data stores (e.g. another mixture's), against `utility` (default: the one
    the agents were trained on); and how many prompts that was."""
    data = KVPData(data_dirs, utility or card_utility(card))
    made_for = ModelShape(**card["model"])
    if not made_for.fits(data.shape):
        raise TrainingFileError(
            f"the agents were made for {made_for.describe()}, the data for {data.shape.describe()}"
        )
    val = [data.load(shard, card["heads"]) for shard in data.val]
    rewards = {"agents": validation_reward(agents, val), **reference_rewards(val)}
    return {name: -reward.mean().item() for name, reward in rewards.items()}, len(val)


def ranking_rewards(utility: torch.Tensor, rankings: torch.Tensor, config: TrainConfig) -> torch.Tensor:
    """Each ranking's training reward: -(normalised cost) under the config's budget weights, clamped at its
    floor if it has one. utility (..., P), rankings (..., K, P) -> (..., K)."""
    reward = -normalised_cost(utility, rankings, config.budget_weights)
    return reward if config.reward_floor is None else reward.clamp_min(config.reward_floor)


def advantages(reward: torch.Tensor, config: TrainConfig) -> torch.Tensor:
    """Each ranking's advantage from rewards (prompts, heads, K): its reward less the leave-one-out mean of
    the others (the prompt's other K - 1 rankings, or with baseline "batch" every other ranking of the step
    in that head), then z-scored over the same set and clipped, where the config says so."""
    over = (0, 2) if config.baseline == "batch" else (2,)
    count = math.prod(reward.shape[dim] for dim in over)
    baseline = (reward.sum(over, keepdim=True) - reward) / (count - 1)
    advantage = reward - baseline
    if config.normalise_advantages:
        mean, std = advantage.mean(over, keepdim=True), advantage.std(over, keepdim=True)
        advantage = (advantage - mean) / (std + 1e-8)
    if config.advantage_clip is not None:
        advantage = advantage.clamp(-config.advantage_clip, config.advantage_clip)
    return advantage


def clip_grad_norm_per_head(agents: StackedAgents, max_norm: float) -> torch.Tensor:
    """Scale each head's gradient (every parameter is stacked over heads on its first dimension) so that
    its norm is at most `max_norm`, as torch's clip_grad_norm_ does for one agent; the norms before."""
    grads = [weight.grad for weight in agents.parameters() if weight.grad is not None]
    norms = torch.stack([grad.flatten(1).square().sum(1) for grad in grads]).sum(0).sqrt()
    scale = (max_norm / (norms + 1e-6)).clamp(max=1)
    for grad in grads:
        grad.mul_(scale.view(-1, *[1] * (grad.dim() - 1)))
    return norms


@torch.no_grad()
def update_ema(ema: StackedAgents, agents: StackedAgents, step: int, config: TrainConfig) -> None:
    """After optimiser step `step`: the EMA copies the weights during the burn-in, then averages them."""
    for ema_weight, weight in zip(ema.parameters(), agents.parameters(), strict=True):
        if step < config.ema_burnin:
            ema_weight.copy_(weight)
        else:
            ema_weight.lerp_(weight, 1 - config.ema)


def learning_rate(step: int, config: TrainConfig) -> float:
    if step < config.warmup:
        return config.lr * (step + 1) / config.warmup
    progress = (step - config.warmup) / max(1, config.steps - config.warmup)
    cosine = 0.5 * (1 + math.cos(math.pi * progress))
    return config.lr * (config.min_lr_fraction + (1 - config.min_lr_fraction) * cosine)


def train(
    data_dir: Path | list[Path],
    out_dir: Path,
    config: TrainConfig,
    layers: list[int] | None = None,
    kv_heads: list[int] | None = None,
    log=print,
) -> dict:
    """Train the agents of the selected heads, save the best ones to out_dir and return their card."""
    if config.problem():
        raise BadInput(config.problem())
    started = time.perf_counter()
    torch.manual_seed(config.seed)
    generator = torch.Generator().manual_seed(config.seed)
    data = KVPData(data_dir, config.utility)
    heads = select_heads(data.shape, layers, kv_heads)
    longest = max(shard["prompt_tokens"] for shard in data.train)
    options = {"positions": config.position_rows or longest} if config.arch == "apple" else {}
    agents = build_agents(config.arch, len(heads), data.shape.head_dim, config.hidden, **options)
    config = replace(config, hidden=agents.hidden)  # the card records the width it got
    if config.standardise:  # else the statistics stay mean 0, std 1: raw keys and values
        agents.set_normalisation(*feature_statistics(data, heads))
    ema = copy.deepcopy(agents).requires_grad_(False)
    best = copy.deepcopy(ema)
    val = [data.load(shard, heads) for shard in data.val]
    references = reference_rewards(val)
    best_reward = validation_reward(best, val)
    log(
        f"{len(heads)} {config.arch} agents (hidden {agents.hidden}), "
        f"{len(data.train)} train / {len(data.val)} val prompts"
    )
    log("validation reward (mean over heads; -1 = oracle): " + format_rewards(references))
    optimizer = torch.optim.AdamW(agents.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    train_rewards = []

    for step in range(config.steps):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, config)
        keys, values, positions, lengths, utility = token_batch(
            data, heads, config.tokens, config.prompts, generator
        )
        scores = agents(keys, values, positions=positions, lengths=lengths)  # (prompts, heads, T)
        rankings = sample_rankings(scores.detach(), config.rankings, generator)  # (prompts, heads, K, T)
        reward = ranking_rewards(utility, rankings, config)  # (prompts, heads, K)
        log_prob = plackett_luce_log_prob(scores, rankings)
        if config.loss_per_step:  # the mean over the ranking's decisions, not their sum
            log_prob = log_prob / rankings.shape[-1]
        # Heads have their own weights: summing over heads keeps each head's gradient its own.
        loss = -(advantages(reward, config) * log_prob).mean(dim=(0, 2)).sum()

        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if config.grad_clip is not None:
            clip_grad_norm_per_head(agents, config.grad_clip)
        optimizer.step()
        update_ema(ema, agents, step, config)
        train_rewards.append(reward.mean().item())

        if (step + 1) % config.eval_every == 0 or step + 1 == config.steps:
            reward_now = validation_reward(ema, val)
            improved = reward_now > best_reward
            best_reward = torch.where(improved, reward_now, best_reward)
            with torch.no_grad():
                for best_weight, ema_weight in zip(best.parameters(), ema.parameters(), strict=True):
                    best_weight[improved] = ema_weight[improved]
            log(
                f"step {step + 1:5d} | lr {learning_rate(step, config):.2e} "
                f"| train {sum(train_rewards) / len(train_rewards):.4f} "
                f"| val {reward_now.mean():.4f} | best {best_reward.mean():.4f} "
                f"| {time.perf_counter() - started:.0f}s"
            )
            train_rewards = []

    card = {
        "model": asdict(data.shape),
        "heads": heads,
        "training": {**asdict(config), "seconds": round(time.perf_counter() - started, 1)},
        "data": data.summary(),
        "validation": {"agent": best_reward.tolist(), **{k: v.tolist() for k, v in references.items()}},
        "git_commit": git_commit(),
    }
    save_agents(Path(out_dir), best, card)
    log(f"saved {len(heads)} agents to {out_dir}: validation reward {best_reward.mean():.4f}")
    return card


def format_rewards(rewards: dict[str, torch.Tensor]) -> str:
    return " | ".join(f"{name} {values.mean():.4f}" for name, values in rewards.items())
