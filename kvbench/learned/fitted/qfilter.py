"""Q-Filters (arXiv 2503.02812) fitted for any model: one filter per (layer, KV head), shape (layers,
kv_heads, head_dim) as the published `nthngdy/<model>_qfilt`, served to kvpress's QFilterPress.

The paper's filter of a head is the first right singular vector v1 of the matrix of its post-RoPE queries
(here the queries of every query head of the KV group, over the fitting contexts), signed so that the
queries project positively on it on average (v+ = sgn(sum of the first left singular vector) v1): the
expected logit of a key is then proportional to <k, v+>. kvpress's press scores a key by -(filter . k), so
the stored filter is -v+ and the press keeps the keys of highest <k, v+>. v1 and the sign come from the
queries' Gram matrix and sum (the same vector as the SVD of the stacked queries, without holding them).
"""

from dataclasses import dataclass

import torch
from kvpress import QFilterPress

from kvbench.bridge.adapter import query_states
from kvbench.learned.fitted.press import FittedState


def fit(model, tokenizer, contexts: list, options: dict) -> tuple[dict, dict]:
    """{"q_filters": (layers, kv_heads, head_dim)} and what the card records of the fit (the share of the
    queries' energy along each filter, the mean over heads)."""
    config = model.config
    layers, kv_heads = config.num_hidden_layers, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    gram = torch.zeros(layers, kv_heads, head_dim, head_dim, dtype=torch.float64)
    total = torch.zeros(layers, kv_heads, head_dim, dtype=torch.float64)

    def add(layer, before, after, keys):
        grouped = after.reshape(kv_heads, -1, head_dim)  # the group's query heads, then tokens
        gram[layer] += grouped.transpose(1, 2) @ grouped
        total[layer] += grouped.sum(dim=1)

    with torch.no_grad(), query_states(model, add):
        for ids in contexts:
            model(input_ids=ids.to(model.device), logits_to_keep=1)
    filters, energy = principal_directions(gram, total)
    return {"q_filters": (-filters).float()}, {"energy_share": round(float(energy.mean()), 4)}


def principal_directions(gram: torch.Tensor, total: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The first right singular vector of the queries whose Gram matrix is `gram` (..., d, d) and whose
    sum is `total` (..., d), signed so the queries' mean projection on it is positive; and the share of the
    queries' energy (sum of squared singular values) it carries."""
    eigenvalues, eigenvectors = torch.linalg.eigh(gram)  # ascending
    first = eigenvectors[..., -1]
    sign = torch.sign((total * first).sum(dim=-1, keepdim=True))
    sign[sign == 0] = 1
    return sign * first, eigenvalues[..., -1] / eigenvalues.sum(dim=-1)


@dataclass
class FittedQFilterPress(FittedState, QFilterPress):
    """kvpress's QFilterPress with its filters read from fitted state (`kvbench fit qfilter`).

    weights: folder holding state.safetensors + card.json; default presses/qfilter/<model name>/.
    """

    method = "qfilter"

    def install(self, tensors: dict, model) -> None:
        self.q_filters = tensors["q_filters"].to(model.dtype)
