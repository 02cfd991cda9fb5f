"""The kvpress adapter: the one place that knows kvpress's and transformers' internals.

It follows kvpress's own hook rules. A press compresses in a forward hook that runs *after* each attention
layer (`BasePress.forward_hook`), so during a prefill the hidden states that reach the next layer come from
the full cache: `compress_for_each` lets many presses compress one full prefill into caches of their own.
During decoding, kvpress's `DecodingPress` compresses each layer every N steps in the same hook;
`compress_rows` runs one such press per row of a batched cache, on that row alone, exactly as the press
would see a single sequence.
"""

import contextlib
import functools
import hashlib
import time
from collections import defaultdict
from dataclasses import fields

import torch
import torch.nn.functional as F
from kvpress import (
    BasePress,
    BlockPress,
    ChunkKVPress,
    ChunkPress,
    DecodingPress,
    DMSPress,
    ExpectedAttentionPress,
    FinchPress,
    KeyDiffPress,
    KeyRerotationPress,
    KnormPress,
    ObservedAttentionPress,
    PrefillDecodingPress,
    RandomPress,
    RestoreKVPress,
    ScorerPress,
    SnapKVPress,
    TOVAPress,
)
from kvpress.utils import compute_n_kept, get_prerope_key_states, get_prerope_query_states
from transformers import AttentionInterface, DynamicCache
from transformers.cache_utils import DynamicLayer
from transformers.masking_utils import AttentionMaskInterface, create_causal_mask, sdpa_mask
from transformers.models.llama.modeling_llama import repeat_kv, rotate_half

from kvbench.core.errors import BadInput
from kvbench.core.press_hooks import declared

__all__ = ["DynamicCache"]


def language_model(model):
    return model.model.language_model if hasattr(model.model, "language_model") else model.model


def clock(model) -> float:
    """Wall time, after waiting for queued GPU work so it is attributed to the right phase."""
    if model.device.type == "cuda":
        torch.cuda.synchronize(model.device)
    return time.perf_counter()


@contextlib.contextmanager
def attention_implementation(model, name: str):
    previous = model.config._attn_implementation
    if name != previous:
        model.set_attn_implementation(name)
    try:
        yield
    finally:
        if name != previous:
            model.set_attn_implementation(previous)


def is_shareable(press: BasePress | None) -> bool:
    """True when the press only replaces keys/values inside kvpress's default prefill hook, without writing
    into them or leaving state on the model (head-wise masks), so the full cache can be shared. Presses
    other than scorers say so with `shares_prefill` (codecs that return reconstructed keys/values)."""
    if press is None:
        return True
    if isinstance(press, (ChunkPress, ChunkKVPress, BlockPress)):
        return is_shareable(press.press)
    return (
        (isinstance(press, ScorerPress) or declared(press, "shares_prefill", False))
        and type(press).forward_hook is BasePress.forward_hook
        and type(press).__call__ is BasePress.__call__
        and all(is_shareable(inner) for inner in vars(press).values() if isinstance(inner, BasePress))
    )


def compresses_prefill(press: BasePress | None) -> bool:
    return press is not None and not isinstance(press, DecodingPress)


def compresses_decoding(press: BasePress | None) -> bool:
    if isinstance(press, DMSPress):
        return press.decoding
    return isinstance(press, (DecodingPress, PrefillDecodingPress))


def moves_positions(press: BasePress | None) -> bool:
    """Presses that move the kept keys to new positions: decoding continues from the compressed length."""
    return isinstance(press, (RestoreKVPress, KeyRerotationPress)) or (
        isinstance(press, FinchPress) and press.rerotate_keys
    )


class CodecDecodingPress(DecodingPress):
    """kvpress's DecodingPress around a codec press that recompresses its whole store at each call (QEvict
    re-tiers): the same buffering and schedule; only DecodingPress's check that it wraps a scorer is left
    out. Its target ratio (`compression_ratio`) tells the codec its budget in 16-bit entries."""

    def __post_init__(self):
        self.hidden_states_buffer = defaultdict(list)
        self.layer_step_counts = defaultdict(int)


