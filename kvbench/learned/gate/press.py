"""Gate press: hard eviction by the learned sigmoid gates, the inference side of the soft-trained gates.

Every (layer, KV head) keeps the entries of highest gate g_j = sigmoid(w . [k_j; v_j] + b) (ranked by the
gate's logit, the same order) to the budget: kvpress's ScorerPress keeps int(L x (1 - ratio)) entries of
every head and the cache shrinks, so a ratio, a memory or an absolute budget means what it means for every
other evictor (the engine and the live-cache protocol set the ratio or target size). The gates of a model
live in a folder (default presses/gate/<model name>/) made by `kvbench gate train`.
"""

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import torch
from kvpress import ScorerPress

from kvbench.core import resources
from kvbench.learned.common import ModelShape, StatePress, load_state, save_learned_state, shipped_state_dir
from kvbench.learned.gate.gates import GateSet


@dataclass
class GatePress(StatePress, ScorerPress):
    """Keep the entries of highest learned gate, per layer and KV head.

    weights: folder holding gates.safetensors + card.json; default presses/gate/<model name>/.
    """

    ratio_free_scores: ClassVar[bool] = True  # the gates do not depend on the ratio
    compression_ratio: float = 0.0
    gates: GateSet | None = field(default=None, init=False, repr=False, compare=False)

    method, state_file, what = "gate", "gates.safetensors", "gate weights"

    @classmethod
    def hint(cls, name: str) -> str:
        out = resources.out_option(shipped_state_dir(cls.method, name), "weights")
        return f"kvbench gate train --model {name} {out}"

    @classmethod
    def build(cls, tensors: dict, card: dict, device) -> GateSet:
        shape = ModelShape(**card["model"])
        gates = GateSet(shape.num_layers, shape.num_kv_heads, shape.head_dim)
        gates.load_state_dict(tensors)
        return gates.to(device).eval().requires_grad_(False)

    def install(self, gates: GateSet, model) -> None:
        self.gates = gates

    def score(self, module, hidden_states, keys, values, attentions, kwargs) -> torch.Tensor:
        return self.gates.logits(module.layer_idx, keys, values).to(keys.dtype)


def save_gates(directory: Path, gates: GateSet, card: dict) -> None:
    """`gates.safetensors` (weight (layers, kv_heads, 2 head_dim), bias (layers, kv_heads)) and `card.json`
    (the model's shape, the training config, data, steps, time, validation KL)."""
    save_learned_state(directory, GatePress.state_file, gates, {"method": GatePress.method, **card})


def load_gates(directory: Path, shape: ModelShape | None = None) -> tuple[GateSet, dict, str]:
    """The gates, their card and the digest of the weights file; refused in one line when missing, corrupt
    or made for another model than `shape`."""
    return load_state(GatePress, directory, shape)
