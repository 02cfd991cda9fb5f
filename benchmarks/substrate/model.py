"""A tiny GPT-style byte-level language model for the attention-substrate study (issue 29, item 3): softmax
or sigmoid attention, with or without a learned per-(layer, head) token gate, with RoPE or with no positional
encoding at all (NoPE).

Choices the sigmoid-gated eviction abstract leaves open, and why:

- **Sigmoid attention** is Ramapuram et al. 2024 ("Theory, Analysis, and Best Practices for Sigmoid
  Self-Attention"): weights sigma(q.k / sqrt(d_head) + b) with the bias b = -log(n), n the training context
  length, held constant (the same b at every position and at evaluation), no normalisation over keys. Their
  other stabilisers (LayerScale, hybrid norm) are left out: at 2 layers and a few hundred steps training is
  stable without them (the study's losses show it).
- **Positional encoding**: RoPE (base 10000, rotate-half) against NoPE (none at all: a causal decoder infers
  position from the mask). NoPE rather than ALiBi because ALiBi adds a distance bias to the logits that is
  itself a fixed eviction-like prior (far tokens fade), which would confound the question of what a learned
  gate or a post-hoc scorer adds; NoPE is the clean "no position" arm.
- **Gate**: g[l, h, j] = sigma(w[l, h] . x_j + c[l, h]) on the layer's normed input x_j of token j, one
  linear map per layer giving a gate per head. Soft during training and in the no-eviction reference: log g_j
  (a log-sigmoid, so g = 0 is exactly -inf) is added to the attention logit of every query to key j, itself
  included, for softmax (weights g_j e^s / sum g e^s) and sigmoid (sigma(s + b + log g_j)) alike. g = 1
  leaves the model unchanged; g = 0 makes the token invisible, the same as removing its key and value. The
  gate's bias starts at +3 (g ~ 0.95) so training starts from an almost ungated model. Under hard eviction
  the kept entries keep their log g (the model is the function it was trained as; eviction only removes).
- Pre-LayerNorm blocks, GELU MLP of width 4d, tied input/output embeddings, byte vocabulary (256), no dropout.

`attend` is the one implementation of both attention kinds; the parallel forward (training) and the
token-by-token step over a cache (live-cache evaluation, benchmarks.substrate.study) both call it.
"""

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

ATTENTIONS = ("softmax", "sigmoid")


@dataclass(frozen=True)
class SubstrateConfig:
    attention: str = "softmax"
    gate: bool = False
    rope: bool = True
    vocab: int = 256
    d_model: int = 64
    n_layer: int = 2
    n_head: int = 4
    context: int = 128
    rope_base: float = 10000.0

    def __post_init__(self):
        if self.attention not in ATTENTIONS:
            raise ValueError(f"attention must be one of {ATTENTIONS}, not {self.attention!r}")
        if self.d_model % self.n_head or (self.d_model // self.n_head) % 2:
            raise ValueError("d_model / n_head must be an even integer")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    @property
    def sigmoid_bias(self) -> float:
        """Ramapuram et al.'s b = -log(n), n the training context length."""
        return -math.log(self.context)

    @property
    def name(self) -> str:
        return f"{self.attention}-{'gate' if self.gate else 'nogate'}-{'rope' if self.rope else 'nope'}"

    def to_dict(self) -> dict:
        return asdict(self)


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attention: str,
    visible: torch.Tensor,
    log_gate: torch.Tensor | None = None,
    sigmoid_bias: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention outputs and weights. q (..., Q, D), k and v (..., K, D), visible a bool mask broadcastable to
    (..., Q, K) (False: the key does not exist for that query), log_gate (..., K) added to every query's logit
    to that key. Softmax: weights softmax over the visible keys (a row with none visible gets zeros). Sigmoid:
    weights sigma(q.k / sqrt(D) + sigmoid_bias), zero where not visible, no normalisation."""
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if log_gate is not None:
        scores = scores + log_gate.unsqueeze(-2)
    if attention == "softmax":
        weights = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
        weights = torch.nan_to_num(weights, nan=0.0)
    elif attention == "sigmoid":
        weights = torch.sigmoid(scores + sigmoid_bias) * visible
    else:
        raise ValueError(f"attention must be one of {ATTENTIONS}, not {attention!r}")
    return weights @ v, weights


def rope(x: torch.Tensor, positions: torch.Tensor, base: float) -> torch.Tensor:
    """Rotate-half RoPE. x (..., T, D), positions (T,) or broadcastable to x's (..., T)."""
    half = x.shape[-1] // 2
    freqs = base ** (-torch.arange(half, dtype=torch.float64, device=x.device) / half)
    angles = (positions.to(torch.float64).unsqueeze(-1) * freqs).to(x.dtype)
    cos, sin = angles.cos(), angles.sin()
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class Block(nn.Module):
    def __init__(self, cfg: SubstrateConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.d_model
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        if cfg.gate:
            self.gate = nn.Linear(d, cfg.n_head)
            nn.init.zeros_(self.gate.weight)
            nn.init.constant_(self.gate.bias, 3.0)

    def heads(self, x: torch.Tensor, positions: torch.Tensor):
        """q, k, v (B, H, T, Dh) of the normed input x (B, T, d), RoPE applied where configured."""
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.cfg.n_head, self.cfg.head_dim).permute(2, 0, 3, 1, 4)
        if self.cfg.rope:
            q, k = rope(q, positions, self.cfg.rope_base), rope(k, positions, self.cfg.rope_base)
        return q, k, v

    def log_gate(self, x: torch.Tensor) -> torch.Tensor | None:
        """log g (B, H, T) of the normed input x (B, T, d); None for an ungated model."""
        if not self.cfg.gate:
            return None
        return F.logsigmoid(self.gate(x)).transpose(1, 2)

    def mix(self, h: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        b, _, t, _ = out.shape
        h = h + self.proj(out.transpose(1, 2).reshape(b, t, self.cfg.d_model))
        return h + self.mlp(self.ln2(h))


class SubstrateLM(nn.Module):
    def __init__(self, cfg: SubstrateConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        nn.init.normal_(self.embed.weight, std=0.02)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.ln_f(h) @ self.embed.weight.T

    def forward(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor | None = None,
        log_gate_override: list[torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Causal forward over ids (B, T): logits (B, T, V) and each layer's gates g (B, H, T) (empty for an
        ungated model). positions (T,) default 0..T-1 (RoPE only). log_gate_override: a log g (broadcastable
        to (B, H, T)) per layer used in place of the learned one (the tests force g = 1 or g = 0)."""
        t = ids.shape[1]
        if positions is None:
            positions = torch.arange(t, device=ids.device)
        visible = torch.ones(t, t, dtype=torch.bool, device=ids.device).tril()
        h = self.embed(ids)
        gates = []
        for i, block in enumerate(self.blocks):
            x = block.ln1(h)
            q, k, v = block.heads(x, positions)
            lg = block.log_gate(x) if log_gate_override is None else log_gate_override[i]
            if lg is not None and block.cfg.gate:
                gates.append(lg.exp())
            out, _ = attend(q, k, v, self.cfg.attention, visible, lg, self.cfg.sigmoid_bias)
            h = block.mix(h, out)
        return self.logits(h), gates
