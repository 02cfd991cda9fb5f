"""Gate press: hard eviction by the learned sigmoid gates, the inference side of the soft-trained gates.

Every (layer, KV head) keeps the entries of highest gate g_j = sigmoid(w . [k_j; v_j] + b) (ranked by the
gate's logit, the same order) to the budget: kvpress's ScorerPress keeps int(L x (1 - ratio)) entries of
every head and the cache shrinks, so a ratio, a memory or an absolute budget means what it means for every
other evictor (the engine and the live-cache protocol set the ratio or target size). The gates of a model
live in a folder (default presses/gate/<model name>/) made by `kvbench gate train`.
"""

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import torch
from kvpress import ScorerPress
from torch import nn

from kvbench.learned.common import (
    check_made_for,
    load_weights,
    model_shape,
    read_card,
    state_folder,
    state_version,
)
from kvbench.learned.gate.checkpoint import METHOD, WEIGHTS_FILE, load_gates, train_command_hint
from kvbench.learned.gate.gates import GateSet


@functools.lru_cache(maxsize=4)
def cached_gates(directory: Path, shape, modified_ns: int, device: torch.device):
    """The gates loaded once per (folder, model shape, version on disk, device)."""
    gates, card, digest = load_gates(directory, shape)
    return gates.to(device).eval().requires_grad_(False), card, digest


@dataclass
class GatePress(ScorerPress):
    """Keep the entries of highest learned gate, per layer and KV head.

    weights: folder holding gates.safetensors + card.json; default presses/gate/<model name>/.
    """

    ratio_free_scores: ClassVar[bool] = True  # the gates do not depend on the ratio
    compression_ratio: float = 0.0
    weights: str | None = None
    gates: GateSet | None = field(default=None, init=False, repr=False, compare=False)
    state_digest: str | None = field(default=None, init=False, repr=False, compare=False)

    def check_for_model(self, name: str) -> None:
        """Refuse (one line) a missing or corrupt card, one made for another model, or weights missing,
        corrupt or not finite, before the model loads; the KV-cache shape is checked once it has."""
        directory, hint = state_folder(self.weights, METHOD, name), train_command_hint(name)
        check_made_for(read_card(directory, METHOD, hint), name, directory, "gate weights", hint)
        load_weights(directory / WEIGHTS_FILE, hint)

    def post_init_from_model(self, model: nn.Module) -> None:
        shape = model_shape(model)
        directory, modified = state_version(state_folder(self.weights, METHOD, shape.name))
        self.gates, _, self.state_digest = cached_gates(directory, shape, modified, model.device)

    def score(self, module, hidden_states, keys, values, attentions, kwargs) -> torch.Tensor:
        return self.gates.logits(module.layer_idx, keys, values).to(keys.dtype)
