"""DistillCache's policy: seven features per (layer, KV head, cache entry) and an MLP, shared by all heads
or one per head.

Features of entry j in layer l (the paper names the signals, not their exact form; these forms are ours):
  0 log mean attention paid to j by the observation window (the last W=32 queries; the query heads of the
    KV group averaged, as SnapKV does),
  1 log max of that attention over the window's queries,
  2 log window-attention entropy share: -mean_w a_wj log a_wj, token j's term of the window rows' entropy
    (high when many queries spread some attention onto j, low when one query locks onto it or none look),
  3 log ||k_j|| (post-RoPE key),
  4 log ||v_j||,
  5 relative position j / L,
  6 layer l / n_layers.
Each feature is standardised with its mean and std over the training data (stored with the weights); the MLP
is 7 -> hidden -> 1 with SiLU. Higher score means keep.

The window's queries are recomputed from the layer's input hidden states (q_proj + RoPE at their true
positions), as kvpress's SnapKVPress does: no eager attention, so the press runs under SDPA.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.llama.modeling_llama import rotate_half

from kvbench.learned.distillcache.config import ARCHS

FEATURES = (
    "log_window_attention_mean",
    "log_window_attention_max",
    "log_window_entropy_share",
    "log_key_norm",
    "log_value_norm",
    "relative_position",
    "layer_fraction",
)
WINDOW = 32
EPS = 1e-6


def window_queries(module, hidden_states: torch.Tensor, rotary, positions: torch.Tensor) -> torch.Tensor:
    """Post-RoPE queries (batch, heads, W, head_dim) of the last W hidden states at their true positions."""
    from kvpress.utils import get_prerope_query_states

    window = hidden_states[:, -positions.shape[-1] :]
    queries = get_prerope_query_states(module, window)
    cos, sin = rotary(window, positions)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return queries * cos + rotate_half(queries) * sin


def token_features(
    module,
    hidden_states: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    rotary,
    last_position: int,
    num_layers: int,
) -> torch.Tensor:
    """Raw features (batch, kv_heads, L, 7) of the L cache entries of `module`'s layer.

    hidden_states: the layer's input for the latest tokens, whose keys are the last entries of `keys`;
    last_position: the true position of the latest token (cache index and position differ once the cache has
    been compressed).
    """
    batch, num_kv_heads, length, head_dim = keys.shape
    window = min(WINDOW, hidden_states.shape[1], length)
    positions = torch.arange(last_position - window + 1, last_position + 1, device=keys.device)
    queries = window_queries(module, hidden_states, rotary, positions.expand(batch, -1))
    groups = queries.shape[1] // num_kv_heads
    queries = queries.reshape(batch, num_kv_heads, groups * window, head_dim)
    logits = (queries @ keys.transpose(-1, -2)).float() / math.sqrt(head_dim)
    logits = logits.reshape(batch, num_kv_heads, groups, window, length)
    # Query w of the window is entry length - window + w: it sees the entries up to itself.
    causal = torch.ones(window, length, dtype=torch.bool, device=keys.device).triu(length - window + 1)
    attention = logits.masked_fill(causal, float("-inf")).softmax(dim=-1).mean(dim=2)  # (b, h, W, L)
    entropy_share = -(attention * (attention + EPS).log()).mean(dim=2)
    j = torch.arange(length, dtype=torch.float32, device=keys.device)
    return torch.stack(
        [
            (attention.mean(dim=2) + EPS).log(),
            (attention.amax(dim=2) + EPS).log(),
            (entropy_share + EPS).log(),
            keys.float().norm(dim=-1).clamp_min(EPS).log(),
            values.float().norm(dim=-1).clamp_min(EPS).log(),
            (j / length).expand(batch, num_kv_heads, -1),
            torch.full((batch, num_kv_heads, length), module.layer_idx / num_layers, device=keys.device),
        ],
        dim=-1,
    )


KEY_NORM = FEATURES.index("log_key_norm")


class DistillCachePolicy(nn.Module):
    """features (..., 7) -> scores (...): standardise, then Linear(7, hidden), SiLU, Linear(hidden, 1).

    arch "shared" (the paper's "lightweight policy network"): one MLP for every head, which learns of the
    layer through feature 6 only. "per-head": one MLP per (layer, KV head), as KVP's agents are; heads =
    (num_layers, num_kv_heads). Both start with the output layer at zero: a uniform keep-set.
    """

    def __init__(self, hidden: int = 32, arch: str = "shared", heads: tuple[int, int] = (1, 1)):
        super().__init__()
        self.hidden, self.arch = hidden, arch
        if arch == "shared":
            self.net = nn.Sequential(nn.Linear(len(FEATURES), hidden), nn.SiLU(), nn.Linear(hidden, 1))
            nn.init.zeros_(self.net[2].weight)
            nn.init.zeros_(self.net[2].bias)
        elif arch == "per-head":
            bound = 1 / math.sqrt(len(FEATURES))  # nn.Linear's default init, head by head
            self.w1 = nn.Parameter(torch.empty(*heads, len(FEATURES), hidden).uniform_(-bound, bound))
            self.b1 = nn.Parameter(torch.empty(*heads, hidden).uniform_(-bound, bound))
            self.w2 = nn.Parameter(torch.zeros(*heads, hidden))
            self.b2 = nn.Parameter(torch.zeros(*heads))
        else:
            raise ValueError(f"unknown DistillCache arch {arch!r} (one of {', '.join(ARCHS)})")
        self.register_buffer("feature_mean", torch.zeros(len(FEATURES)))
        self.register_buffer("feature_std", torch.ones(len(FEATURES)))

    @torch.no_grad()
    def start_as_knorm(self, margin: float = 8.0) -> None:
        """Score silu(margin - standardised log key norm) with one hidden unit and nothing else: the order
        of kvpress's KnormPress (keep the smallest keys) wherever that z-score is under margin + 1.28 (SiLU
        rises from -1.28 on). A warm start: REINFORCE then moves from knorm instead of from uniform scores."""
        if self.arch == "shared":
            first, second = self.net[0], self.net[2]
            assert isinstance(first, nn.Linear) and isinstance(second, nn.Linear)  # for the type checker
            first.weight[0].zero_()
            first.weight[0, KEY_NORM], first.bias[0] = -1.0, margin
            second.weight.zero_()
            second.weight[0, 0] = 1.0
            second.bias.zero_()
            return
        self.w1[..., 0].zero_()
        self.w1[..., KEY_NORM, 0], self.b1[..., 0] = -1.0, margin
        self.w2.zero_()
        self.w2[..., 0] = 1.0
        self.b2.zero_()

    def forward(self, features: torch.Tensor, layer: int | None = None) -> torch.Tensor:
        """features (layers, kv_heads, L, 7), every layer at once; or (batch, kv_heads, L, 7) of `layer`."""
        x = (features - self.feature_mean) / self.feature_std
        if self.arch == "shared":
            return self.net(x).squeeze(-1)
        if layer is None:
            hidden = F.silu(torch.einsum("yklf,ykfh->yklh", x, self.w1) + self.b1.unsqueeze(2))
            return torch.einsum("yklh,ykh->ykl", hidden, self.w2) + self.b2.unsqueeze(-1)
        hidden = F.silu(torch.einsum("bklf,kfh->bklh", x, self.w1[layer]) + self.b1[layer].unsqueeze(1))
        return torch.einsum("bklh,kh->bkl", hidden, self.w2[layer]) + self.b2[layer].unsqueeze(-1)


def keep_count(length: int, ratio: float) -> int:
    """Entries kept at compression ratio `ratio`: kvpress's ScorerPress keeps int(L * (1 - ratio))."""
    return int(length * (1 - ratio))


