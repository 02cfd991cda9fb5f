"""The steps protocols are made of, for the configs of one sample (`Run`): one shared prefill that fills
every run's compressed cache, a question decoded for every run as one batch, a press's run of its own, and
the cache's counts.

kvpress compresses in a forward hook that runs *after* each attention layer, so the prefill is the same for
every press that only acts inside that hook (ScorerPress, its wrappers, codecs that return reconstructed
keys/values). `prefill_shared` runs it once and lets every such config compress the full keys/values into
its own cache (`adapter.compress_for_each`); the question and the greedy decoding of all those configs then
run as one batch (`decoder.BatchedDecoder`). Presses that change the forward itself or mask heads through
kvpress's attention patch take `run_alone`, which follows the pipeline's flow for that single config.
"""

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

from kvpress import BasePress, DecodingPress
from kvpress.utils import compute_n_kept

from kvbench.bridge.adapter import (
    DynamicCache,
    clear_head_masks,
    clock,
    compress_for_each,
    compresses_decoding,
    compresses_prefill,
    decoding_press,
    language_model,
    masked_entries,
    moves_positions,
    pad_caches,
)
from kvbench.core.config import Config
from kvbench.core.press_hooks import declared
from kvbench.engine.decoder import BatchedDecoder
from kvbench.presses import press_of
from kvbench.tasks.prompt import Prompt

BYTES_PER_VALUE = 2  # memory is counted as a 16-bit cache stores it, whatever dtype the run computes in


@dataclass
class Run:
    """One config's press, its compressed cache and its measurements within a sample."""

    config: Config  # with the sample's ratio when the config has an absolute budget (`sized_config`)
    press: BasePress | None
    needs_attentions: bool  # the press scores with attention weights
    prompt: Prompt  # what this config prefills (the question included under query-aware) and asks
    cache: DynamicCache | None = field(default_factory=DynamicCache)
    compress_s: float = 0.0
    result: dict = field(default_factory=dict)  # what every question's row shares: the compressed context
    answers: list[dict] = field(default_factory=list)  # per question: tokens, decode_s, and per-turn counts


def pressed_tree(press: BasePress) -> list[BasePress]:
    """`press` and every press it wraps."""
    inner = [value for value in vars(press).values() if isinstance(value, BasePress)]
    return [press, *(p for value in inner for p in pressed_tree(value))]


def prepare_press(press: BasePress | None, model, prompt: Prompt) -> None:
    """What a press learns before the prefill: the model, and the regions of context and question for those
    that ask (the question reaches the cache during decode-time compression)."""
    if press is None:
        return
    press.post_init_from_model(model)
    use_regions = declared(press, "use_regions")
    if use_regions is not None and prompt.regions is not None:
        use_regions(prompt.all_regions())


def budget_entries(config: Config, context_length: int) -> int:
    """The entries per head a config's budget allows of `context_length` tokens: its absolute `budget`
    (at most the whole context); else int(L x (1 - ratio)) for an evictor, and for a codec its memory in
    16-bit entries (which a codec given a target ratio reads so)."""
    if config.budget is not None:
        return min(config.budget, context_length)
    codec = press_of(config).spec.codec
    memory = config.memory if config.memory is not None else 1 - config.ratio
    return compute_n_kept(context_length, 1 - memory if codec else config.ratio)


def stepwise_presses(model, runs: list[Run], prompt: Prompt, length: int) -> dict[int, DecodingPress]:
    """By row, each run's press prepared for the model and wrapped as kvpress's DecodingPress that
    compresses the cache back to the run's budget of `length` tokens after every step fed (its buffer: that
    step's hidden states); the uncompressed runs have none."""
    presses = {}
    for row, run in enumerate(runs):
        prepare_press(run.press, model, prompt)
        if run.press is not None:
            target = budget_entries(run.config, length)
            presses[row] = decoding_press(run.press, interval=1, target_size=target, buffer_size=1)
    return presses


def prefill_shared(model, runs: list[Run]) -> None:
    """One uncompressed prefill of the runs' common prompt whose hooks fill every run's compressed cache;
    each run's result gets its cache's counts (`kv_counts`) and its share of the prefill time plus its own
    compression time."""
    prompt = runs[0].prompt
    for run in runs:
        prepare_press(run.press, model, prompt)
    start = clock(model)
    with compress_for_each(model, runs):
        language_model(model)(input_ids=prompt.context_ids.to(model.device), past_key_values=DynamicCache())
    forward_s = clock(model) - start - sum(run.compress_s for run in runs)
    for run in runs:
        run.result.update(kv_counts(model, prompt.context_ids.shape[1], cache_entries(run.cache), run.press))
        run.result["prefill_s"] = forward_s / len(runs) + run.compress_s