def decoding_press(
    press: BasePress, interval: int, target_size: int, buffer_size: int = 256
) -> DecodingPress:
    """kvpress's DecodingPress around `press`: compress every `interval` steps back to `target_size`.
    The DecodingPress sets the press's ratio at each compression."""
    codec = declared(press, "shares_prefill", False)
    if not isinstance(press, ScorerPress) and not codec:
        raise BadInput(
            f"{type(press).__name__} cannot compress during decoding: kvpress's DecodingPress takes scorers"
        )
    # DecodingPress tells its press the target through `compression_ratio`: a codec without one (lowrank,
    # varrate: a basis fitted once to the context) compresses a cache once, not again as it grows.
    if codec and not hasattr(press, "compression_ratio"):
        raise BadInput(
            f"{type(press).__name__} compresses the context once: it cannot compress the cache again as it "
            "grows"
        )
    if isinstance(press, ScorerPress) and not codec:  # (a scorer, unless it is a codec)
        press.compression_ratio = 0.0  # (DecodingPress warns of a ratio it will override)
        keep_cache_order(press)
    return (CodecDecodingPress if codec else DecodingPress)(
        base_press=press,
        compression_interval=interval,
        target_size=target_size,
        hidden_states_buffer_size=buffer_size,
    )


def keep_cache_order(press: ScorerPress) -> None:
    """Let `press` keep the entries it keeps in cache order, when kvpress's own ScorerPress.compress runs it.

    That compress gathers the top-k entries in the order of their scores (torch.topk), not of the cache
    (kvpress issue #173, an oversight by its maintainers' word). One compression does not care, attention
    is order-free; but a cache compressed again and again (DecodingPress: decode-time, streaming,
    perplexity) is then scored in a scrambled order, and presses that score by index drop the wrong
    entries: from the second compression on, StreamingLLM's sinks and window were arbitrary entries. The
    press's own scores still choose the entries kept; once chosen, they are rewritten to ranks that fall
    with the index (the dropped ones below them all), so that kvpress's top-k returns the same entries in
    cache order. Presses with a compress of their own are left as they are."""
    if type(press).compress is not ScorerPress.compress or "score" in vars(press):
        return
    score = press.score

    def score_in_cache_order(module, hidden_states, keys, values, attentions, kwargs):
        scores = score(module, hidden_states, keys, values, attentions, kwargs)
        kept = scores.topk(compute_n_kept(keys.shape[2], press.compression_ratio), dim=-1).indices
        chosen = torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, kept, True)
        index = torch.arange(keys.shape[2], device=scores.device, dtype=torch.float32)
        return torch.where(chosen, -index, -index - 2 * keys.shape[2])

    press.score = score_in_cache_order  # shadows the method on this press


