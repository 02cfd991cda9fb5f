"""Evaluation engine: one uncompressed prefill per sample serves every (press, ratio) config.

kvpress compresses in a forward hook that runs *after* each attention layer, so the hidden states that
reach the next layer always come from the full cache. The prefill is therefore the same for every press
that only acts inside that hook (ScorerPress and its wrappers). We run it once, and at each layer let
every such config's press compress the full keys/values into that config's own cache (presses that score
with attention weights get them computed there, as the eager attention would). The question and the
greedy decoding of all those configs then run as one batch: caches left-padded to a common length and
masked (per layer when layers differ), positions continuing from the uncompressed context length, each
stream stopping on its own.

The protocol is kvpress's `KVPressTextGenerationPipeline`, token for token: same chat-template split,
same positions, same stopping rule. Presses that change the forward itself, mask heads through
kvpress's attention patch, or compress while decoding fall back to a run of their own that follows the
pipeline's flow for that single config.
"""

import bisect
import contextlib
import itertools
import logging
import time
from dataclasses import dataclass, field, fields
from typing import Any

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
from kvpress.utils import get_prerope_query_states
from transformers import AttentionInterface, DynamicCache
from transformers.cache_utils import DynamicLayer
from transformers.masking_utils import AttentionMaskInterface, create_causal_mask, sdpa_mask
from transformers.models.llama.modeling_llama import repeat_kv, rotate_half

from kvbench.presses import build_press, needs_eager
from kvbench.presses.kvp import KVPPress
from kvbench.tasks.base import Sample

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Config:
    """One (press, ratio) point. `press_args` is a sorted tuple of (key, value) so configs are hashable;
    `press_state` is the digest of the learned state the press loads (`presses.press_state`), if any."""

    press: str
    ratio: float
    press_args: tuple[tuple[str, Any], ...] = ()
    press_state: str | None = None

    def build_press(self) -> BasePress | None:
        if self.press == "none":
            return None
        return build_press(self.press, self.ratio, **dict(self.press_args))


@dataclass
class Prompt:
    context_ids: torch.Tensor  # (1, n): prefilled and compressed
    question_ids: torch.Tensor  # (1, q): question + answer prefix, fed on top of the compressed cache
    regions: torch.Tensor | None = None  # (n,): index in REGIONS of each context token


@dataclass
class Run:
    """One config's press, its compressed cache and its measurements within a sample."""

    press: BasePress | None
    needs_attentions: bool  # the press scores with the prefill's attention weights
    cache: DynamicCache = field(default_factory=DynamicCache)
    compress_s: float = 0.0
    result: dict = field(default_factory=dict)


def evaluate_sample(
    model, tokenizer, sample: Sample, configs: list[Config], *, batch_configs: int = 16
) -> list[dict]:
    """Answer `sample` under every config; one dict per config, in order.

    Keys: prediction, context_tokens, kv_kept, kv_total (KV entries = tokens x layers x KV heads, after and
    before compression), kv_bytes_kept (bytes of the key/value tensors held after compression), prefill_s,
    decode_s. Times are amortised: a config's share of the shared prefill plus its own compression time,
    and its share of the batched decoding, so that they add up to the wall time over configs.
    Shareable configs are processed `batch_configs` at a time to bound memory: one prefill, then one
    decoding batch.
    """
    if batch_configs < 1:
        raise ValueError(f"batch_configs must be at least 1, got {batch_configs}")
    prompt = tokenize_sample(tokenizer, sample)
    runs = [
        Run(config.build_press(), needs_eager(config.press, dict(config.press_args))) for config in configs
    ]
    shared = [run for run in runs if is_shareable(run.press)]
    alone = [run for run in runs if not is_shareable(run.press)]
    with torch.no_grad():
        for start in range(0, len(shared), batch_configs):
            run_shared(model, prompt, shared[start : start + batch_configs], sample.max_new_tokens)
        log_fallback(alone)
        for run in alone:
            # As the pipeline on an eager model when the press needs attention weights.
            eager = run.needs_attentions
            with attention_implementation(model, "eager" if eager else model.config._attn_implementation):
                run_alone(model, prompt, run, sample.max_new_tokens)
    for run in runs:
        run.result["prediction"] = decode_prediction(tokenizer, run.result.pop("tokens"), sample)
    return [run.result for run in runs]


