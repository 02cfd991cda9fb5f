"""KVP agents: one small scorer per (layer, KV head), all heads of a model held as one batched module.

Two architectures (`ARCHS`), both scoring each prompt token alone from its post-RoPE key, its value and its
position; the score is the scorer's output, higher means keep:

- `compact` (KVPAgents, the default): an MLP of width 64 over the key and value, each normalised with that
  head's mean/std from the training data, and three position features defined for any prompt length
  (relative position j / P, log(1 + distance to the prompt's end), log(1 + distance to its start)), so
  nothing is clamped past the training length.
- `apple` (AppleAgents): the agent of Apple's code for the paper (KVSamplingGroupedQueryAgent, as configured
  in its configs/train_single_head.yaml), rewritten batched over heads; see its docstring.

Every parameter is stacked over heads (leading dimension = head of the stack) and applied with batched
matrix products, so head h's scores depend on head h's weights only. Head h of the stack is the flat head
index layer * num_kv_heads + kv_head of the heads it was built for.
"""

import math

import torch
from torch import nn

from kvbench.core.errors import BadInput

COMPACT_POSITION_FEATURES = ("relative_position", "log_distance_to_end", "log_distance_to_start")
LOG_SCALE = math.log(4096)  # brings the log distances to about [0, 1] at typical lengths


