"""The prompt queries' attention over a cache, for the presses that score entries by the attention they
receive without eager attention (QEvict, MemDecay): which queries are scored, their RoPE'd form, and their
causal softmax over the cache, a chunk of queries at a time."""

from typing import Literal

import torch
from kvpress.utils import get_prerope_query_states
from transformers.models.llama.modeling_llama import rotate_half

# Query rows scored at a time: bounds the (heads x chunk x length) attention block; the smaller, the more of
# the causally masked half of the square is skipped and the better the block stays in cache (64 measured
# fastest at 1k and 4k tokens on one CPU thread: 2-3x faster than 512).
QUERY_CHUNK = 64
# Queries a prefill is scored with by default (`scored_queries`): 64 of a 1k prompt cuts QEvict's scoring
# from +70 % of the prefill to a few percent (benchmarks/press_overhead.py; docs/studies/performance.md).
SCORED_QUERIES = 64

Scored = int | Literal["all"]


def check_scored(scored, press: str) -> None:
    """`scored_queries` is "all" or a count of at least 2 (one recent query and one stratum)."""
    if scored != "all" and (isinstance(scored, bool) or not isinstance(scored, int) or scored < 2):
        raise ValueError(f"{press}: scored_queries must be 'all' or an integer >= 2, got {scored!r}")


def query_sample(count: int, scored: Scored, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(indices, stands_for) of the queries scored out of `count`, ascending: the last scored // 2 queries
    each standing for itself (they decide what the next tokens read, and ages of recent attention), and one
    query per stratum of the earlier ones (`scored` - scored // 2 strata of near-equal size), the stratum's
    last, standing for the stratum's size, so that the weighted sum estimates the sum over every query
    (a stratum's last query sees all its stratum's entries, so none is left at 0). "all", or `count` <=
    `scored`: every query, each standing for itself (the exact sum)."""
    if scored == "all" or count <= scored:
        return torch.arange(count, device=device), torch.ones(count, device=device)
    recent = scored // 2
    strata = scored - recent
    earlier = count - recent  # > strata, so every stratum holds a query
    bounds = torch.arange(strata + 1, device=device) * earlier // strata
    indices = torch.cat([bounds[1:] - 1, torch.arange(earlier, count, device=device)])
    stands_for = torch.cat([(bounds[1:] - bounds[:-1]).float(), torch.ones(recent, device=device)])
    return indices, stands_for


def rotated_queries(module, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_heads: int):
    """The post-RoPE queries of `hidden` (batch, m, hidden size) at the RoPE embeddings `cos`, `sin`
    (batch, m, d), pre-scaled (d values a query, not n logits; exact when the scaling is a power of two),
    float32, grouped by their KV head as repeat_kv pairs them: (batch, kv_heads, groups, m, d)."""
    queries = get_prerope_query_states(module, hidden)
    batch, heads, m, head_dim = queries.shape
    scaling = getattr(module, "scaling", head_dim**-0.5)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    queries = (queries * cos + rotate_half(queries) * sin).float() * scaling
    return queries.view(batch, kv_heads, heads // kv_heads, m, head_dim)


def attention_chunks(
    queries: torch.Tensor, keys: torch.Tensor, query_positions: torch.Tensor, key_positions: torch.Tensor
):
    """Yield (first query, weights) chunk by chunk: the causal softmax of `queries` (batch, kv_heads,
    groups, m, d, from `rotated_queries`) at the ascending `query_positions` (m,) over `keys` (batch,
    kv_heads, n, d) at `key_positions` (batch, kv_heads, n; a query sees the entries at its position or
    before), shape (batch, kv_heads, groups, rows, seen). `seen` is the last entry any query of the chunk
    sees: later entries get exactly 0 and are left out; only the columns from the first entry some query of
    the chunk does not see are masked."""
    batch, kv_heads, groups, count, head_dim = queries.shape
    n = keys.shape[2]
    keys = keys.float()
    ordinal = torch.arange(1, n + 1, device=keys.device)
    for start in range(0, count, QUERY_CHUNK):
        positions = query_positions[start : start + QUERY_CHUNK]
        seen = int(((key_positions <= positions[-1]) * ordinal).amax())
        hidden_from_some = (key_positions > positions[0]).flatten(0, 1).any(0)
        open_ = min(int(hidden_from_some.int().argmax()) if hidden_from_some.any() else n, seen)
        chunk = queries[:, :, :, start : start + QUERY_CHUNK]
        rows = chunk.shape[3]
        logits = chunk.reshape(batch, kv_heads, groups * rows, head_dim) @ keys[:, :, :seen].transpose(2, 3)
        logits = logits.view(batch, kv_heads, groups, rows, seen)
        future = key_positions[:, :, open_:seen].view(batch, kv_heads, 1, 1, -1) > positions.view(
            1, 1, 1, -1, 1
        )
        # Added as a bias (0 or -inf): the same logits as masked_fill, at a tenth of its cost on CPU.
        logits[..., open_:] += torch.zeros(future.shape, device=keys.device).masked_fill_(
            future, float("-inf")
        )
        yield start, logits.softmax(-1)
