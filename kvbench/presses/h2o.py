"""H2O: Heavy-Hitter Oracle (Zhang et al., NeurIPS 2023), as a kvpress ScorerPress."""

from dataclasses import dataclass

import torch
from kvpress import ScorerPress
from kvpress.utils import compute_n_kept
from torch import nn


@dataclass
class H2OPress(ScorerPress):
    """Keep the heavy hitters (most attention accumulated over the prompt's queries) plus a recent window.

    The kept budget int(L*(1-r)) per head is split between the `recent_fraction` most recent tokens and the
    heavy hitters among the others; the paper's default splits it evenly. Attention is summed over all prompt
    queries (not averaged: early tokens collect from more queries, as in H2O) and over the query heads that
    share a KV head. Needs attention weights: run the model with attn_implementation="eager".
    """

    compression_ratio: float = 0.0
    recent_fraction: float = 0.5

    def __post_init__(self):
        super().__post_init__()
        if not 0 <= self.recent_fraction <= 1:
            raise ValueError(f"recent_fraction must be in [0, 1], got {self.recent_fraction}")

    def score(
        self,
        module: nn.Module,
        hidden_states: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        attentions: torch.Tensor,
        kwargs,
    ) -> torch.Tensor:
        if attentions is None:
            raise ValueError('h2o needs attention weights: load the model with attn_implementation="eager"')
        batch, kv_heads, length, _ = keys.shape
        accumulated = attentions.sum(dim=2)  # (batch, heads, length): attention each key received
        scores = accumulated.view(batch, kv_heads, -1, length).sum(dim=2)
        n_recent = int(compute_n_kept(length, self.compression_ratio) * self.recent_fraction)
        if n_recent:
            scores[..., length - n_recent :] = torch.finfo(scores.dtype).max
        return scores