def whole_prompts(batch: int, length: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions (batch, length) and lengths (batch,) of `batch` whole prompts of `length` tokens."""
    positions = torch.arange(length, device=device).expand(batch, -1)
    return positions, torch.full((batch,), length, device=device)


def position_features(positions: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """The compact agents' (..., T, 3) position features of tokens at `positions` (..., T) of prompts of
    `lengths` tokens: (batch,) for positions (batch, T), else any shape that broadcasts to the positions'."""
    j = positions.float()
    length = lengths.float()[:, None] if lengths.dim() == 1 else lengths.float()
    return torch.stack(
        [j / length, torch.log1p(length - 1 - j) / LOG_SCALE, torch.log1p(j) / LOG_SCALE], dim=-1
    )


def per_head_positions(positions: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Positions (batch, T), the same for every head, or (batch, heads, T), each head's own (a cache
    compressed before keeps other entries in each head) -> (heads, batch * T)."""
    if positions.dim() == 2:
        positions = positions[:, None].expand(-1, num_heads, -1)
    return positions.transpose(0, 1).reshape(num_heads, -1)


def stacked_linear(num_heads: int, n_in: int, n_out: int) -> tuple[nn.Parameter, nn.Parameter]:
    """Weights (heads, n_in, n_out) and biases (heads, 1, n_out) drawn as nn.Linear draws its own."""
    bound = 1 / math.sqrt(n_in)
    weight = torch.empty(num_heads, n_in, n_out).uniform_(-bound, bound)
    bias = torch.empty(num_heads, 1, n_out).uniform_(-bound, bound)
    return nn.Parameter(weight), nn.Parameter(bias)


class StackedAgents(nn.Module):
    """What both architectures share: the stack's shape and each head's key and value statistics."""

    arch: str
    default_hidden: int

    def __init__(self, num_heads: int, head_dim: int, hidden: int):
        super().__init__()
        self.num_heads, self.head_dim, self.hidden = num_heads, head_dim, hidden
        for name in ("key_mean", "value_mean"):
            self.register_buffer(name, torch.zeros(num_heads, head_dim))
        for name in ("key_std", "value_std"):
            self.register_buffer(name, torch.ones(num_heads, head_dim))

    def set_normalisation(self, key_mean, key_std, value_mean, value_std) -> None:
        """Per-head feature statistics, each (num_heads, head_dim), from the training data."""
        self.key_mean.copy_(key_mean)
        self.key_std.copy_(key_std)
        self.value_mean.copy_(value_mean)
        self.value_std.copy_(value_std)

    def normalised_projection(self, weight, bias, which: str, heads: slice):
        """A first layer applied to standardised keys (`which` = "key") or values, folded into its weights:
        ((x - mean) / std) @ W + b == x @ (W / std) + (b - (mean / std) @ W), so scoring makes no
        standardised copy of the features."""
        mean, std = getattr(self, f"{which}_mean")[heads], getattr(self, f"{which}_std")[heads]
        weight = weight / std[:, :, None]
        return weight, bias - mean[:, None] @ weight

    @classmethod
    def from_state(cls, state: dict) -> "StackedAgents":
        """Agents shaped for a saved state dict, to load it into."""
        raise NotImplementedError

    def describe(self) -> dict:
        """What the card records about the architecture."""
        return {"arch": self.arch, "hidden": self.hidden}

    @staticmethod
    def flatten(keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(batch, h, P, d) -> fp32 (h, batch * P, d); a view when batch == 1, as in the press."""
        batch, h, length, head_dim = keys.shape
        keys, values = (
            x.float().transpose(0, 1).reshape(h, batch * length, head_dim) for x in (keys, values)
        )
        return keys, values


class KVPAgents(StackedAgents):
    """Compact agents: `num_heads` MLP scorers (input -> hidden -> hidden -> 1, SiLU) over the standardised
    key, value and the three position features."""

    arch = "compact"
    default_hidden = 64

    def __init__(self, num_heads: int, head_dim: int, hidden: int = default_hidden):
        super().__init__(num_heads, head_dim, hidden)
        n_in = 2 * head_dim + len(COMPACT_POSITION_FEATURES)
        self.w1 = nn.Parameter(torch.randn(num_heads, n_in, hidden) / math.sqrt(n_in))
        self.b1 = nn.Parameter(torch.zeros(num_heads, 1, hidden))
        self.w2 = nn.Parameter(torch.randn(num_heads, hidden, hidden) / math.sqrt(hidden))
        self.b2 = nn.Parameter(torch.zeros(num_heads, 1, hidden))
        # A zero output layer starts every head at equal scores: a uniformly random ranking.
        self.w3 = nn.Parameter(torch.zeros(num_heads, hidden, 1))
        self.b3 = nn.Parameter(torch.zeros(num_heads, 1, 1))

    @classmethod
    def from_state(cls, state: dict) -> "KVPAgents":
        num_heads, _, hidden = state["w1"].shape
        return cls(num_heads, state["key_mean"].shape[1], hidden)

    def describe(self) -> dict:
        return {**super().describe(), "features": ["key", "value", *COMPACT_POSITION_FEATURES]}

    def forward(
        self,
        keys: torch.Tensor,
        values: torch.Tensor,
        heads: slice = slice(None),
        positions: torch.Tensor | None = None,
        lengths: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Scores of prompt tokens for the heads `heads` of the stack.

        keys, values: (batch, h, T, head_dim), h = number of selected heads -> fp32 scores (batch, h, T).
        positions (batch, T), or (batch, h, T) when each head holds other tokens, and lengths (batch,):
        where the T tokens sit in prompts of how many tokens; None for whole prompts (T tokens 0..T-1).
        """
        batch, h, length, _ = keys.shape
        if positions is None:
            positions, lengths = whole_prompts(batch, length, keys.device)
        w_key, bias = self.normalised_projection(
            self.w1[heads, : self.head_dim], self.b1[heads], "key", heads
        )
        w_value, bias = self.normalised_projection(
            self.w1[heads, self.head_dim : 2 * self.head_dim], bias, "value", heads
        )
        keys, values = self.flatten(keys, values)
        x = torch.baddbmm(bias, keys, w_key)
        x = torch.baddbmm(x, values, w_value)
        token_lengths = lengths[:, None].expand(batch, length).reshape(1, -1)  # each token's prompt length
        features = position_features(per_head_positions(positions, h), token_lengths)  # (h, batch * T, 3)
        x = torch.baddbmm(x, features, self.w1[heads, 2 * self.head_dim :])
        x = nn.functional.silu(x)
        x = nn.functional.silu(torch.baddbmm(self.b2[heads], x, self.w2[heads]))
        x = torch.baddbmm(self.b3[heads], x, self.w3[heads])
        return x.reshape(h, batch, length).transpose(0, 1)


class StackedLayerNorm(nn.Module):
    """LayerNorm over the last dimension with each head's own gain and bias (heads, 1, dim)."""

    def __init__(self, num_heads: int, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(num_heads, 1, dim))
        self.bias = nn.Parameter(torch.zeros(num_heads, 1, dim))

    def forward(self, x: torch.Tensor, heads: slice) -> torch.Tensor:
        x = nn.functional.layer_norm(x, x.shape[-1:])
        return torch.addcmul(self.bias[heads], x, self.weight[heads])


class AppleAgents(StackedAgents):
    """Apple's agent, one per head, batched: score = MLP([LN(Lin(key)), LN(Lin(value)), LN(Emb(position))]),
    the MLP being 2 x [Linear, LayerNorm, SiLU] then Linear(hidden, 1).

    As in Apple's code (KVSamplingGroupedQueryAgent with configs/train_single_head.yaml): key and value
    projections of width 256 (`hidden`, Apple's processing_dim) each followed by LayerNorm; a learned
    position embedding of width 32 (Apple's pos_embedding_dim) indexed by the token's position from the
    prompt's start, clamped at the table's last row, followed by LayerNorm; an MLP of two hidden layers of
    width 256 (mlp_hidden_size, num_mlp_layers) with LayerNorm and SiLU; every layer drawn as nn.Linear and
    nn.Embedding draw theirs. Apple's default config does not use the query features (use_kv_queries:
    false) nor KeyDiff features, and neither do we.

    Our choices, where Apple's code does not decide or would cost here:
    - One `hidden` sets both the projections' and the MLP's width (Apple's configs set both to 256).
    - The position table has as many rows as the longest training prompt (`positions`; Apple: 6000 rows
      for 4k-token prompts), so every row is trained; a position past it (a prompt longer than any seen in
      training) reads the last row, as Apple's clamp does. Positions count from the prompt's start, so
      this agent, unlike the compact one, has no feature for the distance to the prompt's end.
    - Keys and values are standardised with each head's training statistics before the projection, folded
      into the projection's weights (`normalised_projection`): the same functions as Apple's (a linear map
      of a linear map), only better conditioned for the optimiser, and free at scoring time.
    - Each head has its own LayerNorm gains and biases (Apple trains one agent per head, so nothing is
      shared across heads there either).
    """

    arch = "apple"
    default_hidden = 256
    position_dim = 32

    def __init__(self, num_heads: int, head_dim: int, hidden: int = default_hidden, positions: int = 4096):
        super().__init__(num_heads, head_dim, hidden)
        self.positions = positions
        self.key_weight, self.key_bias = stacked_linear(num_heads, head_dim, hidden)
        self.value_weight, self.value_bias = stacked_linear(num_heads, head_dim, hidden)
        self.position_table = nn.Parameter(torch.randn(num_heads, positions, self.position_dim))
        self.key_norm = StackedLayerNorm(num_heads, hidden)
        self.value_norm = StackedLayerNorm(num_heads, hidden)
        self.position_norm = StackedLayerNorm(num_heads, self.position_dim)
        self.w1, self.b1 = stacked_linear(num_heads, 2 * hidden + self.position_dim, hidden)
        self.norm1 = StackedLayerNorm(num_heads, hidden)
        self.w2, self.b2 = stacked_linear(num_heads, hidden, hidden)
        self.norm2 = StackedLayerNorm(num_heads, hidden)
        self.w3, self.b3 = stacked_linear(num_heads, hidden, 1)

    @classmethod
    def from_state(cls, state: dict) -> "AppleAgents":
        num_heads, head_dim, hidden = state["key_weight"].shape
        return cls(num_heads, head_dim, hidden, positions=state["position_table"].shape[1])

    def describe(self) -> dict:
        return {
            **super().describe(),
            "features": ["key", "value", "position_embedding"],
            "positions": self.positions,
            "position_dim": self.position_dim,
        }

    def forward(
        self,
        keys: torch.Tensor,
        values: torch.Tensor,
        heads: slice = slice(None),
        positions: torch.Tensor | None = None,
        lengths: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Scores of prompt tokens for the heads `heads` of the stack; the arguments as KVPAgents takes
        them (`lengths` plays no part: positions count from the prompt's start)."""
        batch, h, length, _ = keys.shape
        if positions is None:
            positions, _ = whole_prompts(batch, length, keys.device)
        keys, values = self.flatten(keys, values)
        w_key, b_key = self.normalised_projection(self.key_weight[heads], self.key_bias[heads], "key", heads)
        w_value, b_value = self.normalised_projection(
            self.value_weight[heads], self.value_bias[heads], "value", heads
        )
        key_features = self.key_norm(torch.baddbmm(b_key, keys, w_key), heads)
        value_features = self.value_norm(torch.baddbmm(b_value, values, w_value), heads)
        rows = per_head_positions(positions, h).clamp(max=self.positions - 1)
        table = self.position_table[heads]
        rows = rows[..., None].expand(-1, -1, table.shape[-1])
        position_features = self.position_norm(table.gather(1, rows), heads)
        # The first MLP layer on the concatenation [key, value, position], as three products: no copy.
        w1, d = self.w1[heads], self.hidden
        x = torch.baddbmm(self.b1[heads], key_features, w1[:, :d])
        x = torch.baddbmm(x, value_features, w1[:, d : 2 * d])
        x = torch.baddbmm(x, position_features, w1[:, 2 * d :])
        x = nn.functional.silu(self.norm1(x, heads))
        x = nn.functional.silu(self.norm2(torch.baddbmm(self.b2[heads], x, self.w2[heads]), heads))
        x = torch.baddbmm(self.b3[heads], x, self.w3[heads])
        return x.reshape(h, batch, length).transpose(0, 1)


ARCHS: dict[str, type[StackedAgents]] = {"compact": KVPAgents, "apple": AppleAgents}


def build_agents(arch: str, num_heads: int, head_dim: int, hidden: int | None = None, **options):
    """New agents of architecture `arch` (hidden None: the architecture's default width)."""
    if arch not in ARCHS:
        raise BadInput(f"unknown KVP arch {arch!r} (choose one of: {', '.join(ARCHS)})")
    cls = ARCHS[arch]
    return cls(num_heads, head_dim, hidden or cls.default_hidden, **options)
