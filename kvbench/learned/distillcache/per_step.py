"""DistillCache with per-step credit: eviction decisions taken while the answer is decoded, each credited
with the reward that follows it (issue 28: the paper's point, which the sequence-level trainer leaves out).

A rollout replays one stored training prompt under the decode-time protocol, teacher-forced: the policy
compresses the context to k = int(L (1 - ratio)) entries per (layer, KV head), the question and the stored
continuation are fed on top, and the cache is compressed back to k entries every `interval` forwards, as
kvpress's DecodingPress does in the engine (the question's forward is its first step; the window is the
buffered tokens' queries, the last 32 at most; kept entries stay in cache order, as the engine keeps them).
Between two compressions no entry leaves, so each stretch of `interval` tokens is fed as one forward: the
same distributions as token by token. The decision d taken after fed token e can only change the
distributions read from token e on, so its credit is its reward-to-go G_d = sum_{t >= t_d} r_t, with
r_t = -KL(p_full,t || p_evict,t); the prefill decision's G is the sequence-level trainer's R.

Choices where the paper is silent (ours): K rollouts per ratio, sampled independently (a decision's
baseline is the leave-one-out mean of the other rollouts' G_d at the same step, not a tree of rollouts from a
shared history); every decision's advantage divided by the std of the whole return G_0 over the K rollouts
(so that late decisions, whose G_d vary less, weigh less, instead of each being blown up to unit scale);
the policy loss averaged over decisions (the learning rate means the same at any answer length); a
decision's log-probability is the Plackett-Luce probability of its keep order, per pick, as in train.py.
"""

import contextlib
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from kvbench.bridge.adapter import language_model
from kvbench.learned.common.ranking import sample_rankings
from kvbench.learned.distillcache.policy import keep_count, keep_order_log_prob, token_features


@dataclass
class Decision:
    """One eviction decision of a rollout: per layer, the features the policy scored (batch, kv_heads, n, 7)
    and the rankings drawn (batch, kv_heads, 1, n); `first_step` is the first reward step it can change."""

    features: list[torch.Tensor]
    rankings: list[torch.Tensor]
    kept: int
    first_step: int


def chunk_ends(question: int, continuation: int, interval: int) -> list[int]:
    """Ends (exclusive, in fed tokens) of the forwards between compressions: the question's forward is
    DecodingPress's first step, each continuation token one more; a compression follows every end but the
    last (nothing is read after it)."""
    total = question + continuation
    ends = list(range(question + interval - 1, total, interval))
    return [*ends, total] if not ends or ends[-1] != total else ends


@contextlib.contextmanager
def attention_inputs(model):
    """Collect each layer's attention input (the hidden states a press is given) during the block."""
    layers = language_model(model).layers
    captured: dict[int, torch.Tensor] = {}

    def hook(index):
        def keep_input(module, args, kwargs):
            captured[index] = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]

        return keep_input

    handles = [
        layer.self_attn.register_forward_pre_hook(hook(index), with_kwargs=True)
        for index, layer in enumerate(layers)
    ]
    try:
        yield captured
    finally:
        for handle in handles:
            handle.remove()


def draw(scorer, features: list[torch.Tensor], generator: torch.Generator | None) -> list[torch.Tensor]:
    """Rankings (batch, kv_heads, 1, n) per layer: one Plackett-Luce draw per row, or the scores' order
    when `generator` is None (deterministic, as the press keeps)."""
    rankings = []
    for layer, layer_features in enumerate(features):
        scores = scorer(layer_features, layer)
        if generator is None:
            rankings.append(scores.argsort(dim=-1, descending=True).unsqueeze(-2))
        else:
            rankings.append(sample_rankings(scores, 1, generator))
    return rankings


