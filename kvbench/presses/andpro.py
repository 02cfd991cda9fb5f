"""AnDPro: KV cache eviction by anchor direction projection (Geng, Wang et al., NeurIPS 2025), as a kvpress
ScorerPress whose token scores kvpress's AdaKVPress turns into head-wise budgets."""

import math
from dataclasses import dataclass

import torch
from kvpress import AdaKVPress, ScorerPress
from kvpress.utils import get_prerope_query_states
from torch import nn
from torch.nn import functional as F
from transformers.models.llama.modeling_llama import repeat_kv, rotate_half

from kvbench.core.errors import BadInput


@dataclass
class AnDProPress(ScorerPress):
    """Score chunks of `chunk_size` tokens by how much of the window's attention output they carry along the
    direction of the output the evictable tokens produce together (the anchor), and keep whole chunks.

    For each query i of the observation window (the last `window_size` prompt queries) and query head:
    Ã = max-pool over keys (kernel `kernel_size`) of softmax(q_i Kᵀ/√d); chunk c's share of the output is
    U[i, c] = Σ_{j∈c} Ã[i, j] v_j; the anchor is o_i = Σ_{c candidate} U[i, c]; the chunk's score is
    Σ_i <U[i, c], o_i>. Candidates are every chunk but chunk 0 (the attention sinks) and the window, which are
    always kept. Every token carries its chunk's score; wrap in `andpro_press` (kvpress's AdaKVPress without
    a per-head floor) for the paper's global top-k over the heads x tokens of a layer.

    Defaults from the official code (MIRALab-USTC/LLM-AnDPro, andpro_snapkv/monkeypatch/snapkv_utils.py,
    AnDProAdaptiveSnapKVCluster, at commit dfc2617 whose budget counts tokens): window_size 32, kernel_size 7,
    max pooling, chunk_size 4. Queries are computed from the hidden states after RoPE, as there.

    Deviations from that code, and why:
    - GQA: the official scoring path repeats keys/values to every query head and keeps one set per query head
      (its GQA path is plain AdaKV, without AnDPro). Here a KV head keeps one set for its group, scored by the
      sum of its query heads' projection scores (the score is a sum over queries, so the group's queries are
      simply more queries); the store stays the model's KV heads.
    - Budget granularity: the official keeps whole chunks; here each token carries its chunk's score and
      AdaKV keeps exactly int(L*(1-r)) x heads tokens, so at most one chunk per layer is cut at the boundary.
    - When L is not a multiple of `chunk_size`, the official protects the last window_size/chunk_size chunks
      of the right-padded layout (leaving the window's first tokens in a candidate chunk); here every chunk
      that touches the window is protected, so the whole window is always kept. Same when L % chunk_size == 0.
    - Scores are computed in float32 (the official casts the attention to the model's dtype).
    """

    compression_ratio: float = 0.0
    window_size: int = 32
    kernel_size: int = 7
    chunk_size: int = 4

    def __post_init__(self):
        super().__post_init__()
        if self.window_size < 1 or self.chunk_size < 1 or self.kernel_size < 1 or self.kernel_size % 2 == 0:
            raise ValueError(
                "andpro needs window_size >= 1, chunk_size >= 1 and an odd kernel_size, "
                f"got {self.window_size}, {self.chunk_size}, {self.kernel_size}"
            )

    def score(
        self,
        module: nn.Module,
        hidden_states: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        attentions: torch.Tensor,
        kwargs,
    ) -> torch.Tensor:
        length, window = hidden_states.shape[1], self.window_size
        if length <= window:
            raise BadInput(f"andpro needs more prompt tokens ({length}) than its window ({window})")
        attention = window_attention(module, hidden_states, keys, window, kwargs["position_embeddings"])
        pooled = F.max_pool1d(
            attention.flatten(0, 1), kernel_size=self.kernel_size, padding=self.kernel_size // 2, stride=1
        ).view_as(attention)
        return projection_scores(pooled, values, self.chunk_size, self.window_size)


def window_attention(module, hidden_states, keys, window_size: int, position_embeddings) -> torch.Tensor:
    """Attention (float32) of the last `window_size` queries over all keys, causal inside the window:
    (batch, query heads, window, keys)."""
    queries = get_prerope_query_states(module, hidden_states[:, -window_size:])
    cos, sin = position_embeddings
    cos, sin = cos[:, -window_size:].unsqueeze(1), sin[:, -window_size:].unsqueeze(1)
    queries = (queries * cos + rotate_half(queries) * sin).float()
    keys = repeat_kv(keys, queries.shape[1] // keys.shape[1]).float()
    logits = queries @ keys.transpose(2, 3) / math.sqrt(module.head_dim)
    length = keys.shape[2]
    future = torch.ones(window_size, length, dtype=torch.bool, device=keys.device)
    future = future.triu(length - window_size + 1)
    return logits.masked_fill(future, float("-inf")).softmax(dim=-1)


def projection_scores(
    attention: torch.Tensor, values: torch.Tensor, chunk_size: int, window_size: int
) -> torch.Tensor:
    """Token scores (batch, kv heads, length) from pooled window attention (batch, heads, window, length).

    Σ_i <U[i, c], o_i> = Σ_{j∈c} Σ_i Ã[i, j] <v_j, o_i>, with o_i = Ã_candidates[i] V: computed this way,
    no (window x chunks x head_dim) tensor of U is ever built. Protected tokens (chunk 0 and every chunk that
    touches the window) get the largest float, so a top-k keeps them first.
    """
    batch, heads, _, length = attention.shape
    kv_heads = values.shape[1]
    values = repeat_kv(values, heads // kv_heads).float()
    chunk = torch.arange(length, device=values.device) // chunk_size
    first_window_chunk = max(length - window_size, 0) // chunk_size
    candidate = (chunk > 0) & (chunk < first_window_chunk)
    anchors = (attention * candidate) @ values  # (batch, heads, window, head_dim): o_i
    along_anchor = attention * (anchors @ values.transpose(2, 3))  # Ã[i, j] <v_j, o_i>
    token_part = along_anchor.sum(dim=2)  # (batch, heads, length)
    n_chunks = chunk[-1].item() + 1
    padded = F.pad(token_part, (0, n_chunks * chunk_size - length))
    chunk_scores = padded.view(batch, kv_heads, heads // kv_heads, n_chunks, chunk_size).sum(dim=(2, 4))
    scores = chunk_scores.repeat_interleave(chunk_size, dim=-1)[..., :length]
    return scores.masked_fill(~candidate, torch.finfo(scores.dtype).max)


def andpro_press(ratio: float, **press_args) -> AdaKVPress:
    """AnDPro as the paper runs it: a global top-k of its scores over the heads x tokens of each layer, with
    no per-head floor (alpha_safeguard=0; the official code's floor_alpha is unused on its AnDPro path)."""
    return AdaKVPress(AnDProPress(compression_ratio=ratio, **press_args), alpha_safeguard=0.0)