# Region of each context token, from the chat template's spans (region-aware presses such as MemDecay).
REGIONS = ("system", "user", "assistant", "tool", "scratchpad")


def tokenize_sample(tokenizer, sample: Sample) -> Prompt:
    """Split the prompt as the kvpress pipeline's `preprocess` does, and give each context token its region.

    A sample that turns the chat template off (LongBench's trec, triviaqa, ...) is the task's raw prompt,
    tokenized as the task's official code does: the tokenizer's own special tokens, nothing appended. A
    sample made of chat turns (`messages`) is rendered with the template, the question in a last user turn.
    """
    messages = sample.messages or [{"role": "user", "content": sample.context}]
    special_tokens = False
    if not sample.chat_template:
        context, special_tokens, question_suffix = sample.context, True, ""
    elif tokenizer.chat_template is not None:
        # The text after the context (end of turn, assistant header) goes with the question.
        separator = "#" * (max(len(message["content"]) for message in messages) + 10)
        turns = [{"role": message["role"], "content": message["content"]} for message in messages]
        if sample.messages:
            turns.append({"role": "user", "content": separator})
        else:
            turns[-1]["content"] += separator
        templated = tokenizer.apply_chat_template(
            turns, add_generation_prompt=True, tokenize=False, enable_thinking=False
        )
        context, question_suffix = templated.split(separator)
    else:  # a base model: the pipeline's fallback
        context = (tokenizer.bos_token or "") + "\n\n".join(message["content"] for message in messages)
        question_suffix = "\n"
    question = sample.question + question_suffix + sample.answer_prefix
    encoded = tokenizer(context, add_special_tokens=special_tokens, return_offsets_mapping=True)
    context_ids = torch.tensor([encoded["input_ids"]])
    regions = token_regions(context, messages, [start for start, _ in encoded["offset_mapping"]])
    question_ids = tokenizer.encode(question, return_tensors="pt", add_special_tokens=False)
    max_length = min(tokenizer.model_max_length, int(1e10))
    if context_ids.shape[1] > max_length:
        logger.warning("context truncated from %d to %d tokens", context_ids.shape[1], max_length)
        context_ids, regions = context_ids[:, :max_length], regions[:max_length]
    return Prompt(context_ids, question_ids, regions)


def token_regions(context: str, messages: list[dict], token_starts: list[int]) -> torch.Tensor:
    """The region id of each token: that of the message whose span holds the token's first character.

    A message's span runs from its content to the next message's content, so the template's header of a
    turn belongs to the previous one; text before the first message (a default system prompt) is "system".
    """
    starts, regions, cursor = [], [], 0
    for message in messages:
        found = context.find(message["content"], cursor)
        if found < 0:  # not rendered verbatim (a template that rewrites turns): the region runs on
            continue
        starts.append(found)
        regions.append(REGIONS.index(message.get("region", message["role"])))
        cursor = found + len(message["content"])
    ids = [
        regions[index] if (index := bisect.bisect_right(starts, start) - 1) >= 0 else 0
        for start in token_starts
    ]
    return torch.tensor(ids, dtype=torch.long)


def is_shareable(press: BasePress | None) -> bool:
    """True when the press only replaces keys/values inside kvpress's default prefill hook, without writing
    into them or leaving state on the model (head-wise masks), so the full cache can be shared."""
    if press is None:
        return True
    if isinstance(press, (ChunkPress, ChunkKVPress, BlockPress)):
        return is_shareable(press.press)
    return (
        isinstance(press, ScorerPress)
        and type(press).forward_hook is BasePress.forward_hook
        and type(press).__call__ is BasePress.__call__
        and all(is_shareable(inner) for inner in vars(press).values() if isinstance(inner, BasePress))
    )