def keep_order_log_prob(scores: torch.Tensor, rankings: torch.Tensor, keep: int) -> torch.Tensor:
    """Plackett-Luce log-probability of drawing the first `keep` entries of each ranking in that order.

    Rankings come from learned.common.ranking.sample_rankings (Gumbel-perturbed argsort: the top `keep` of a
    ranking is a Gumbel-top-k keep-set); the rest of the ranking holds the entries still unpicked at each
    draw, which the denominators need.

    scores (..., L), rankings (..., K, L) -> (..., K). log P = sum_{r < keep} (s[sigma_r] - logsumexp of the
    scores of sigma_r..sigma_{L-1}); every denominator at once with one reverse logcumsumexp: O(L).
    """
    ranked = scores.unsqueeze(-2).expand(rankings.shape).gather(-1, rankings)
    tails = ranked.flip(-1).logcumsumexp(-1).flip(-1)
    return (ranked - tails)[..., :keep].sum(-1)


def first_pick_entropy(scores: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(scores) over the last dim: the entropy bonus's stand-in for the keep-set's.

    The entropy of a Plackett-Luce keep-set has no closed form; that of its first draw does, and it falls
    as the policy sharpens, which is what the bonus needs to slow.
    """
    log_p = scores.log_softmax(dim=-1)
    return -(log_p.exp() * log_p).sum(-1)