def longest_first(runs: list[Run]) -> list[Run]:
    """Longest caches first, so that the attention can skip the padding of rows of equal length together."""
    return sorted(runs, key=lambda run: -max(layer.keys.shape[2] for layer in run.cache.layers))


def answer_question(
    model,
    runs: list[Run],
    max_new_tokens: int,
    decoding_press_of: Callable[[Run], BasePress | None] | None = None,
) -> None:
    """The question fed on top of every run's compressed cache and the answers decoded as one batch; the
    rows whose `decoding_press_of(run)` is a press (kvpress's DecodingPress) compress while they decode."""
    prompt = runs[0].prompt
    context_length = prompt.context_ids.shape[1]
    runs = longest_first(runs)
    room = prompt.question_ids.shape[1] + max_new_tokens
    presses = {row: decoding_press_of(run) for row, run in enumerate(runs)} if decoding_press_of else {}
    cache, padding = pad_caches([run.cache for run in runs], room)
    for run in runs:
        run.cache = None  # the batch holds a copy; free the per-config caches
    start = clock(model)
    decoder = BatchedDecoder(model, cache, padding, presses, attention_rows(runs, presses))
    tokens = decoder.decode(prompt.question_ids, context_length, max_new_tokens)
    decode_s = (clock(model) - start) / len(runs)
    for run, run_tokens in zip(runs, tokens, strict=True):
        run.answers.append({"tokens": run_tokens, "decode_s": decode_s})


def attention_rows(runs: list[Run], presses: dict) -> list[int]:
    return [row for row, run in enumerate(runs) if presses.get(row) is not None and run.needs_attentions]


def run_alone(model, run: Run, max_new_tokens: int) -> None:
    """The pipeline's flow for one config whose press cannot share the prefill (query-agnostic or
    query-aware: `check_protocol` keeps such presses out of the other protocols)."""
    press, prompt = run.press, run.prompt
    prepare_press(press, model, prompt)
    context_length = prompt.context_ids.shape[1]
    cache = DynamicCache()
    try:
        start = clock(model)
        with press(model) if compresses_prefill(press) else contextlib.nullcontext():
            language_model(model)(input_ids=prompt.context_ids.to(model.device), past_key_values=cache)
        run.result["prefill_s"] = clock(model) - start
        held = cache_entries(cache, masked_entries(model))
        run.result.update(kv_counts(model, prompt.context_ids.shape[1], held, run.press))
        if moves_positions(press):
            context_length = cache.get_seq_length()
        # Layers of different lengths (kvcompose, simlayerkv, per-layer ratios): the model would mask every
        # layer as the first; the decoder's masks give each layer its own (as for pyramidkv in a batch).
        masks = None
        if len({layer.keys.shape[2] for layer in cache.layers}) > 1:
            cache, masks = pad_caches([cache], prompt.question_ids.shape[1] + max_new_tokens)
        start = clock(model)
        with press(model) if compresses_decoding(press) else contextlib.nullcontext():
            decoder = BatchedDecoder(model, cache, masks, attention=None)
            (tokens,) = decoder.decode(prompt.question_ids, context_length, max_new_tokens)
        run.answers.append({"tokens": tokens, "decode_s": clock(model) - start})
    finally:
        clear_head_masks(model)


def cache_entries(cache: DynamicCache, masked: int = 0) -> tuple[int, int]:
    """(KV entries, values) a single-sequence cache holds: tokens x KV heads summed over layers, and the
    key and value numbers they store; `masked` entries (head-wise presses) are not held."""
    layers = [layer for layer in cache.layers if layer.keys.numel() > 0]
    entries = sum(layer.keys.shape[1] * layer.keys.shape[2] for layer in layers)
    values = sum(layer.keys.numel() + layer.values.numel() for layer in layers)
    per_entry = values / entries if entries else 0
    return entries - masked, int(values - masked * per_entry)


def kv_counts(model, context_tokens: int, held: tuple[int, int | None], press: BasePress | None) -> dict:
    """Entries and bytes of the compressed cache of `context_tokens` tokens, against the full one. `held`
    is (entries, values) or (entries, None) for full-width entries. A codec press reports its own bytes
    (`layer_bytes`: codes, scales, bases, indices); everyone else stores its kept entries at 16 bits."""
    config = model.config.get_text_config()
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    entries, values = held
    values = entries * 2 * head_dim if values is None else values
    kv_total = context_tokens * config.num_hidden_layers * config.num_key_value_heads
    layer_bytes = declared(press, "layer_bytes")
    return {
        "context_tokens": context_tokens,
        "kv_kept": entries,
        "kv_total": kv_total,
        "kv_bytes": sum(layer_bytes.values()) if layer_bytes else values * BYTES_PER_VALUE,
        "kv_bytes_full": kv_total * 2 * head_dim * BYTES_PER_VALUE,
    }