def prepare_press(press: BasePress | None, model, prompt: Prompt) -> None:
    """What a press learns before the prefill: the model, and the context regions for those that ask."""
    if press is None:
        return
    press.post_init_from_model(model)
    if hasattr(press, "use_regions") and prompt.regions is not None:
        press.use_regions(prompt.regions)


def log_fallback(runs: list[Run]) -> None:
    """Say once per press class that it runs alone (it costs a prefill per config)."""
    for name in sorted({type(run.press).__name__ for run in runs} - _logged_fallbacks):
        logger.info("%s cannot share the prefill of other presses: it runs alone", name)
        _logged_fallbacks.add(name)


_logged_fallbacks: set[str] = set()


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


def language_model(model):
    return model.model.language_model if hasattr(model.model, "language_model") else model.model


def run_shared(model, prompt: Prompt, runs: list[Run], max_new_tokens: int) -> None:
    """One uncompressed prefill whose hooks fill every run's compressed cache, then one batched decoding."""
    for run in runs:
        prepare_press(run.press, model, prompt)
    start = clock(model)
    with compress_for_each(model, runs):
        model.model(input_ids=prompt.context_ids.to(model.device), past_key_values=DynamicCache())
    forward_s = clock(model) - start - sum(run.compress_s for run in runs)
    for run in runs:
        run.result.update(kv_counts(model, prompt, run.cache))
        run.result["prefill_s"] = forward_s / len(runs) + run.compress_s

    # Longest caches first, so that the attention can skip the padding of rows of equal length together.
    runs = sorted(runs, key=lambda run: -max(layer.keys.shape[2] for layer in run.cache.layers))
    room = prompt.question_ids.shape[1] + max_new_tokens
    cache, padding = pad_caches([run.cache for run in runs], room)
    for run in runs:
        run.cache = None  # the batch holds a copy; free the per-config caches
    start = clock(model)
    context_length = prompt.context_ids.shape[1]
    with attention_implementation(model, BATCHED_ATTENTION):
        tokens = greedy_decode(model, cache, padding, prompt.question_ids, context_length, max_new_tokens)
    decode_s = (clock(model) - start) / len(runs)
    for run, run_tokens in zip(runs, tokens, strict=True):
        run.result.update(tokens=run_tokens, decode_s=decode_s)


@contextlib.contextmanager
def compress_for_each(model, runs: list[Run]):
    """Hooks that, after each attention layer of the prefill, let every run compress the full keys/values
    into its own cache. The shared cache, and so the hidden states of the next layers, stay uncompressed."""

    def hook(module, args, kwargs, output):
        full = kwargs["past_key_values"].layers[module.layer_idx]
        with_attentions = output
        if output[1] is None and any(run.needs_attentions for run in runs):
            with_attentions = (output[0], attention_weights(module, kwargs, full.keys))
        layer_scores = {}  # scores of this layer, shared by the configs of one scorer at different ratios
        for run in runs:
            run.cache.layers.append(layer_holding(full.keys, full.values))
            if run.press is not None:
                start = clock(model)
                run_kwargs = {**kwargs, "past_key_values": run.cache}
                run_output = with_attentions if run.needs_attentions else output
                with scores_shared(run.press, layer_scores):
                    run.press.forward_hook(module, args, run_kwargs, run_output)
                run.compress_s += clock(model) - start
        return output

    lm = language_model(model)
    handles = []
    try:
        for layer in lm.layers:
            layer.self_attn.rotary_emb = lm.rotary_emb  # what BasePress.__call__ gives presses that need RoPE
            handles.append(layer.self_attn.register_forward_hook(hook, with_kwargs=True))
        yield
    finally:
        for handle in handles:
            handle.remove()


# Scorers whose scores do not depend on the compression ratio (only how many of them are kept does), and
# are deterministic; StreamingLLM and H2O place their windows by ratio, RandomPress without a seed draws anew.
RATIO_FREE_SCORERS = (
    KnormPress,
    SnapKVPress,
    TOVAPress,
    ExpectedAttentionPress,
    ObservedAttentionPress,
    KeyDiffPress,
    KVPPress,
    RandomPress,
)


