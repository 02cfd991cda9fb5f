"""KVP agents: one small MLP scorer per (layer, KV head), all heads held as one batched module.

A token's features, per head: its post-RoPE key and its value (each normalised with that head's mean/std
from the training data) and three position features that are defined for any prompt length (no learned
position table, so nothing is clamped past the training length):
  relative position j / P, log(1 + distance to the prompt's end), log(1 + distance to its start).
The score is the MLP's output; higher means keep.
"""

import math

import torch
from torch import nn

POSITION_FEATURES = ("relative_position", "log_distance_to_end", "log_distance_to_start")
LOG_SCALE = math.log(4096)  # brings the log distances to about [0, 1] at typical lengths


def position_features(length: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """(length, 3) position features of the prompt tokens 0..length-1."""
    j = torch.arange(length, dtype=torch.float32, device=device)
    return torch.stack(
        [j / length, torch.log1p(length - 1 - j) / LOG_SCALE, torch.log1p(j) / LOG_SCALE], dim=-1
    )


class KVPAgents(nn.Module):
    """`num_heads` MLP scorers (input -> hidden -> hidden -> 1, SiLU), weights stacked over heads.

    Head h of the stack is the flat head index layer * num_kv_heads + kv_head of the heads it was built for.
    """

    def __init__(self, num_heads: int, head_dim: int, hidden: int = 64):
        super().__init__()
        self.num_heads, self.head_dim, self.hidden = num_heads, head_dim, hidden
        n_in = 2 * head_dim + len(POSITION_FEATURES)
        self.w1 = nn.Parameter(torch.randn(num_heads, n_in, hidden) / math.sqrt(n_in))
        self.b1 = nn.Parameter(torch.zeros(num_heads, 1, hidden))
        self.w2 = nn.Parameter(torch.randn(num_heads, hidden, hidden) / math.sqrt(hidden))
        self.b2 = nn.Parameter(torch.zeros(num_heads, 1, hidden))
        # A zero output layer starts every head at equal scores: a uniformly random ranking.
        self.w3 = nn.Parameter(torch.zeros(num_heads, hidden, 1))
        self.b3 = nn.Parameter(torch.zeros(num_heads, 1, 1))
        for name in ("key_mean", "value_mean"):
            self.register_buffer(name, torch.zeros(num_heads, head_dim))
        for name in ("key_std", "value_std"):
            self.register_buffer(name, torch.ones(num_heads, head_dim))

    def forward(
        self,
        keys: torch.Tensor,
        values: torch.Tensor,
        heads: slice = slice(None),
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Scores of the prompt tokens for the heads `heads` of the stack.

        keys, values: (batch, h, P, head_dim), h = number of selected heads -> fp32 scores (batch, h, P).
        positions: (batch, P, 3) position features, when the P tokens are not the whole prompt 0..P-1.
        """
        batch, h, length, head_dim = keys.shape
        if positions is None:
            positions = position_features(length, keys.device).expand(batch, -1, -1)
        w_key, w_value, w_position, bias = self.first_layer(heads)
        # (batch, h, P, d) -> (h, batch * P, d); a view when batch == 1, as in the press.
        keys = keys.float().transpose(0, 1).reshape(h, batch * length, head_dim)
        values = values.float().transpose(0, 1).reshape(h, batch * length, head_dim)
        x = torch.baddbmm(bias, keys, w_key)
        x = torch.baddbmm(x, values, w_value) + positions.reshape(1, batch * length, -1) @ w_position
        x = nn.functional.silu(x)
        x = nn.functional.silu(torch.baddbmm(self.b2[heads], x, self.w2[heads]))
        x = torch.baddbmm(self.b3[heads], x, self.w3[heads])
        return x.reshape(h, batch, length).transpose(0, 1)

    def first_layer(self, heads: slice) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The first layer's key, value and position weights and bias with the normalisation folded in.

        ((k - mean) / std) @ W == k @ (W / std) - (mean / std) @ W: no pass over the features to normalise
        them, and no concatenated copy of them.
        """
        d = self.head_dim
        w_key = self.w1[heads, :d] / self.key_std[heads, :, None]
        w_value = self.w1[heads, d : 2 * d] / self.value_std[heads, :, None]
        bias = self.b1[heads] - self.key_mean[heads, None] @ w_key - self.value_mean[heads, None] @ w_value
        return w_key, w_value, self.w1[heads, 2 * d :], bias

    def set_normalisation(self, key_mean, key_std, value_mean, value_std) -> None:
        """Per-head feature statistics, each (num_heads, head_dim), from the training data."""
        self.key_mean.copy_(key_mean)
        self.key_std.copy_(key_std)
        self.value_mean.copy_(value_mean)
        self.value_std.copy_(value_std)