@contextlib.contextmanager
def compress_for_each(model, runs):
    """Hooks that, after each attention layer of the prefill, let every run compress the full keys/values
    into its own cache. The shared cache, and so the hidden states of the next layers, stay uncompressed.
    Each run has: config, press, needs_attentions, cache (a DynamicCache), compress_s (seconds, accumulated).
    A press that writes into what the runs share (keys, values, hidden states, position embeddings, attention
    output and weights, shared scores) is BadInput naming it, raised before any row of the sample exists."""

    def hook(module, args, kwargs, output):
        full = kwargs["past_key_values"].layers[module.layer_idx]
        with_attentions = output
        if output[1] is None and any(run.needs_attentions for run in runs):
            weights = attention_weights(
                module, kwargs["hidden_states"], kwargs["position_embeddings"], full.keys
            )
            with_attentions = (output[0], weights)
        layer_scores = {}  # scores of this layer, shared by the configs of one scorer at different ratios
        shared = [full.keys, full.values, kwargs["hidden_states"], *kwargs["position_embeddings"]]
        shared += [tensor for tensor in with_attentions[:2] if isinstance(tensor, torch.Tensor)]
        for run in runs:
            run.cache.layers.append(layer_holding(full.keys, full.values))
            if run.press is not None:
                start = clock(model)
                run_kwargs = {**kwargs, "past_key_values": run.cache}
                run_output = with_attentions if run.needs_attentions else output
                watched = [*shared, *layer_scores.values()]
                before = versions(watched)
                with scores_shared(run.press, layer_scores):
                    run.press.forward_hook(module, args, run_kwargs, run_output)
                if versions(watched) != before:
                    raise BadInput(
                        f"press {run.config.press!r} writes into the keys, values, hidden states or "
                        "scores it is given, which other configs share: make it return new tensors "
                        "(kvbench check-press shows where)"
                    )
                run.compress_s += clock(model) - start
        return output

    with attention_hooks(model, hook, rotary=True):
        yield


def versions(tensors: list) -> list[int]:
    """The version counters of `tensors`: torch counts every write into a tensor in place, so a press that
    writes into what other configs share changes them (and nothing is copied)."""
    return [tensor._version for tensor in tensors if isinstance(tensor, torch.Tensor)]


@contextlib.contextmanager
def attention_hooks(model, hook, *, pre: bool = False, rotary: bool = False):
    """Hook every attention layer (after it, or before it with `pre`) for the duration of the block."""
    lm = language_model(model)
    handles = []
    try:
        for layer in lm.layers:
            if rotary:
                layer.self_attn.rotary_emb = lm.rotary_emb  # what BasePress.__call__ gives presses
            register = (
                layer.self_attn.register_forward_pre_hook if pre else layer.self_attn.register_forward_hook
            )
            handles.append(register(hook, with_kwargs=True))
        yield
    finally:
        for handle in handles:
            handle.remove()


@contextlib.contextmanager
def attention_inputs(model):
    """Each attention layer's inputs in the block's forwards, as a press's hook reads them: layer index ->
    (hidden_states, position_embeddings) of the last forward."""
    inputs = {}

    def hook(module, args, kwargs):
        inputs[module.layer_idx] = (kwargs["hidden_states"], kwargs["position_embeddings"])

    with attention_hooks(model, hook, pre=True, rotary=True):
        yield inputs


@contextlib.contextmanager
def query_states(model, consume):
    """For the block's forwards, `consume(layer index, before, after, keys)` with each attention layer's
    queries as the layer computes them, before and after RoPE, each (query heads, tokens, head_dim), and its
    keys before RoPE (KV heads, tokens, head_dim), in float64 on the CPU."""

    def hook(module, args, kwargs):
        cos, sin = kwargs["position_embeddings"]
        before = get_prerope_query_states(module, kwargs["hidden_states"])
        after = before * cos.unsqueeze(1) + rotate_half(before) * sin.unsqueeze(1)
        keys = get_prerope_key_states(module, kwargs["hidden_states"])
        consume(module.layer_idx, before[0].double().cpu(), after[0].double().cpu(), keys[0].double().cpu())

    with attention_hooks(model, hook, pre=True):
        yield


def compress_entry(press: BasePress, module, inputs: tuple, position: int, keys, values, attentions: bool):
    """The keys and values [1, heads, n, dim] of n consecutive tokens at positions `position`... as `press`
    keeps them when those tokens are the whole prefill: kvpress's prefill hook, called on a one-layer cache
    that holds only them, with their own attention inputs (`inputs`: hidden states and position
    embeddings, from `attention_inputs`) and, for presses that score with them, the attention weights among
    them. This is how kvpress's ChunkPress compresses each chunk of a context: alone."""
    hidden_states, position_embeddings = inputs
    n = keys.shape[2]
    cache = single_layer_cache(module.layer_idx, keys, values)
    kwargs = {
        "hidden_states": hidden_states,
        "past_key_values": cache,
        "position_embeddings": position_embeddings,
        "cache_position": torch.arange(n, device=keys.device),  # a prefill of these tokens alone
        "position_ids": torch.arange(position, position + n, device=keys.device)[None],  # where they sit
    }
    weights = attention_weights(module, hidden_states, position_embeddings, keys) if attentions else None
    press.forward_hook(module, [], kwargs, (None, weights))
    layer = cache.layers[module.layer_idx]
    return layer.keys, layer.values