@contextlib.contextmanager
def scores_shared(press: BasePress, layer_scores: dict):
    """Within one layer's hook, let configs of the same scorer and arguments at different ratios compute
    the scores once: kvpress's own `compress` still does the rest (top-k, gather), so results stay exact."""
    if type(press) not in RATIO_FREE_SCORERS or getattr(press, "seed", 0) is None:
        yield
        return
    arguments = [(f.name, getattr(press, f.name)) for f in fields(press) if f.compare]
    key = (type(press), repr([arg for arg in arguments if arg[0] != "compression_ratio"]))
    score = press.score

    def shared_score(*args):
        if key not in layer_scores:
            layer_scores[key] = score(*args)
        return layer_scores[key]

    press.score = shared_score  # the instance attribute shadows the method for this call only
    try:
        yield
    finally:
        del press.score


def attention_weights(module, kwargs: dict, keys: torch.Tensor) -> torch.Tensor:
    """The attention weights of a prefill layer, computed as the eager attention does, for presses that
    score with them (h2o, observed_attention) while the prefill itself keeps a faster attention."""
    queries = get_prerope_query_states(module, kwargs["hidden_states"])
    cos, sin = kwargs["position_embeddings"]
    queries = queries * cos.unsqueeze(1) + rotate_half(queries) * sin.unsqueeze(1)
    keys = repeat_kv(keys, queries.shape[1] // keys.shape[1])
    length = queries.shape[2]
    future = torch.ones(length, length, dtype=torch.bool, device=queries.device).triu(1)
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
    layer = DynamicLayer()
    layer.lazy_initialization(keys, values)
    layer.keys, layer.values = keys, values
    return layer


def pad_caches(caches: list[DynamicCache], room: int) -> tuple[DynamicCache, torch.Tensor | None]:
    """Stack single-sequence caches into one batch, every layer left-padded to the longest of all, with
    `room` for the tokens still to come.

    Returns the batch and the padding mask (layers, batch, length), True on real entries; None when nothing
    is padded.
    """
    lengths = torch.tensor([[layer.keys.shape[2] for layer in cache.layers] for cache in caches]).T
    longest = int(lengths.max())
    batch = DynamicCache()
    for layer_idx, layer_lengths in enumerate(lengths.tolist()):
        layers = [cache.layers[layer_idx] for cache in caches]
        _, heads, _, key_dim = layers[0].keys.shape
        key_buffer = layers[0].keys.new_empty(len(caches), heads, longest + room, key_dim)
        value_buffer = layers[0].values.new_empty(
            len(caches), heads, longest + room, layers[0].values.shape[3]
        )
        for row, (layer, n) in enumerate(zip(layers, layer_lengths, strict=True)):
            # Padding must be finite: a masked entry's weight is 0, and 0 * nan would still be nan.
            key_buffer[row, :, : longest - n] = 0
            value_buffer[row, :, : longest - n] = 0
            key_buffer[row, :, longest - n : longest] = layer.keys[0]
            value_buffer[row, :, longest - n : longest] = layer.values[0]
        batch.layers.append(BufferedLayer(key_buffer, value_buffer, longest))
    if (lengths == longest).all():
        return batch, None
    padding = torch.arange(longest) >= longest - lengths.unsqueeze(-1)
    return batch, padding.to(caches[0].layers[0].keys.device)


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
    for start, rows in itertools.groupby(range(batch), key=starts.__getitem__):
        rows = list(rows)
        rows = slice(rows[0], rows[-1] + 1)
        # Padding is on the left only: a single new token attends to every entry from `start` on, and
        # SDPA without a mask takes its fastest kernel.
        mask = None if length == 1 else attention_mask[rows, :, :, start:].repeat(1, 1, groups, 1)
        outputs.append(
            F.scaled_dot_product_attention(
                query[rows], key[rows, :, start:], value[rows, :, start:], attn_mask=mask, scale=scaling
            )
        )
    output = torch.cat(outputs)
    return output.reshape(batch, heads, length, dim).transpose(1, 2).contiguous(), None


BATCHED_ATTENTION = "kvbench_grouped_sdpa"
AttentionInterface.register(BATCHED_ATTENTION, grouped_sdpa)
AttentionMaskInterface.register(BATCHED_ATTENTION, sdpa_mask)


def greedy_decode(
    model, cache, padding, question_ids: torch.Tensor, context_length: int, max_new_tokens: int
) -> list[list[int]]:
    """Feed the question on top of each cache, then decode greedily; one token list per batch row.

    As in the pipeline, positions continue from the uncompressed context length, and a stream stops after
    emitting a stop token from its second token on (the pipeline never checks the first one).
    When the padding differs between layers (per-layer cache lengths, e.g. PyramidKV), each attention layer
    gets its own mask through a pre-hook, since the model builds a single mask for all layers.
    """
    device = model.device
    batch_size = cache.layers[0].keys.shape[0]
    masks = None  # (layers, batch, seen tokens): True on entries to attend
    if padding is not None:
        masks = torch.cat([padding, padding.new_ones(*padding.shape[:2], question_ids.shape[1])], dim=2)
    per_layer = masks is not None and not (masks == masks[:1]).all()

    layer_masks = []  # per layer, the mask of the current forward, built before any layer grows the cache

    def forward(input_ids: torch.Tensor, position: int, **kwargs) -> torch.Tensor:
        positions = torch.arange(position, position + input_ids.shape[1], device=device)
        if per_layer:
            seen = cache.get_seq_length()
            layer_masks[:] = [
                create_causal_mask(
                    config=model.config,
                    inputs_embeds=torch.empty(*input_ids.shape, 1, dtype=model.dtype, device=device),
                    attention_mask=layer_mask.long(),
                    cache_position=torch.arange(seen, seen + input_ids.shape[1], device=device),
                    past_key_values=cache,
                )
                for layer_mask in masks
            ]
        return model(
            input_ids=input_ids,
            past_key_values=cache,
            position_ids=positions.expand(len(input_ids), -1),
            attention_mask=masks[0].long() if masks is not None and not per_layer else None,
            **kwargs,
        ).logits[:, -1]

    def use_layer_mask(module, args, kwargs):
        kwargs["attention_mask"] = layer_masks[module.layer_idx]
        return args, kwargs

    stop_ids = torch.tensor(stop_token_ids(model), device=device)
    with layer_pre_hooks(model, use_layer_mask) if per_layer else contextlib.nullcontext():
        next_ids = forward(question_ids.to(device).expand(batch_size, -1), context_length, logits_to_keep=1)
        next_ids = next_ids.argmax(-1)
        tokens = [[token] for token in next_ids.tolist()]
        active = torch.arange(batch_size, device=device)  # batch rows of the streams still decoding
        position = context_length + question_ids.shape[1]
        for step in range(max_new_tokens - 1):
            if step > 0:
                running = ~torch.isin(next_ids, stop_ids)
                if not running.any():
                    break
                if not running.all():
                    order = compaction_order(row_groups(masks, len(active)), running.tolist())
                    keep = torch.tensor(order, device=device)
                    cache.batch_select_indices(keep)
                    active, next_ids = active[keep], next_ids[keep]
                    masks = masks[:, keep] if masks is not None else None
            if masks is not None:
                masks = torch.cat([masks, masks.new_ones(*masks.shape[:2], 1)], dim=2)
            next_ids = forward(next_ids.unsqueeze(1), position + step).argmax(-1)
            for row, token in zip(active.tolist(), next_ids.tolist(), strict=True):
                tokens[row].append(token)
    return tokens


def row_groups(masks: torch.Tensor | None, batch_size: int) -> list[int]:
    """A group id per batch row: rows with the same padding in every layer, which the attention serves
    with one call as long as they stay next to each other."""
    if masks is None:
        return [0] * batch_size
    padding = (~masks).sum(-1).T  # (batch, layers)
    return torch.unique(padding, dim=0, return_inverse=True)[1].tolist()


def compaction_order(groups: list[int], running: list[bool]) -> list[int]:
    """The rows that fill the compacted batch, slot by slot: the running rows, each group's rows kept
    together in the groups' current order, moving as few rows as possible (each move copies a row's whole
    cache; shifting every row after a finished one copied about half the batch per finished stream)."""
    order, start = [], 0
    for group in dict.fromkeys(groups):
        rows = [row for row, (g, run) in enumerate(zip(groups, running, strict=True)) if g == group and run]
        slots = range(start, start + len(rows))
        movers = iter(row for row in rows if row not in slots)
        order += [slot if slot in rows else next(movers) for slot in slots]
        start += len(rows)
    return order


@contextlib.contextmanager
def layer_pre_hooks(model, hook):
    handles = [
        layer.self_attn.register_forward_pre_hook(hook, with_kwargs=True)
        for layer in language_model(model).layers
    ]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def run_alone(model, prompt: Prompt, run: Run, max_new_tokens: int) -> None:
    """The pipeline's flow for one config whose press cannot share the prefill."""
    press = run.press
    prepare_press(press, model, prompt)
    cache = DynamicCache()
    context_length = prompt.context_ids.shape[1]
    compresses_prefill = not isinstance(press, DecodingPress)
    compresses_decoding = isinstance(press, (DecodingPress, PrefillDecodingPress))
    if isinstance(press, DMSPress):
        compresses_decoding = press.decoding
    try:
        start = clock(model)
        with press(model) if compresses_prefill else contextlib.nullcontext():
            model.model(input_ids=prompt.context_ids.to(model.device), past_key_values=cache)
        run.result["prefill_s"] = clock(model) - start
        run.result.update(kv_counts(model, prompt, cache, masked=masked_entries(model)))
        # Presses that move the kept keys to new positions continue from the compressed length.
        if isinstance(press, (RestoreKVPress, KeyRerotationPress)) or (
            isinstance(press, FinchPress) and press.rerotate_keys
        ):
            context_length = cache.get_seq_length()
        start = clock(model)
        with press(model) if compresses_decoding else contextlib.nullcontext():
            (tokens,) = greedy_decode(model, cache, None, prompt.question_ids, context_length, max_new_tokens)
        run.result.update(tokens=tokens, decode_s=clock(model) - start)
    finally:
        # Head-wise presses leave their masks on the attention modules; never let them leak into other runs.
        for layer in language_model(model).layers:
            if hasattr(layer.self_attn, "masked_key_indices"):
                layer.self_attn.masked_key_indices = None


def masked_entries(model) -> int:
    """KV entries that head-wise presses (AdaKV-style) mask instead of removing."""
    masked = 0
    for layer in language_model(model).layers:
        indices = getattr(layer.self_attn, "masked_key_indices", None)
        if indices is not None:
            masked += len(indices[0])
    return masked


def kv_counts(model, prompt: Prompt, cache: DynamicCache, masked: int = 0) -> dict:
    text_config = model.config.get_text_config()
    context_tokens = prompt.context_ids.shape[1]
    layers = [layer for layer in cache.layers if layer.keys.numel() > 0]
    return {
        "context_tokens": context_tokens,
        "kv_kept": sum(layer.keys.shape[1] * layer.keys.shape[2] for layer in layers) - masked,
        "kv_total": context_tokens * text_config.num_hidden_layers * text_config.num_key_value_heads,
        "kv_bytes_kept": sum(layer.keys.nbytes + layer.values.nbytes for layer in layers),
    }


def stop_token_ids(model) -> list[int]:
    eos = model.generation_config.eos_token_id
    return [token for token in (eos if isinstance(eos, (list, tuple)) else [eos]) if token is not None]


def decode_prediction(tokenizer, tokens: list[int], sample: Sample) -> str:
    prediction = tokenizer.decode(tokens, skip_special_tokens=True)
    if sample.first_line:
        prediction = prediction.lstrip("\n").split("\n")[0]
    return prediction


def clock(model) -> float:
    """Wall time, after waiting for queued GPU work so it is attributed to the right phase."""
    if model.device.type == "cuda":
        torch.cuda.synchronize(model.device)
    return time.perf_counter()
