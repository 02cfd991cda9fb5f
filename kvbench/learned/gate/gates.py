"""The gates and the soft attention they train through.

Choices the study's abstract leaves open, and why:

- **What the gate reads.** g_j = sigmoid(w . [k_j; v_j] + b), on the entry's post-RoPE key and its value,
  one (w, b) per (layer, KV head). The abstract gates on the token; we gate on what the cache holds, so
  that the hard press can score every entry at any time (kvpress gives a press the hidden states of the
  latest tokens only, and the live-cache protocol re-ranks the whole cache after every chunk). Keys are
  post-RoPE as stored (KVP's agents read them so too): training and inference see the same vectors.
- **Where the gate acts (soft).** log g_j is added to the attention logit of every *later* query i > j of
  the KV group's query heads; the token's own query (i = j) is not gated, as an evicted entry is still
  seen by the token that writes it (in the live-cache protocol with every=1 a token attends to the budget
  plus itself). So g_j = 1 everywhere is the ungated model and g_j = 0 is the entry removed once written.
- **How it is wired.** The model's own SDPA attention function is swapped, inside `soft_gates(...)`, for
  one that adds the bias; outside that block the model is untouched.
"""

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import nn

_ACTIVE: list = []  # the gates of the innermost `soft_gates` block


class GateSet(nn.Module):
    """One linear gate per (layer, KV head) over [key; value] (2 x head_dim inputs).

    logits(layer, keys, values) -> (batch, kv_heads, entries); the gate is sigmoid of it. The input is
    scaled by 1/sqrt(2 head_dim) so that w's scale does not depend on the head size. Starts at w = 0 and
    b = logit(keep): every entry gated alike at the target keep fraction.
    """

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, keep: float = 0.5):
        super().__init__()
        self.head_dim = head_dim
        self.weight = nn.Parameter(torch.zeros(num_layers, num_kv_heads, 2 * head_dim))
        self.bias = nn.Parameter(torch.full((num_layers, num_kv_heads), math.log(keep / (1 - keep))))

    def logits(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        features = torch.cat([keys, values], dim=-1).to(self.weight.dtype) / math.sqrt(2 * self.head_dim)
        return torch.einsum("bhld,hd->bhl", features, self.weight[layer]) + self.bias[layer, :, None]

    def log_gates(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        return F.logsigmoid(self.logits(layer, keys, values))


def gate_bias(log_g: torch.Tensor, query_length: int, groups: int, mask=None) -> torch.Tensor:
    """The additive attention bias (batch, heads, queries, entries): log g_j for entries j strictly before
    query i, 0 on the diagonal, -inf after it (causal); the queries are the last `query_length` entries.
    `mask` (the model's attention mask: boolean, True = attend, or additive) is combined with it."""
    entries = log_g.shape[-1]
    rows = torch.arange(query_length, device=log_g.device)[:, None] + (entries - query_length)
    cols = torch.arange(entries, device=log_g.device)[None, :]
    bias = torch.where(cols < rows, log_g[:, :, None, :], torch.zeros((), dtype=log_g.dtype))
    bias = bias.masked_fill(cols > rows, float("-inf"))
    if mask is not None:
        mask = mask[..., -entries:]
        bias = bias.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else bias + mask
    return bias.repeat_interleave(groups, dim=1)


def gated_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """transformers' attention-function signature: SDPA with the active gates' bias added."""
    gates = _ACTIVE[-1]
    groups = query.shape[1] // key.shape[1]
    log_g = gates.log_gates(module.layer_idx, key, value)
    bias = gate_bias(log_g, query.shape[2], groups, attention_mask).to(query.dtype)
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=bias, dropout_p=dropout, scale=scaling)
    return out.transpose(1, 2).contiguous(), None


@contextlib.contextmanager
def soft_gates(model, gates):
    """Run `model` with `gates` soft (anything with `log_gates(layer, keys, values)`): every attention layer
    adds log g_j to later queries' logits. The model's attention implementation is switched to a registered
    gated one for the block and restored after."""
    from transformers import AttentionInterface

    AttentionInterface.register("kvbench_gate", gated_sdpa)
    config = model.config.get_text_config()
    before = config._attn_implementation
    _ACTIVE.append(gates)
    try:
        model.set_attn_implementation("kvbench_gate")
        yield model
    finally:
        _ACTIVE.pop()
        model.set_attn_implementation(before)
