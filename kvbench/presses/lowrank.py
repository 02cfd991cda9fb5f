"""Low-rank codecs of the KV cache: every token stays, its key and value kept as the first coefficients in a
per-head SVD basis. VarRate (Esmat, Shah, Jannesari, arXiv 2607.15498) gives salient tokens more coefficients;
`lowrank` is its uniform-rank ablation. Both are built from a memory budget (INTERFACES.md, codec presses)."""

import itertools
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import torch
from kvpress import BasePress, SnapKVPress
from torch import nn
from torch.nn import functional as F

BYTES = 2  # a 16-bit value, as kv_bytes counts everything


@dataclass
class LowRankStore:
    """One sequence's compressed layer, as a real store holds it (all tensors, nothing implied).

    Tokens are [sinks | middle | window]; sinks and window are kept as they are, at 16 bits. Each middle token
    t of KV head h keeps its first ranks[h, t] coefficients in that head's key basis and value basis; the
    coefficients are packed back to back (head by head, token by token), so nothing is stored for the dropped
    ones. `ranks` is None when every middle token has the same rank, the bases' width.
    """

    n_sinks: int
    protected_keys: torch.Tensor  # (kv heads, sinks + window, key dim), 16-bit
    protected_values: torch.Tensor  # (kv heads, sinks + window, value dim), 16-bit
    key_basis: torch.Tensor  # (kv heads, key dim, columns), 16-bit: top right singular vectors of the keys
    value_basis: torch.Tensor  # (kv heads, value dim, columns), 16-bit
    key_coefficients: torch.Tensor  # (Σ ranks,), 16-bit
    value_coefficients: torch.Tensor  # (Σ ranks,), 16-bit
    n_middle: int
    ranks: torch.Tensor | None  # (kv heads, middle), uint8 (int16 beyond 255 columns)

    @property
    def nbytes(self) -> int:
        tensors = [getattr(self, name) for name in vars(self)]
        return sum(tensor.nbytes for tensor in tensors if isinstance(tensor, torch.Tensor))

    def unpack(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values (kv heads, length, dim) in `dtype`, as attention reads them."""
        heads, columns = self.key_basis.shape[0], self.key_basis.shape[2]
        device = self.key_basis.device
        ranks = (
            torch.full((heads, self.n_middle), columns, device=device) if self.ranks is None else self.ranks
        )
        kept = torch.arange(columns, device=ranks.device) < ranks.long().unsqueeze(-1)
        restored = []
        for packed, basis, protected in (
            (self.key_coefficients, self.key_basis, self.protected_keys),
            (self.value_coefficients, self.value_basis, self.protected_values),
        ):
            coefficients = packed.new_zeros(heads, self.n_middle, columns)
            coefficients[kept] = packed
            restored.append(reconstruct(coefficients, basis, protected, self.n_sinks, dtype))
        return restored[0], restored[1]


def reconstruct(coefficients, basis, protected, n_sinks: int, dtype: torch.dtype) -> torch.Tensor:
    """(kv heads, length, dim) in `dtype` from a head's 16-bit coefficients (heads, middle, columns; zero past
    each token's rank), its basis and its protected sinks and window."""
    middle = (coefficients.float() @ basis.float().transpose(1, 2)).to(dtype)
    protected = protected.to(dtype)
    return torch.cat([protected[:, :n_sinks], middle, protected[:, n_sinks:]], dim=1)


@dataclass
class LowRankPress(BasePress):
    """Keep every token at the same rank r in a per-(layer, KV head) truncated-SVD basis of its keys (and one
    of its values), r the largest that fits `memory` x the 16-bit cache; sinks and window stay as they are.
    VarRate's uniform-rank ablation.

    Defaults: `rank` (R, the basis size) = head_dim and a window of 32, as the VarRate design note
    (shared/research/seed-methods.md: R = d, window 32); 4 sinks as StreamingLLM (the paper text is not
    public). The basis is fitted to the middle tokens only: the sinks' outlier keys would otherwise spend
    basis directions on 4 tokens that are stored as they are anyway. No centering (it would store a mean).

    Bytes of a layer (what `pack` really holds): coefficients (r per token for the key and r for the value)
    + the bases' first r columns (a store with a uniform rank r never needs more) + sinks and window, all at
    16 bits. Asked for less than r = 1 needs, the press raises ValueError.
    """

    name: ClassVar[str] = "lowrank"
    indexed: ClassVar[bool] = False  # whether the store keeps a rank per token
    # Replaces keys/values inside BasePress.forward_hook and never writes into them: the prefill is shared.
    shares_prefill: ClassVar[bool] = True

    memory: float = 0.5
    rank: int | None = None
    n_sinks: int = 4
    window_size: int = 32
    # "post-rope": the basis of the cached (rotated) keys; "pre-rope": keys rotated back to position 0 before
    # the basis is fitted, re-rotated after reconstruction (as low-rank key methods do: RoPE spreads a
    # key's energy over every frequency pair with the position); same bytes (issue 28 item 3).
    basis: str = "post-rope"
    layer_bytes: dict[int, int] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self):
        if not self.memory > 0:
            raise ValueError(f"{self.name} needs memory > 0, got {self.memory}")
        if self.rank is not None and self.rank < 1:
            raise ValueError(f"{self.name} needs rank >= 1, got {self.rank}")
        if self.n_sinks < 0 or self.window_size < 0:
            raise ValueError(f"{self.name} needs n_sinks, window_size >= 0")
        if self.basis not in ("post-rope", "pre-rope"):
            raise ValueError(f"{self.name} needs basis post-rope or pre-rope, got {self.basis!r}")

    @torch.no_grad()
    def compress(
        self,
        module: nn.Module,
        hidden_states: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        attentions: torch.Tensor,
        kwargs: dict,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # What unpack(pack(...)) gives, without packing: the coefficients past each token's rank are zeroed in
        # place rather than dropped and put back as zeros (boolean gathers and scatters cost more than the
        # projection itself).
        layout, row_ranks = self.allocate_rows(module, hidden_states, keys, values, kwargs)
        rotation = None
        if self.basis == "pre-rope":
            rotation = rope_tables(module, keys)
            keys = rotate(keys, *rotation, inverse=True)
        restored = []
        for row, ranks in enumerate(row_ranks):
            parts, kept = self.project(keys[row], values[row], ranks, layout)
            restored.append(
                [
                    reconstruct(
                        parts[f"{name}_coefficients"].masked_fill(~kept, 0),
                        parts[f"{name}_basis"],
                        parts[f"protected_{name}s"],
                        layout.n_sinks,
                        keys.dtype,
                    )
                    for name in ("key", "value")
                ]
            )
        keys = torch.stack([k for k, _ in restored])
        if rotation is not None:
            keys = rotate(keys, *rotation)
        return keys, torch.stack([v for _, v in restored])

    @torch.no_grad()
    def pack(self, module, hidden_states, keys, values, kwargs) -> list[LowRankStore]:
        """The store of each sequence of the batch; sets layer_bytes[layer] to its accounted bytes."""
        layout, row_ranks = self.allocate_rows(module, hidden_states, keys, values, kwargs)
        if self.basis == "pre-rope":  # the store holds pre-RoPE keys: a reader rotates them (rope_tables)
            keys = rotate(keys, *rope_tables(module, keys), inverse=True)
        return [self.encode(keys[row], values[row], ranks, layout) for row, ranks in enumerate(row_ranks)]

    def allocate_rows(self, module, hidden_states, keys, values, kwargs) -> tuple["Layout", list]:
        """The layout and each sequence's ranks (kv heads, middle); sets layer_bytes[layer]."""
        batch, heads, length, key_dim = keys.shape
        value_dim = values.shape[-1]
        n_sinks = min(self.n_sinks, length)
        n_window = min(self.window_size, length - n_sinks)
        n_middle = length - n_sinks - n_window
        max_rank = min(self.rank or key_dim, n_middle)
        if max_rank > min(key_dim, value_dim):
            raise ValueError(
                f"{self.name}: rank {self.rank} exceeds the head dimension {min(key_dim, value_dim)}"
            )
        layout = Layout(heads, length, n_sinks, n_window, key_dim, value_dim, self.indexed)
        budget = int(self.memory * length * heads * (key_dim + value_dim) * BYTES)
        salience = self.salience(module, hidden_states, keys, kwargs, n_sinks, n_middle) if n_middle else None
        row_ranks = []
        for row in range(batch):
            if n_middle == 0:
                if layout.full > budget:
                    raise ValueError(
                        f"{self.name}: memory {self.memory} < 1 but all {length} tokens are sinks or window"
                    )
                ranks = torch.zeros(heads, 0, dtype=torch.long, device=keys.device)
            else:
                ranks = self.allocate(
                    salience[row] if salience is not None else None, layout, max_rank, budget
                )
            row_ranks.append(ranks)
        self.layer_bytes[module.layer_idx] = sum(layout.bytes(ranks) for ranks in row_ranks)
        return layout, row_ranks

    def salience(self, module, hidden_states, keys, kwargs, n_sinks, n_middle) -> torch.Tensor | None:
        return None

    def allocate(self, salience, layout: "Layout", max_rank: int, budget: int) -> torch.Tensor:
        """The largest uniform rank that fits."""
        # Bytes grow with the rank: the ranks that fit are the first ones.
        fits = list(itertools.takewhile(lambda r: layout.bytes_uniform(r) <= budget, range(1, max_rank + 1)))
        if not fits:
            raise ValueError(
                f"{self.name}: memory {self.memory} is below what rank 1 for every token needs "
                f"({layout.bytes_uniform(1) / layout.full:.3f} of the cache at {layout.length} tokens)"
            )
        return torch.full((layout.heads, layout.n_middle), fits[-1], dtype=torch.long)

    def encode(self, keys, values, ranks: torch.Tensor, layout: "Layout") -> LowRankStore:
        """One sequence (kv heads, length, dim) -> its store, ranks (kv heads, middle) given."""
        parts, kept = self.project(keys, values, ranks, layout)
        for name in ("key", "value"):
            parts[f"{name}_coefficients"] = parts[f"{name}_coefficients"][kept]
        columns = kept.shape[-1]
        index_dtype = torch.uint8 if columns <= 255 else torch.int16
        return LowRankStore(
            n_sinks=layout.n_sinks,
            n_middle=layout.n_middle,
            ranks=ranks.to(keys.device).to(index_dtype) if self.indexed else None,
            **parts,
        )

    def project(self, keys, values, ranks: torch.Tensor, layout: "Layout") -> tuple[dict, torch.Tensor]:
        """One sequence's bases, protected entries and coefficients (kv heads, middle, columns), all 16-bit,
        the coefficients before truncation, and `kept` (kv heads, middle, columns): those within each token's
        rank."""
        dtype = keys.dtype if keys.dtype in (torch.float16, torch.bfloat16) else torch.float16
        middle = slice(layout.n_sinks, layout.length - layout.n_window)
        columns = int(ranks.max()) if ranks.numel() else 0
        ranks = ranks.to(keys.device)
        kept = torch.arange(columns, device=keys.device) < ranks.unsqueeze(-1)
        parts = {}
        for name, tensor in (("key", keys), ("value", values)):
            basis = top_right_singular_vectors(tensor[:, middle].float(), columns).to(dtype)
            coefficients = (tensor[:, middle].float() @ basis.float()).to(dtype)
            protected = torch.cat([tensor[:, : layout.n_sinks], tensor[:, middle.stop :]], dim=1).to(dtype)
            parts.update({f"{name}_basis": basis, f"{name}_coefficients": coefficients})
            parts[f"protected_{name}s"] = protected
        return parts, kept


def rope_tables(module: nn.Module, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (1, 1, length, dim) of cache positions 0..length-1 (a low-rank press keeps every token, so a
    cache index is its position), from the layer's rotary embedding (kvpress sets `module.rotary_emb`)."""
    positions = torch.arange(keys.shape[2], device=keys.device).unsqueeze(0)
    cos, sin = module.rotary_emb(keys, positions)
    return cos.unsqueeze(1).to(keys.dtype), sin.unsqueeze(1).to(keys.dtype)


def rotate(keys: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """RoPE applied to (batch, heads, length, dim) keys, or undone (a rotation by the opposite angle)."""
    half = keys.shape[-1] // 2
    rotated = torch.cat([-keys[..., half:], keys[..., :half]], dim=-1)  # rotate_half
    return keys * cos - rotated * sin if inverse else keys * cos + rotated * sin


def top_right_singular_vectors(matrix: torch.Tensor, columns: int) -> torch.Tensor:
    """(heads, tokens, dim) -> (heads, dim, columns): the top right singular vectors, as columns.

    Computed as the top eigenvectors of the (dim x dim) Gram matrix in float64: the same vectors as an SVD of
    the tall matrix, at a fraction of the cost. On a CPU the small eigenproblem runs on one thread: threads
    gain nothing at this size and, on a loaded machine, cost a hundredfold (measured: 0.9 s vs 6 ms)."""
    gram = matrix.double().transpose(1, 2) @ matrix.double()
    threads = torch.get_num_threads()
    if gram.device.type == "cpu":
        torch.set_num_threads(1)
    try:
        _, vectors = torch.linalg.eigh(gram)  # ascending eigenvalues
    finally:
        torch.set_num_threads(threads)
    return vectors.flip(-1)[..., :columns].to(matrix.dtype)


@dataclass(frozen=True)
class Layout:
    """What a layer's store holds for one sequence, in bytes."""

    heads: int
    length: int
    n_sinks: int
    n_window: int
    key_dim: int
    value_dim: int
    indexed: bool

    @property
    def n_middle(self) -> int:
        return self.length - self.n_sinks - self.n_window

    @property
    def full(self) -> int:
        return self.heads * self.length * (self.key_dim + self.value_dim) * BYTES

    def bytes(self, ranks: torch.Tensor | np.ndarray) -> int:
        """ranks (heads, middle): coefficients + bases (as wide as the largest rank) + rank indices + sinks
        and window."""
        count = self.heads * self.n_middle
        columns = int(ranks.max()) if count else 0
        index = (1 if columns <= 255 else 2) * count if self.indexed else 0
        coefficients = int(ranks.sum()) * 2 * BYTES  # r for the key, r for the value
        bases = self.heads * columns * (self.key_dim + self.value_dim) * BYTES
        protected = self.heads * (self.n_sinks + self.n_window) * (self.key_dim + self.value_dim) * BYTES
        return coefficients + bases + index + protected

    def bytes_uniform(self, rank: int) -> int:
        return self.bytes(np.full((self.heads, self.n_middle), rank))


@dataclass
class VarRatePress(LowRankPress):
    """VarRate: every token keeps a rank r_t >= min_rank of its key and value in the per-head SVD basis, more
    for tokens the observation window attends to: r_t = clip(floor(min_rank + λ s_t), min_rank, R), with λ
    shared by the KV heads of a layer and set by bisection to the largest value whose store fits `memory`
    x the 16-bit cache (water-filling). Salience s_t is SnapKV's: the last `window_size` prompt queries'
    attention, averaged over those queries and the query heads of the group, average-pooled over
    `kernel_size` keys (kvpress SnapKVPress.compute_window_attention, queries from the hidden states).

    Defaults: R = head_dim, min_rank 4, window 32 (the design note, shared/research/seed-methods.md; the
    paper's text is not public); 4 sinks as StreamingLLM; kernel_size 5 as kvpress's SnapKVPress. Where the
    note is silent: λ is per layer rather than per head, since window attention is a probability mass
    comparable across heads, so heads whose attention is concentrated get more coefficients (as AdaKV's
    layer-wide budgets); the rank is floored to an integer (so a token's rank never exceeds its share).

    Bytes of a layer: Σ_t r_t coefficients for the key and for the value + the bases' first max r_t columns
    (the rest are never read) + one rank index per middle token (1 byte; 2 beyond 255) + sinks and window,
    all at 16 bits. Asked for less than min_rank everywhere needs, the floor drops (down to rank 1: below
    that the press raises ValueError).
    """

    name: ClassVar[str] = "varrate"
    indexed: ClassVar[bool] = True

    min_rank: int = 4
    kernel_size: int = 5
    # "layer": one λ for the KV heads of a layer (default); "head": one λ per KV head, each head given the
    # same coefficient budget (the bases counted at the widest rank, so the layer stays within its budget).
    share: str = "layer"

    def __post_init__(self):
        super().__post_init__()
        if self.min_rank < 1 or self.window_size < 1 or self.kernel_size < 1 or self.kernel_size % 2 == 0:
            raise ValueError("varrate needs min_rank >= 1, window_size >= 1 and an odd kernel_size")
        if self.share not in ("layer", "head"):
            raise ValueError(f"varrate needs share layer or head, got {self.share!r}")

    def salience(self, module, hidden_states, keys, kwargs, n_sinks, n_middle) -> torch.Tensor:
        """(batch, kv heads, middle) float64."""
        window = min(self.window_size, hidden_states.shape[1])
        attention = SnapKVPress.compute_window_attention(
            module, hidden_states, keys, window, kwargs["position_embeddings"]
        )  # (batch, heads, window, length - window)
        scores = F.avg_pool1d(
            attention.float().mean(dim=2),
            kernel_size=self.kernel_size,
            padding=self.kernel_size // 2,
            stride=1,
        )
        batch, kv_heads = keys.shape[:2]
        scores = scores.view(batch, kv_heads, -1, scores.shape[-1]).mean(dim=2)
        return scores[..., n_sinks : n_sinks + n_middle].double().cpu()

    def allocate(self, salience, layout: Layout, max_rank: int, budget: int) -> torch.Tensor:
        if self.share == "head" and layout.heads > 1:
            return self.allocate_per_head(salience, layout, max_rank, budget)
        return self.allocate_shared(salience, layout, max_rank, budget)

    def allocate_per_head(self, salience, layout: Layout, max_rank: int, budget: int) -> torch.Tensor:
        """One λ per KV head: each head's coefficients get an equal share of what the layer's budget leaves
        after the bases (at the widest rank), rank indices, sinks and window."""
        fixed = layout.bytes(np.full((layout.heads, layout.n_middle), max_rank)) - (
            layout.heads * layout.n_middle * max_rank * 2 * BYTES
        )
        share = (budget - fixed) // layout.heads
        # A one-head layout without bases or protected parts: its bytes are the coefficients alone.
        head = Layout(1, layout.n_middle, 0, 0, layout.key_dim, layout.value_dim, False)
        coefficients_only = _CoefficientLayout(head)
        return torch.cat(
            [
                self.allocate_shared(salience[h : h + 1], coefficients_only, max_rank, share)
                for h in range(layout.heads)
            ]
        )

    def allocate_shared(self, salience, layout, max_rank: int, budget: int) -> torch.Tensor:
        salience = salience.numpy()  # numpy: a hundred small single-threaded evaluations, no thread wake-ups

        def ranks(scale: float) -> np.ndarray:
            return np.clip(np.floor(floor + scale * salience), floor, max_rank).astype(np.int64)

        # A budget below min_rank everywhere lowers the floor (down to rank 1): the floor is a knob a memory
        # budget solves for, as the ranks above it are; only rank 1 everywhere not fitting is an error.
        floor = min(self.min_rank, max_rank)
        while floor > 1 and layout.bytes(ranks(0.0)) > budget:
            floor -= 1
        if layout.bytes(ranks(0.0)) > budget:
            raise ValueError(
                f"varrate: memory {self.memory} is below what rank {floor} for every token needs "
                f"({layout.bytes(ranks(0.0)) / layout.full:.3f} of the cache at {layout.length} tokens)"
            )
        positive = salience[salience > 0]
        low, high = 0.0, 2.0 * (max_rank - floor) / float(positive.min()) if positive.size else 0.0
        if layout.bytes(ranks(high)) <= budget:  # at `high` every token with some salience is at the top
            return torch.from_numpy(ranks(high))
        for _ in range(100):
            middle = (low + high) / 2
            if not low < middle < high:  # adjacent floats: the remaining steps would change nothing
                break
            low, high = (middle, high) if layout.bytes(ranks(middle)) <= budget else (low, middle)
        return torch.from_numpy(ranks(low))


@dataclass(frozen=True)
class _CoefficientLayout:
    """A layout whose bytes are the coefficients alone (VarRate's per-head shares; the rest counted apart)."""

    inner: Layout

    def __getattr__(self, name):
        return getattr(self.inner, name)

    @property
    def full(self) -> int:
        return self.inner.full

    def bytes(self, ranks) -> int:
        return int(ranks.sum()) * 2 * BYTES