# Scorers whose scores do not depend on the compression ratio (only how many of them are kept does), and
# are deterministic; StreamingLLM and H2O place their windows by ratio, RandomPress without a seed draws anew.
RATIO_FREE_SCORERS = (
    KnormPress,
    SnapKVPress,
    TOVAPress,
    ExpectedAttentionPress,
    ObservedAttentionPress,
    KeyDiffPress,
    RandomPress,
)  # and presses of ours that say so with a class attribute `ratio_free_scores = True` (KVP's)


@contextlib.contextmanager
def scores_shared(press: ScorerPress, layer_scores: dict):
    """Within one layer's hook, let configs of the same scorer and arguments at different ratios compute
    the scores once: kvpress's own `compress` still does the rest (top-k, gather), so results stay exact."""
    ratio_free = type(press) in RATIO_FREE_SCORERS or declared(type(press), "ratio_free_scores", False)
    if not ratio_free or vars(press).get("seed", 0) is None:  # a seedless random press: never shared
        yield
        return
    arguments = [(f.name, getattr(press, f.name)) for f in fields(press) if f.compare]
    key = (type(press), repr([arg for arg in arguments if arg[0] != "compression_ratio"]))
    score = press.score

    def shared_score(*args):
        if key not in layer_scores:
            layer_scores[key] = score(*args)
        return layer_scores[key]

    press.score = shared_score  # ty: ignore[invalid-assignment] (shadows the method for this call only)
    try:
        yield
    finally:
        del press.score


