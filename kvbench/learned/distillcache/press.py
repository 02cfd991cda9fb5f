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

import functools
from dataclasses import dataclass, field
from pathlib import Path

import torch
from kvpress import ScorerPress
from torch import nn

from kvbench.bridge.adapter import language_model
from kvbench.learned.common import (
    check_made_for,
    load_weights,
    model_shape,
    read_card,
    state_folder,
    state_version,
)
from kvbench.learned.distillcache.checkpoint import (
    METHOD,
    WEIGHTS_FILE,
    load_policy,
    train_command_hint,
)
from kvbench.learned.distillcache.policy import DistillCachePolicy, token_features


@functools.lru_cache(maxsize=4)
def cached_policy(directory: Path, shape, modified_ns: int, device: torch.device):
    """The policy loaded once per (folder, model shape, version on disk, device); a sweep reuses it."""
    policy, card, digest = load_policy(directory, shape)
    return policy.to(device).eval().requires_grad_(False), card, digest


@dataclass
class DistillCachePress(ScorerPress):
    """Keep the entries the DistillCache policy scores highest, per layer and KV head.

    weights: folder holding policy.safetensors + card.json; default presses/distillcache/<model name>/.
    """

    compression_ratio: float = 0.0
    weights: str | None = None
    policy: DistillCachePolicy | None = field(default=None, init=False, repr=False, compare=False)
    rotary: nn.Module | None = field(default=None, init=False, repr=False, compare=False)
    num_layers: int = field(default=0, init=False, repr=False, compare=False)
    state_digest: str | None = field(default=None, init=False, repr=False, compare=False)  # of the weights

    def check_for_model(self, name: str) -> None:
        """Refuse (one line) a missing or corrupt card, one made for another model, or weights missing,
        corrupt or not finite, before the model loads; the KV-cache shape is checked once it has."""
        directory, hint = state_folder(self.weights, METHOD, name), train_command_hint(name)
        check_made_for(read_card(directory, METHOD, hint), name, directory, "DistillCache weights", hint)
        load_weights(directory / WEIGHTS_FILE, hint)

    def post_init_from_model(self, model: nn.Module) -> None:
        shape = model_shape(model)
        directory, modified = state_version(state_folder(self.weights, METHOD, shape.name))
        self.policy, _, self.state_digest = cached_policy(directory, shape, modified, model.device)
        self.rotary, self.num_layers = language_model(model).rotary_emb, shape.num_layers

    def score(self, module, hidden_states, keys, values, attentions, kwargs) -> torch.Tensor:
        if "position_ids" in kwargs and kwargs["position_ids"] is not None:
            last_position = int(kwargs["position_ids"][0, -1])
        else:  # an uncompressed prefill: positions are the cache indices
            last_position = keys.shape[2] - 1
        features = token_features(
            module, hidden_states, keys, values, self.rotary, last_position, self.num_layers
        )
        return self.policy(features, module.layer_idx)