@torch.no_grad()
def decode_rollout(
    model, scorer, prompt: dict, ratio: float, interval: int, batch: int, generator=None
) -> tuple[torch.Tensor, list[Decision]]:
    """`batch` rollouts of `prompt` under decode-time compression, scored by `scorer(features, layer)`.

    Returns the next-token log-probabilities (batch, T + 1, vocab), read where the stored p_full were (the
    question's last token and each continuation token), and the decisions taken.
    """
    lm = language_model(model)
    keys, values = prompt["keys"], prompt["values"]  # (layers, kv_heads, L, head_dim)
    num_layers, _, length, head_dim = keys.shape
    kept = keep_count(length, ratio)
    features = [
        prompt["features"][layer].unsqueeze(0).expand(batch, -1, -1, -1) for layer in range(num_layers)
    ]
    decisions = [Decision(features, draw(scorer, features, generator), kept, 0)]
    cache = DynamicCache()
    for layer, ranking in enumerate(decisions[0].rankings):
        # The prefill keeps its entries in the order of their scores, as kvpress's ScorerPress gathers them.
        index = ranking[..., 0, :kept, None].expand(-1, -1, -1, head_dim)
        kept_kv = [t[layer].unsqueeze(0).expand(batch, -1, -1, -1).gather(2, index) for t in (keys, values)]
        cache.update(*(t.to(model.dtype) for t in kept_kv), layer)
    fed = torch.cat([prompt["question_ids"], prompt["continuation_ids"]]).to(model.device)
    question = prompt["question_ids"].shape[0]
    steps = prompt["log_probs"].shape[0]
    assert steps == fed.shape[0] - question + 1, (
        "a store's log_probs cover the question's last token and each answer token"
    )
    log_probs, start = [], 0
    ends = chunk_ends(question, fed.shape[0] - question, interval)
    for end in ends:
        with attention_inputs(model) as hidden:
            logits = model(
                input_ids=fed[start:end].expand(batch, -1),
                past_key_values=cache,
                attention_mask=torch.ones(
                    batch, cache.get_seq_length() + end - start, dtype=torch.long, device=model.device
                ),
                position_ids=torch.arange(length + start, length + end, device=model.device).expand(
                    batch, -1
                ),
                logits_to_keep=end - max(start, question - 1),
            ).logits
        log_probs.append(logits.float().log_softmax(-1))
        if end < fed.shape[0]:
            decisions.append(
                compress(lm, cache, hidden, scorer, kept, length + end - 1, generator, end - question + 1)
            )
        start = end
    return torch.cat(log_probs, dim=1), decisions


def compress(lm, cache, hidden, scorer, kept, last_position, generator, first_step) -> Decision:
    """Score every cache entry from the last forward's queries and keep the top (or drawn) `kept` of each
    head, in cache order; the cache is changed in place."""
    features = [
        token_features(
            layer.self_attn,
            hidden[index],
            cache.layers[index].keys,
            cache.layers[index].values,
            lm.rotary_emb,
            last_position,
            len(lm.layers),
        )
        for index, layer in enumerate(lm.layers)
    ]
    rankings = draw(scorer, features, generator)
    for index, ranking in enumerate(rankings):
        chosen = ranking[..., 0, :kept].sort(dim=-1).values
        gather = chosen[..., None].expand(-1, -1, -1, cache.layers[index].keys.shape[-1])
        cache.layers[index].keys = cache.layers[index].keys.gather(2, gather)
        cache.layers[index].values = cache.layers[index].values.gather(2, gather)
    return Decision(features, rankings, kept, first_step)


def decision_log_prob(policy, decision: Decision) -> torch.Tensor:
    """Plackett-Luce log-probability of each rollout's keep order at `decision`, per pick: (batch,)."""
    per_layer = [
        keep_order_log_prob(policy(features, layer), ranking, decision.kept)[..., 0].sum(-1)
        for layer, (features, ranking) in enumerate(zip(decision.features, decision.rankings, strict=True))
    ]
    heads = len(decision.features) * decision.features[0].shape[1]
    return torch.stack(per_layer).sum(0) / (heads * decision.kept)


def per_step_loss(
    rewards: torch.Tensor, log_probs: list[torch.Tensor], first_steps: list[int]
) -> torch.Tensor:
    """REINFORCE loss with per-decision credit: rewards (K, T + 1), log_probs[d] (K,) with grad.

    Decision d's advantage: its reward-to-go minus the other rollouts' mean at the same step, over the std of
    the whole return (module docstring)."""
    returns = rewards.flip(-1).cumsum(-1).flip(-1)  # returns[:, t] = sum of r from step t on
    scale = returns[:, 0].std() + 1e-6
    losses = []
    for log_prob, first in zip(log_probs, first_steps, strict=True):
        to_go = returns[:, first]
        others = (to_go.sum() - to_go) / (len(to_go) - 1)
        losses.append(-((to_go - others) / scale * log_prob).mean())
    return torch.stack(losses).mean()