def attention_weights(module, hidden_states, position_embeddings, keys: torch.Tensor) -> torch.Tensor:
    """The attention weights of the queries of `hidden_states` over `keys` (the last of which are theirs),
    computed as the eager attention does, for presses that score with them (h2o, observed_attention)
    while the model itself keeps a faster attention."""
    queries = get_prerope_query_states(module, hidden_states)
    cos, sin = position_embeddings
    queries = queries * cos.unsqueeze(1) + rotate_half(queries) * sin.unsqueeze(1)
    keys = repeat_kv(keys, queries.shape[1] // keys.shape[1])
    length, kv_length = queries.shape[2], keys.shape[2]
    future = torch.ones(length, kv_length, dtype=torch.bool, device=queries.device).triu(
        kv_length - length + 1
    )
    # In place to spare (heads x length x length) temporaries; filling the masked scores with the dtype's
    # minimum gives the same softmax as eager's adding it.
    weights = (
        torch.matmul(queries, keys.transpose(2, 3))
        .mul_(module.scaling)
        .masked_fill_(future, torch.finfo(queries.dtype).min)
    )
    return F.softmax(weights, dim=-1, dtype=torch.float32).to(queries.dtype)


def layer_holding(keys: torch.Tensor, values: torch.Tensor) -> DynamicLayer:
    """A cache layer holding these tensors without copying them (a press's hook replaces them, never
    writes into them)."""
    layer = DynamicLayer()  # initialised by hand: lazy_initialization allocates two empty tensors
    layer.dtype, layer.device, layer.is_initialized = keys.dtype, keys.device, True
    layer.keys, layer.values = keys, values
    return layer


_EMPTY_LAYER = DynamicLayer()


def single_layer_cache(layer_idx: int, keys: torch.Tensor, values: torch.Tensor) -> DynamicCache:
    """A cache whose layer `layer_idx` holds these tensors: what a press's hook reads for one sequence.
    The layers before it are one shared empty layer (a press's hook touches its own layer only)."""
    cache = DynamicCache()
    cache.layers = [_EMPTY_LAYER] * layer_idx + [layer_holding(keys, values)]
    return cache


def masked_entries(model) -> int:
    """KV entries that head-wise presses (AdaKV-style) mask instead of removing."""
    masked = 0
    for layer in language_model(model).layers:
        indices = getattr(layer.self_attn, "masked_key_indices", None)
        if indices is not None:
            masked += len(indices[0])
    return masked


def clear_head_masks(model) -> None:
    """Head-wise presses leave their masks on the attention modules; never let them leak into other runs."""
    for layer in language_model(model).layers:
        if hasattr(layer.self_attn, "masked_key_indices"):
            layer.self_attn.masked_key_indices = None


def stop_token_ids(model) -> list[int]:
    eos = model.generation_config.eos_token_id
    return [token for token in (eos if isinstance(eos, (list, tuple)) else [eos]) if token is not None]


class BufferedLayer(DynamicLayer):
    """A cache layer over buffers with room for the tokens to come: appending writes in place, where
    DynamicLayer copies the whole cache (torch.cat) at every step, as costly as the attention itself."""

    def __init__(self, key_buffer: torch.Tensor, value_buffer: torch.Tensor, length: int):
        super().__init__()
        self.lazy_initialization(key_buffer, value_buffer)
        self.key_buffer, self.value_buffer = key_buffer, value_buffer
        self.set_length(length)

    def set_length(self, length: int) -> None:
        self.length = length
        self.keys, self.values = self.key_buffer[:, :, :length], self.value_buffer[:, :, :length]

    def update(self, key_states, value_states, cache_kwargs=None):
        end = self.length + key_states.shape[2]
        self.key_buffer[:, :, self.length : end] = key_states
        self.value_buffer[:, :, self.length : end] = value_states
        self.set_length(end)
        return self.keys, self.values

    def replace_row(
        self, row: int, keys: torch.Tensor, values: torch.Tensor, held: int | None = None
    ) -> None:
        """Row `row` now holds these entries, right-aligned; what is left of them is zero padding (finite:
        a masked entry's weight is 0, and 0 * nan would still be nan). `held`: the entries the row held
        before, when the padding left of them is zero already."""
        start = self.length - keys.shape[2]
        zero_from = 0 if held is None else self.length - held
        for buffer, new in ((self.key_buffer, keys), (self.value_buffer, values)):
            buffer[row, :, zero_from:start] = 0
            buffer[row, :, start : self.length] = new[0]

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep the rows `indices` in that order, copying only the rows that change place (dropping
        finished streams one by one would otherwise copy the whole cache each time)."""
        moved = (indices != torch.arange(len(indices), device=indices.device)).nonzero().squeeze(1)
        for buffer in (self.key_buffer, self.value_buffer):
            buffer[moved, :, : self.length] = buffer[indices[moved], :, : self.length]
        self.key_buffer, self.value_buffer = (
            self.key_buffer[: len(indices)],
            self.value_buffer[: len(indices)],
        )
        self.set_length(self.length)


def pad_caches(caches: list[DynamicCache], room: int) -> tuple[DynamicCache, torch.Tensor | None]:
    """Stack single-sequence caches into one batch, every layer left-padded to the longest of all, with
    `room` for the tokens still to come.

    Returns the batch and the padding mask (layers, batch, length), True on real entries; None when nothing
    is padded.
    """
    lengths = torch.tensor([[layer.keys.shape[2] for layer in cache.layers] for cache in caches]).T
    longest = int(lengths.max())
    batch = DynamicCache()
    for layer_idx in range(lengths.shape[0]):
        layers = [cache.layers[layer_idx] for cache in caches]
        _, heads, _, key_dim = layers[0].keys.shape
        key_buffer = layers[0].keys.new_empty(len(caches), heads, longest + room, key_dim)
        value_buffer = layers[0].values.new_empty(
            len(caches), heads, longest + room, layers[0].values.shape[3]
        )
        buffered = BufferedLayer(key_buffer, value_buffer, longest)
        batch.layers.append(buffered)
        for row, layer in enumerate(layers):
            buffered.replace_row(row, layer.keys, layer.values)
    if (lengths == longest).all():
        return batch, None
    padding = torch.arange(longest) >= longest - lengths.unsqueeze(-1)
    return batch, padding.to(caches[0].layers[0].keys.device)


def empty_batch(model, batch_size: int, room: int, held: int = 0) -> DynamicCache:
    """A batched cache with nothing in it yet and `room` entries per row (the streaming protocol's start);
    with `held`, its first entries count as held, zeros for the caller to mask (the perplexity's start)."""
    config = model.config.get_text_config()
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    shape = (batch_size, config.num_key_value_heads, room, head_dim)
    cache = DynamicCache()
    for _ in range(config.num_hidden_layers):
        keys, values = (torch.zeros(shape, dtype=model.dtype, device=model.device) for _ in range(2))
        cache.layers.append(BufferedLayer(keys, values, held))
    return cache


def grouped_sdpa(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """The attention of the batched decoding, as SDPA computes it, without the work padding would cost.

    Each KV group's query heads are folded into the query length: transformers' SDPA repeats keys and
    values for every query head whenever a mask is given, which made padded batches ~10x slower on CPU.
    Caches are left-padded and rows with the same padding are kept next to each other (sorted by length,
    then `compaction_order`), so consecutive rows with the same first attended entry share one call that
    skips the padding before it.
    """
    batch, heads, length, dim = query.shape
    kv_heads, kv_length = key.shape[1], key.shape[2]
    groups = heads // kv_heads
    if attention_mask is None:  # nothing padded: the new tokens only need the causal order among themselves
        attention_mask = torch.ones(length, kv_length, dtype=torch.bool, device=query.device).tril(
            kv_length - length
        )
    attention_mask = attention_mask.expand(batch, 1, length, kv_length)
    query = query.reshape(batch, kv_heads, groups * length, dim)
    # The last query attends to the most entries; earlier ones see a subset (causal).
    starts = attention_mask[:, 0, -1].long().argmax(-1).tolist()
    outputs = []
    row = 0
    while row < batch:
        end = row + 1
        while end < batch and starts[end] == starts[row]:
            end += 1
        rows, start = slice(row, end), starts[row]
        # Padding is on the left only: a single new token attends to every entry from `start` on, and
        # SDPA without a mask takes its fastest kernel.
        mask = None if length == 1 else attention_mask[rows, :, :, start:].repeat(1, 1, groups, 1)
        outputs.append(
            F.scaled_dot_product_attention(
                query[rows], key[rows, :, start:], value[rows, :, start:], attn_mask=mask, scale=scaling
            )
        )
        row = end
    output = torch.cat(outputs)
    return output.reshape(batch, heads, length, dim).transpose(1, 2).contiguous(), None


# MKL's float32 GEMM on AVX-512 runs 9 to 15 rows far slower than 16: a batched decoding step of the embedded
# model (one thread) took 0.20-0.21 s with 13-15 rows, 0.15-0.16 s with those padded to 16 (and 0.15 s
# with 9 or 16 rows); from 17 rows on, padding to 32 loses. Elsewhere this was not measured: rows go as
# they are.
PADDED_ROWS = range(9, 16)
PAD_TO = 16


def padded_linear(module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """`module`'s output, with 9 to 15 rows (a batched decoding step: one row per config) computed as 16,
    zero rows added. Rows are independent in a GEMM, so padding changes no row's arithmetic against
    another 16-row batch; a single row keeps `F.linear`, exactly what kvpress's pipeline computes."""
    rows = x.numel() // x.shape[-1]
    if rows not in PADDED_ROWS:
        return F.linear(x, module.weight, module.bias)
    padded = torch.cat([x.reshape(rows, -1), x.new_zeros(PAD_TO - rows, x.shape[-1])])
    return F.linear(padded, module.weight, module.bias)[:rows].reshape(*x.shape[:-1], -1)


def pads_rows(model) -> bool:
    return (
        model.device.type == "cpu"
        and model.dtype == torch.float32
        and torch.backends.mkl.is_available()
        and torch.backends.cpu.get_cpu_capability() == "AVX512"
    )


@contextlib.contextmanager
def padded_linears(model):
    """Within the block, the model's linear layers compute as `padded_linear` does where that was measured
    faster (float32 on an AVX-512 CPU with MKL). Re-entrant: an inner block leaves the outer one's layers
    as they are."""
    linears = [
        module
        for module in (model.modules() if pads_rows(model) else ())
        if type(module) is torch.nn.Linear and "forward" not in vars(module)
    ]
    for module in linears:
        module.forward = functools.partial(padded_linear, module)  # shadows the class's forward
    try:
        yield
    finally:
        for module in linears:
            del module.forward


BATCHED_ATTENTION = "kvbench_grouped_sdpa"
AttentionInterface.register(BATCHED_ATTENTION, grouped_sdpa)
AttentionMaskInterface.register(BATCHED_ATTENTION, sdpa_mask)


def batched_logits(
    model,
    cache,
    input_ids: torch.Tensor,
    position: int | torch.Tensor,
    masks,
    every_position: bool = False,
    **kwargs,
) -> torch.Tensor:
    """The last position's logits of every row (with `every_position`, every fed position's: batch x n x
    vocabulary), with `input_ids` fed on top of the batched `cache` at positions from `position` on (one
    for all rows, or a tensor of one per row). `masks` (layers, batch, entries incl. the new ones), True on
    real entries, or None when nothing is padded; when layers differ (per-layer cache lengths, e.g.
    PyramidKV), each attention layer gets its own mask through a pre-hook, since the model builds a single
    mask."""
    device = model.device
    steps = torch.arange(input_ids.shape[1], device=device)
    if torch.is_tensor(position):
        positions = position.to(device).unsqueeze(1) + steps
    else:
        positions = (steps + position).expand(len(input_ids), -1)
    per_layer = masks is not None and not (masks == masks[:1]).all()
    layer_masks = []
    if per_layer:
        seen = cache.get_seq_length()
        layer_masks = [
            create_causal_mask(
                config=model.config,
                inputs_embeds=torch.empty(*input_ids.shape, 1, dtype=model.dtype, device=device),
                attention_mask=layer_mask.long(),
                cache_position=torch.arange(seen, seen + input_ids.shape[1], device=device),
                past_key_values=cache,
            )
            for layer_mask in masks
        ]

    def use_layer_mask(module, args, kwargs):
        kwargs["attention_mask"] = layer_masks[module.layer_idx]
        return args, kwargs

    with attention_hooks(model, use_layer_mask, pre=True) if per_layer else contextlib.nullcontext():
        logits = model(
            input_ids=input_ids,
            past_key_values=cache,
            position_ids=positions,
            attention_mask=masks[0].long() if masks is not None and not per_layer else None,
            **kwargs,
        ).logits
    return logits if every_position else logits[:, -1]


def compress_rows(rows: list[tuple[int, BasePress, bool]], masks: torch.Tensor):
    """A hook for every attention layer of a batched forward: each row with a press (kvpress DecodingPress
    semantics: buffer, count, compress every N steps) runs that press's own hook on the row alone, and a
    row that shrank is written back right-aligned. `rows`: (batch row, press, whether it scores with
    attention weights); `masks`: the decoder's (layers, batch, entries) masks, updated in place for rows
    that shrank."""
    # Counted once per forward: a row's compression at one layer changes no other layer's count.
    held = masks.sum(-1).tolist()

    def hook(module, args, kwargs, output):
        layer_idx = module.layer_idx
        layer = kwargs["past_key_values"].layers[layer_idx]
        # Every row's views at once (one call each, not one per row).
        hidden_states, outputs = kwargs["hidden_states"].split(1), output[0].split(1)
        cos, sin = (embedding.split(1) for embedding in kwargs["position_embeddings"])
        position_ids = kwargs["position_ids"].split(1) if "position_ids" in kwargs else None
        for row, press, needs_attentions in rows:
            real = held[layer_idx][row]
            keys = layer.keys[row : row + 1, :, layer.length - real :]
            values = layer.values[row : row + 1, :, layer.length - real :]
            row_cache = single_layer_cache(layer_idx, keys, values)
            row_kwargs = {
                **kwargs,
                "hidden_states": hidden_states[row],
                "position_embeddings": (cos[row], sin[row]),
                "past_key_values": row_cache,
                "attention_mask": None,
            }
            if position_ids is not None:
                row_kwargs["position_ids"] = position_ids[row]
            weights = None
            if needs_attentions:
                weights = attention_weights(module, hidden_states[row], (cos[row], sin[row]), keys)
            press.forward_hook(module, args, row_kwargs, (outputs[row], weights))
            compressed = row_cache.layers[layer_idx]
            if compressed.keys is not keys:
                layer.replace_row(row, compressed.keys, compressed.values, held=real)
                masks[layer_idx, row] = False
                masks[layer_idx, row, layer.length - compressed.keys.shape[2] :] = True
        return output

    return hook


def seed_generators(seed: int, cuda_devices=()) -> None:
    """torch's CPU generator and those of `cuda_devices` (each with its index, as a tensor's device has it)
    seeded with `seed`, as torch.manual_seed seeds them, and no other: torch.manual_seed also queues a lazy
    seeding of every uninitialised accelerator, each with a formatted traceback, kept until that accelerator
    starts (never, on a CPU-only host)."""
    torch.default_generator.manual_seed(seed)
    for device in cuda_devices:
        torch.cuda.default_generators[device.index].manual_seed(seed)


def seed_press(press, key: str):
    """Give `press` (and every press it wraps) randomness of its own, drawn from a seed of `key` (the engine
    passes the sample and the config), the layer and how many times that layer has been compressed.

    Some presses draw from torch's global random state (leverage's and compactor's Gaussian sketches, cur
    with random leverage, random without a seed). Inside a shared prefill the configs compress layer by
    layer in turn, so such a press's draws would depend on which other configs share the sweep, and would
    change on resume. Each `compress` call instead runs under `torch.random.fork_rng` seeded from (key,
    layer, call): the same draws alone, in any sweep and on resume, and the global state is left as it was.
    Wrapping the instance's `compress` (not the classes, not the engine) keeps kvpress's presses stock and
    covers every press in the registry, whatever it does inside. Returns `press`."""
    if press is None or "compress" in vars(press):
        return press
    compress, calls = press.compress, {}

    def seeded_compress(module, *args, **kwargs):
        layer = getattr(module, "layer_idx", None)
        calls[layer] = calls.get(layer, 0) + 1
        digest = hashlib.sha256(f"{key}/{layer}/{calls[layer]}".encode()).digest()
        cuda = {tensor.device for tensor in args if torch.is_tensor(tensor) and tensor.device.type == "cuda"}
        seed = int.from_bytes(digest[:8], "little")
        with torch.random.fork_rng(devices=list(cuda)):
            seed_generators(seed, cuda)
            return compress(module, *args, **kwargs)

    press.compress = seeded_compress
    for inner in vars(press).values():
        if isinstance(inner, BasePress):
            seed_press(inner, key)
    return press
