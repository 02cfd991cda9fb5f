"""DistillCache press: a learned policy scores every cache entry from attention, norm and position features.

The policy of a model lives in a folder (default presses/distillcache/<model name>/) made by
`kvbench distillcache train`. Prefill: kvpress's ScorerPress keeps the int(L * (1 - ratio)) best-scored
entries of every (layer, KV head). Decode-time: the engine wraps this press in kvpress's DecodingPress, which
calls `compress` on the whole cache every N steps; the window is then the buffered tokens' queries (up to
32), at their true positions (kwargs["position_ids"]), so the policy re-decides with what it would see at
prefill.

What the paper (arXiv 2608.08878; its text was not found, only its abstract's claims) fixes: a small policy
network over attention statistics, value norms, attention entropy and position, trained with REINFORCE on
per-step rewards r_t = -KL(p_full,t || p_evict,t). What we chose where it is silent (see
learned/distillcache/ and the card): the exact features (policy.py), an MLP 7 -> 32 -> 1 shared by every
head, Gumbel-top-k keep-sets with their Plackett-Luce log-probability, a leave-one-out baseline, a first-pick
entropy bonus, EMA weights, prefill-time scoring with no forced sinks or window (the policy sees relative
position and may learn them).
"""

from dataclasses import dataclass, field
from pathlib import Path

import torch
from kvpress import ScorerPress
from torch import nn

from kvbench.bridge import models
from kvbench.bridge.adapter import language_model
from kvbench.learned.common import ModelShape, StatePress, load_state, save_learned_state
from kvbench.learned.distillcache.config import METHOD
from kvbench.learned.distillcache.policy import FEATURES, WINDOW, DistillCachePolicy, token_features


@dataclass
class DistillCachePress(StatePress, ScorerPress):
    """Keep the entries the DistillCache policy scores highest, per layer and KV head.

    weights: folder holding policy.safetensors + card.json; default presses/distillcache/<model name>/.
    """

    compression_ratio: float = 0.0
    policy: DistillCachePolicy | None = field(default=None, init=False, repr=False, compare=False)
    rotary: nn.Module | None = field(default=None, init=False, repr=False, compare=False)
    num_layers: int = field(default=0, init=False, repr=False, compare=False)

    method, state_file, what = METHOD, "policy.safetensors", "DistillCache weights"

    @classmethod
    def build(cls, tensors: dict, card: dict, device) -> DistillCachePolicy:
        """The policy of the card's architecture (cards from before per-head: shared)."""
        arch = (card.get("policy") or {}).get("arch", "shared")
        if arch == "per-head":
            policy = DistillCachePolicy(tensors["w1"].shape[-1], arch, tuple(tensors["w1"].shape[:2]))
        else:
            policy = DistillCachePolicy(tensors["net.0.weight"].shape[0], arch)
        policy.load_state_dict(tensors)
        return policy.to(device).eval().requires_grad_(False)

    def install(self, policy: DistillCachePolicy, model: nn.Module) -> None:
        self.policy = policy
        self.rotary, self.num_layers = language_model(model).rotary_emb, models.model_shape(model)["layers"]

    def score(self, module, hidden_states, keys, values, attentions, kwargs) -> torch.Tensor:
        if "position_ids" in kwargs and kwargs["position_ids"] is not None:
            last_position = int(kwargs["position_ids"][0, -1])
        else:  # an uncompressed prefill: positions are the cache indices
            last_position = keys.shape[2] - 1
        features = token_features(
            module, hidden_states, keys, values, self.rotary, last_position, self.num_layers
        )
        return self.policy(features, module.layer_idx)


def save_policy(directory: Path, policy: DistillCachePolicy, card: dict) -> None:
    """`policy.safetensors` (MLP weights, feature standardisation) and `card.json` (the model's shape, the
    features, the training config and time, the data summary, the validation KL beside the reference
    presses, the command)."""
    policy_card = {"arch": policy.arch, "hidden": policy.hidden, "features": list(FEATURES), "window": WINDOW}
    card = {"method": METHOD, **card, "policy": policy_card}
    save_learned_state(directory, DistillCachePress.state_file, policy, card)


def load_policy(directory: Path, shape: ModelShape | None = None) -> tuple[DistillCachePolicy, dict, str]:
    """The policy, its card and the digest of its weights file; refused (one line) when missing, corrupt or
    made for another model than `shape`."""
    return load_state(DistillCachePress, directory, shape)
