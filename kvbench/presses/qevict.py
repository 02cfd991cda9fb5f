"""QEvict (arXiv 2608.05326; the authors' "Sticky KV" code): windows of tokens ranked by accumulated attention
are kept at 16 bits, quantised to int4, or evicted, and re-tiered (promoted, demoted) on every compression."""

import math
from dataclasses import dataclass, field, fields
from fractions import Fraction
from typing import ClassVar, Literal

import torch
from kvpress import BasePress
from torch import nn

from kvbench.presses.quant import (
    as_stored,
    decode,
    encode,
    min_max_params,
    pack_bits,
    store_dtype,
    unpack_bits,
)
from kvbench.presses.queries import (
    SCORED_QUERIES,
    Scored,
    attention_chunks,
    check_scored,
    query_sample,
    rotated_queries,
)

BITS = 4  # the quantised tier is int4 (the authors' QUANTIZATION_BIT_WIDTH = 4)


@dataclass
class LayerState:
    """What QEvict keeps of one layer besides the cache itself, one row per (sequence, KV head) and one
    column per cache entry, in the cache's order (position order): gathered with the same indices as the
    entries, so it always follows them. Codes and parameters are meaningful on quantised entries only (a
    simple layout for a harness; the bytes accounted are those of `pack`'s store)."""

    positions: torch.Tensor  # (rows, n) long: each entry's token position (0 = first token seen)
    scores: torch.Tensor  # (rows, n) float32: attention the entry received, accumulated over calls
    quantised: torch.Tensor  # (rows, n) bool: in the int4 tier
    key_codes: torch.Tensor  # (rows, n, d) uint8, codes in [0, 16)
    key_scale: torch.Tensor  # (rows, n, d / 2) fp16: its window's per-channel scale (RoPE pairs tied)
    key_zero: torch.Tensor  # (rows, n, d / 2) fp16
    value_codes: torch.Tensor  # (rows, n, d) uint8
    value_scale: torch.Tensor  # (rows, n) fp16: per token
    value_zero: torch.Tensor  # (rows, n) fp16
    length: int  # tokens seen so far (kept or not)
    local_start: int  # first position of the local zone: positions before it (past the sinks) are windows
    budget: float  # what one row may hold: bytes, or 16-bit token equivalents under the authors' accounting

    @classmethod
    def empty(cls, rows: int, head_dim: int, budget: float, device) -> "LayerState":
        state = cls(*[None] * 9, length=0, local_start=0, budget=budget)
        return state.extend(rows, head_dim, 0, device)

    def extend(self, rows: int, head_dim: int, count: int, device) -> "LayerState":
        """With `count` new 16-bit entries (the tokens since the last call) at the end."""
        new = dict(
            positions=torch.arange(self.length, self.length + count, device=device).expand(rows, -1),
            scores=torch.zeros(rows, count, device=device),
            quantised=torch.zeros(rows, count, dtype=torch.bool, device=device),
            key_codes=torch.zeros(rows, count, head_dim, dtype=torch.uint8, device=device),
            key_scale=torch.zeros(rows, count, head_dim // 2, dtype=torch.float16, device=device),
            key_zero=torch.zeros(rows, count, head_dim // 2, dtype=torch.float16, device=device),
            value_codes=torch.zeros(rows, count, head_dim, dtype=torch.uint8, device=device),
            value_scale=torch.zeros(rows, count, dtype=torch.float16, device=device),
            value_zero=torch.zeros(rows, count, dtype=torch.float16, device=device),
        )
        if self.positions is not None:
            new = {name: torch.cat([getattr(self, name), tensor], dim=1) for name, tensor in new.items()}
        return LayerState(**new, length=self.length + count, local_start=self.local_start, budget=self.budget)

    def gather(self, index: torch.Tensor) -> "LayerState":
        """The state of the entries `index` (rows, m) picks, in that order."""
        picked = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor):
                at = index.view(*index.shape, *[1] * (value.dim() - 2)).expand(-1, -1, *value.shape[2:])
                value = value.gather(1, at)
            picked[f.name] = value
        return LayerState(**picked)


def quantise_window_keys(keys: torch.Tensor):
    """Keys (rows, windows, ω, d) per channel within each window, the two channels that RoPE rotates together
    (i and i + d/2, rotate_half's pairing) sharing one range, as the authors' quantize_k_per_window does.
    Returns codes (rows, windows, ω, d) and scale/zero (rows, windows, d / 2)."""
    half = keys.shape[-1] // 2
    low, high = keys.amin(2), keys.amax(2)
    low = torch.minimum(low[..., :half], low[..., half:])
    high = torch.maximum(high[..., :half], high[..., half:])
    scale, zero = min_max_params(low, high, BITS)
    return encode(keys, paired(scale).unsqueeze(2), paired(zero).unsqueeze(2), BITS), scale, zero


def paired(params: torch.Tensor) -> torch.Tensor:
    """Parameters of the d/2 RoPE channel pairs, spread over the d channels (i and i + d/2 share one)."""
    return torch.cat([params, params], dim=-1)


def quantise_token_values(values: torch.Tensor):
    """Values (..., d) per token: codes (..., d), scale/zero (...)."""
    scale, zero = min_max_params(values.amin(-1), values.amax(-1), BITS)
    return encode(values, scale.unsqueeze(-1), zero.unsqueeze(-1), BITS), scale, zero


def decode_keys(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    """Codes (..., d) with their channel pairs' scale/zero (..., d / 2)."""
    return decode(codes, paired(scale), paired(zero))


TIER_FLAG_BYTES = 1  # a kept window's tier (16-bit or int4), which the store needs to put it back in order


def int4_window_bytes(window: int, head_dim: int) -> int:
    """An int4 window's payload: 4-bit codes of keys and values, and fp16 scale + zero-point per RoPE channel
    pair (keys) and per token (values)."""
    return window * head_dim + (head_dim // 2) * 2 * 2 + window * 2 * 2


def store_bytes(sixteen_bit: int, fp_windows: int, int4_windows: int, window: int, head_dim: int) -> int:
    """Bytes of one row's store: `sixteen_bit` entries (sinks, 16-bit windows, local zone) at 16 bits, the
    int4 windows, and one tier flag per kept window."""
    return (
        sixteen_bit * 2 * head_dim * 2
        + int4_windows * int4_window_bytes(window, head_dim)
        + (fp_windows + int4_windows) * TIER_FLAG_BYTES
    )


def pack(
    press: "QEvictPress", layer: int, keys: torch.Tensor, values: torch.Tensor
) -> dict[str, torch.Tensor]:
    """The store of one layer as real tensors, from the press's state and the cache it returned: the 16-bit
    entries, the int4 windows (codes two per byte, fp16 scales and zero-points), each kept window's tier."""
    state, window = press.states[layer], press.window
    batch, kv_heads, n, head_dim = keys.shape
    quantised = state.quantised
    int4 = int(quantised[0].sum()) // window
    in_windows = (state.positions >= min(press.sinks, state.length)) & (state.positions < state.local_start)
    windowed = (batch, kv_heads, int4, window)

    def sixteen_bit(x: torch.Tensor) -> torch.Tensor:
        return x.reshape(batch * kv_heads, n, head_dim)[~quantised].view(batch, kv_heads, -1, head_dim)

    return {
        "keys": sixteen_bit(keys).to(store_dtype(keys.dtype)),
        "values": sixteen_bit(values).to(store_dtype(values.dtype)),
        "key_codes": pack_bits(state.key_codes[quantised].view(*windowed, head_dim), BITS),
        "key_scale": state.key_scale[quantised].view(*windowed, -1)[:, :, :, 0],
        "key_zero": state.key_zero[quantised].view(*windowed, -1)[:, :, :, 0],
        "value_codes": pack_bits(state.value_codes[quantised].view(*windowed, head_dim), BITS),
        "value_scale": state.value_scale[quantised].view(windowed),
        "value_zero": state.value_zero[quantised].view(windowed),
        "tiers": quantised[in_windows].view(batch, kv_heads, -1, window)[..., 0].to(torch.uint8),
    }


def unpack(
    packed: dict[str, torch.Tensor], sinks: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values (in `dtype`, in the cache's order) from `pack`'s tensors: the sinks, the windows in
    position order (each from the 16-bit entries or the int4 ones, as its tier says), the local zone."""
    batch, kv_heads, sixteen_bit, head_dim = packed["keys"].shape
    tiers = packed["tiers"].bool()
    window = packed["key_codes"].shape[3]
    sinks = min(sinks, sixteen_bit)
    local = sixteen_bit - sinks - int((~tiers[0, 0]).sum()) * window
    quantised = torch.cat(
        [
            tiers.new_zeros(batch, kv_heads, sinks),
            tiers.repeat_interleave(window, dim=2),
            tiers.new_zeros(batch, kv_heads, local),
        ],
        dim=2,
    )
    key_codes = unpack_bits(packed["key_codes"], BITS)
    value_codes = unpack_bits(packed["value_codes"], BITS)
    dequantised = {
        "keys": decode_keys(key_codes, packed["key_scale"].unsqueeze(3), packed["key_zero"].unsqueeze(3)),
        "values": decode(
            value_codes, packed["value_scale"].unsqueeze(-1), packed["value_zero"].unsqueeze(-1)
        ),
    }
    out = []
    for name in ("keys", "values"):
        tensor = torch.empty(*quantised.shape, head_dim, dtype=dtype, device=tiers.device)
        tensor[quantised] = dequantised[name].reshape(-1, head_dim).to(dtype)
        tensor[~quantised] = packed[name].reshape(-1, head_dim).to(dtype)
        out.append(tensor)
    return out[0], out[1]


def gather_entries(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Entries (rows, m, d) of x (batch, kv_heads, n, d) that index (rows, m) picks."""
    rows, n, head_dim = index.shape[0], x.shape[2], x.shape[3]
    return x.reshape(rows, n, head_dim).gather(1, index.unsqueeze(-1).expand(-1, -1, head_dim))


def received_attention(
    module, hidden_states, keys, attentions, key_positions, query_positions, kwargs, scored: Scored = "all"
):
    """Attention each entry received from the queries at `query_positions` (the tokens since the last call,
    the whole prompt at the first): summed over those queries, averaged over the query heads of each KV head
    (as the authors' scores_for_cache). (batch, kv_heads, n) float32. Uses `attentions` when the layer gives
    them (eager attention: every query, exact), else computes them from the queries (RoPE'd as the model
    does) that `query_sample` picks out of them (`scored`), each weighted by the queries it stands for."""
    batch, kv_heads, n, head_dim = keys.shape
    count = len(query_positions)
    if attentions is not None:
        weights = attentions[..., -count:, :].float()
        return weights.view(batch, kv_heads, -1, count, n).mean(2).sum(2)
    hidden = hidden_states[:, -count:]
    cos, sin = kwargs["position_embeddings"]
    if cos.shape[-2] < count:  # decode-time: the layer was given the last step's embeddings only
        # The true position of the last token: position_ids (the cache's length is not one once compressed).
        position_ids = kwargs.get("position_ids")
        last = int(position_ids[0, -1] if position_ids is not None else kwargs["cache_position"][-1])
        ids = torch.arange(last - count + 1, last + 1, device=keys.device).unsqueeze(0)
        cos, sin = module.rotary_emb(hidden, ids)
    index, stands_for = query_sample(count, scored, keys.device)
    cos, sin = cos[:, -count:][:, index], sin[:, -count:][:, index]
    queries = rotated_queries(module, hidden[:, index], cos, sin, kv_heads)
    groups = queries.shape[2]
    received = torch.zeros(batch, kv_heads, n, device=keys.device)
    for start, weights in attention_chunks(queries, keys, query_positions[index], key_positions):
        rows = weights.shape[3]
        weighted = weights * stands_for[start : start + rows].view(1, 1, 1, -1, 1)
        received[..., : weights.shape[-1]] += weighted.sum((2, 3)) / groups
    return received


@dataclass
class QEvictPress(BasePress):
    """QEvict: sinks and a local zone of recent tokens stay at 16 bits; the other tokens are grouped in
    windows of `window` tokens, ranked by the attention they accumulated; the best windows stay at 16 bits,
    the next ones go to an int4 tier (keys per channel within the window, values per token, asymmetric
    min-max, fp16 scale and zero-point), the rest are deleted. Recoverable: each later call on the same
    layer (decode-time, streaming: new entries at the end) adds the new tokens' attention to every entry's
    score and re-tiers; a quantised window that regains importance is promoted (its dequantised values
    stored at 16 bits again), a 16-bit one that loses it is demoted (quantised), the worst are deleted.

    Defaults and where they come from (the authors' src/sticky_config.py unless said otherwise):
    - `window` = 8 (OMEGA), `sinks` = 4 (SINK_TOKENS), int4 tier (QUANTIZATION_BIT_WIDTH = 4).
    - `local_ratio` = 0.5 (P_RATIO = 50): the local zone is that share of the budget, in 16-bit tokens.
    - `quant_ratio` = 0.1 (Q_RATIO = 10): of the budget left after sinks and local zone, that share buys
      int4 windows and the rest 16-bit windows (allocator.compute_budget); the int4 tier also gets what the
      whole 16-bit windows leave over, as the authors' complement does.
    - `memory`: the budget, given by the registry, read by `accounting`:
      - "bytes" (kvbench's, the default): a fraction of the 16-bit full cache of the context at the first
        call, in real bytes (int4 codes, scales and zero-points, one tier byte per kept window), so that
        QEvict sits on the memory board beside every other press. Windows are rounded down to fit. The first
        call's budget is kept for later calls (a fixed cap, as the authors fix theirs at prefill); when the
        engine sets `compression_ratio` (DecodingPress's target), the budget is instead int(n x (1 - ratio))
        16-bit entries.
      - "authors": the authors' R_RATIO (allocator.compute_budget), so that rows can be set beside the
        paper's nominal budgets: floor((prompt + `max_new_tokens`) x memory) 16-bit tokens, the sinks taken
        out, the local zone local_ratio of the total, quant_ratio of what is left going to int4 tokens
        counted as a quarter of a 16-bit token each (scales and zero-points not counted), both tiers rounded
        up to whole windows. `max_new_tokens` is the authors' GENERATION_CONFIG value (512), which they count
        whatever the task generates. The cap is fixed at the first call and never refused; a DecodingPress
        target is ignored. The rows' kv_bytes are still the real bytes stored.
      The difference is the int4 tier's price: at head_dim 64 and window 8 an int4 window stores 512 bytes of
      codes, 128 of key scales and zero-points (one pair per RoPE channel pair), 32 of value scales and
      zero-points and a tier byte, 673 bytes against 2048 at 16 bits, 1/3.04, where the authors count 1/4.
    - Scores: at the first call, attention of every prompt query, summed over queries and averaged over the
      query heads of a KV head (the authors' tally_prefill_scores over scores_for_cache, H2O-like); at each
      later call, that of the tokens since the last call, from the cache as it is (so int4 windows are
      scored with their dequantised keys, as the authors' joint softmax does). A window's score is the sum
      of its entries' scores; ties go to the earlier window.
    - `scored_queries` (64 by default; "all" for the exact tally): the first call scores with a sample of
      the prompt's queries (`kvbench.presses.queries.query_sample`: the last 32 exactly, one query per
      stratum of the earlier ones weighted by the stratum's size), not with all of them: the exact tally
      costs +70 % of a 1k prefill on CPU, the sample a few percent, and the authors' scores are a sum whose
      order of windows the sample keeps (the memory board's rows of both, docs/studies/performance.md).
      Later calls score their few new tokens (fewer than 64) exactly. With eager attention every query is
      used, whatever `scored_queries` says.
    - The local zone starts at the first window boundary that leaves at most local_ratio x budget tokens
      after it (the authors' zone starts at the last boundary that leaves at least that many, overshooting
      by up to window - 1 tokens, which a byte budget cannot absorb); it never moves back between calls.
    - Re-tiering happens on every call (the engine's interval; the authors' every `window` decoded tokens).
      A window demoted again after a promotion is requantised from its values by min-max, which gives back
      its earlier codes up to the fp16 rounding of the parameters (the authors reuse the retired ones).
    Entries kept at 16 bits are returned as a 16-bit store holds them (rounded through float16, bfloat16 for
    bfloat16 models), so `unpack(pack(...))` gives back exactly what attention reads. Uses `attentions`
    when given; otherwise computes the scores from `hidden_states`, so it needs no eager attention.
    """

    memory: float = 1.0
    window: int = 8
    sinks: int = 4
    local_ratio: float = 0.5
    quant_ratio: float = 0.1
    compression_ratio: float | None = None
    accounting: Literal["bytes", "authors"] = "bytes"
    max_new_tokens: int = 512
    scored_queries: Scored = SCORED_QUERIES
    layer_bytes: dict[int, int] = field(default_factory=dict, init=False, repr=False, compare=False)
    states: dict[int, LayerState] = field(default_factory=dict, init=False, repr=False, compare=False)
    # Entries re-tiered, summed over calls, layers and rows: "promoted" int4 -> 16-bit (recovery, later
    # calls only), "demoted" 16-bit -> int4 (a window or the local zone's; benchmarks/qevict_retiering.py).
    retiered: dict[str, int] = field(
        default_factory=lambda: {"promoted": 0, "demoted": 0}, init=False, repr=False, compare=False
    )
    shares_prefill: ClassVar[bool] = True

    def __post_init__(self):
        if not 0 < self.memory <= 1:
            raise ValueError(f"qevict: memory must be in (0, 1], got {self.memory}")
        if self.window < 1 or self.sinks < 0:
            raise ValueError(f"qevict: window must be >= 1 and sinks >= 0, got {self.window}, {self.sinks}")
        if not (0 <= self.local_ratio <= 1 and 0 <= self.quant_ratio <= 1):
            raise ValueError("qevict: local_ratio and quant_ratio must be in [0, 1]")
        if self.accounting not in ("bytes", "authors") or self.max_new_tokens < 0:
            raise ValueError(
                f"qevict: accounting must be bytes or authors and max_new_tokens >= 0, got "
                f"{self.accounting!r}, {self.max_new_tokens}"
            )
        check_scored(self.scored_queries, "qevict")

    def post_init_from_model(self, model):
        self.states.clear()
        self.layer_bytes.clear()

    def first_budget(self, n: int, head_dim: int) -> float:
        """A row's budget at a sequence's first call of `n` tokens, in the accounting's unit."""
        if self.accounting == "authors":  # exact rational arithmetic, as the authors' integer percents
            return math.floor((n + self.max_new_tokens) * Fraction(str(self.memory)))
        return self.memory * n * 2 * head_dim * 2

    def plan(self, state: LayerState, head_dim: int, layer: int) -> tuple[int, int, int]:
        """(local_start, most 16-bit windows, most int4 windows) that fit the budget of one row."""
        sinks = min(self.sinks, state.length)
        if self.accounting == "authors":
            total = int(state.budget)
            local = min(math.floor(total * Fraction(str(self.local_ratio))), max(0, total - self.sinks))
            rest = max(0, total - self.sinks - local)
            fp_tokens = math.floor(rest * (1 - Fraction(str(self.quant_ratio))))
            int4_tokens = (rest - fp_tokens) * (16 // BITS)  # an int4 token is a quarter of a 16-bit one
            return (
                self.local_start(state, local, sinks),
                -(-fp_tokens // self.window),
                -(-int4_tokens // self.window),
            )
        token_bytes = 2 * head_dim * 2
        local_start = self.local_start(state, int(state.budget / token_bytes * self.local_ratio), sinks)
        fixed = (sinks + state.length - local_start) * token_bytes
        if fixed > state.budget:
            raise ValueError(
                f"qevict: memory {self.memory} gives {state.budget:.0f} bytes a KV head at layer {layer},"
                f" but the {sinks} sinks and {state.length - local_start} local tokens alone need {fixed}"
            )
        rest = state.budget - fixed
        fp_cost = self.window * token_bytes + TIER_FLAG_BYTES
        fp = int(rest * (1 - self.quant_ratio) // fp_cost)
        int4 = int((rest - fp * fp_cost) // (int4_window_bytes(self.window, head_dim) + TIER_FLAG_BYTES))
        return local_start, fp, int4

    def local_start(self, state: LayerState, local: int, sinks: int) -> int:
        """The local zone's first position: the first window boundary that leaves at most `local` tokens
        after it, never before the last call's."""
        aligned = sinks - (-max(0, state.length - local - sinks) // self.window) * self.window  # rounded up
        last_whole = sinks + (state.length - sinks) // self.window * self.window
        return max(state.local_start, min(aligned, last_whole))

    def compress(
        self,
        module: nn.Module,
        hidden_states: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        attentions: torch.Tensor,
        kwargs: dict,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        layer = int(module.layer_idx)
        batch, kv_heads, n, head_dim = keys.shape
        rows = batch * kv_heads
        state = self.states.get(layer)
        if state is None or (hidden_states is not None and hidden_states.shape[1] == n):  # a new sequence
            state = LayerState.empty(rows, head_dim, self.first_budget(n, head_dim), keys.device)
        new = n - state.positions.shape[1]
        if new < 0:
            raise ValueError(f"qevict: layer {layer}'s cache lost entries between two calls")
        seen = state.length  # entries of earlier calls: what can be re-tiered
        state = state.extend(rows, head_dim, new, keys.device)
        if self.compression_ratio is not None and self.accounting == "bytes":
            state.budget = int(n * (1 - self.compression_ratio)) * 2 * head_dim * 2
        count = attentions.shape[-2] if attentions is not None else hidden_states.shape[1]
        query_positions = torch.arange(state.length - min(count, new), state.length, device=keys.device)
        received = received_attention(
            module,
            hidden_states,
            keys,
            attentions,
            state.positions.view(batch, kv_heads, n),
            query_positions,
            kwargs,
            self.scored_queries,
        )
        state.scores = state.scores + received.view(rows, n)

        local_start, most_fp, most_int4 = self.plan(state, head_dim, layer)
        state.local_start = local_start
        sinks = min(self.sinks, state.length)
        windows = int((state.positions[0] < local_start).sum() - sinks) // self.window
        span = windows * self.window
        window_scores = state.scores[:, sinks : sinks + span].view(rows, windows, self.window).sum(-1)
        fp = min(most_fp, windows)
        int4 = min(most_int4, windows - fp)
        ranked = window_scores.argsort(dim=1, descending=True, stable=True)
        tier = torch.full((rows, windows), 2, device=keys.device)  # 0: 16-bit, 1: int4, 2: deleted
        tier.scatter_(1, ranked[:, :fp], 0)
        tier.scatter_(1, ranked[:, fp : fp + int4], 1)
        kept = (tier < 2).nonzero()[:, 1].view(rows, fp + int4)  # in position order
        offsets = torch.arange(self.window, device=keys.device)
        index = torch.cat(
            [
                torch.arange(sinks, device=keys.device).expand(rows, -1),
                (sinks + kept.unsqueeze(-1) * self.window + offsets).view(rows, -1),
                torch.arange(sinks + span, n, device=keys.device).expand(rows, -1),
            ],
            dim=1,
        )
        state = state.gather(index)
        keys, values = as_stored(gather_entries(keys, index)), as_stored(gather_entries(values, index))

        # Int4 windows: the ones already quantised keep their codes; the demoted (and the ones that left the
        # local zone straight for the int4 tier) are quantised from the values the 16-bit store holds.
        quantised = torch.zeros_like(state.quantised)
        quantised[:, sinks : sinks + (fp + int4) * self.window] = (
            tier.gather(1, kept) == 1
        ).repeat_interleave(self.window, dim=1)
        retained = quantised & state.quantised
        self.retiered["promoted"] += int((state.quantised & ~quantised).sum())
        self.retiered["demoted"] += int((quantised & ~state.quantised & (state.positions < seen)).sum())
        middle = slice(sinks, sinks + (fp + int4) * self.window)
        shape = (rows, fp + int4, self.window, head_dim)
        key_codes, key_scale, key_zero = quantise_window_keys(keys[:, middle].view(shape))
        value_codes, value_scale, value_zero = quantise_token_values(values[:, middle])
        fresh = {
            "key_codes": key_codes.view(rows, -1, head_dim),
            "key_scale": key_scale.repeat_interleave(self.window, dim=1),
            "key_zero": key_zero.repeat_interleave(self.window, dim=1),
            "value_codes": value_codes,
            "value_scale": value_scale,
            "value_zero": value_zero,
        }
        for name, tensor in fresh.items():
            old = getattr(state, name)[:, middle]
            keep = retained[:, middle].view(*retained[:, middle].shape, *[1] * (tensor.dim() - 2))
            getattr(state, name)[:, middle] = torch.where(keep, old, tensor)
        state.quantised = quantised

        mask = quantised.unsqueeze(-1)
        dequantised_keys = decode_keys(state.key_codes, state.key_scale, state.key_zero).to(keys.dtype)
        dequantised_values = decode(
            state.value_codes, state.value_scale.unsqueeze(-1), state.value_zero.unsqueeze(-1)
        )
        keys = torch.where(mask, dequantised_keys, keys)
        values = torch.where(mask, dequantised_values.to(values.dtype), values)
        self.states[layer] = state
        sixteen_bit = index.shape[1] - int4 * self.window
        self.layer_bytes[layer] = rows * store_bytes(sixteen_bit, fp, int4, self.window, head_dim)
        kept_shape = (batch, kv_heads, index.shape[1], head_dim)
        return keys.view(kept_shape), values.view(kept_shape)
