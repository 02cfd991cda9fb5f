"""The evaluation protocol: what is prefilled, compressed, asked and decoded, for many configs of a sample.

kvpress compresses in a forward hook that runs *after* each attention layer, so the prefill is the same for
every press that only acts inside that hook (ScorerPress, its wrappers, codecs that return reconstructed
keys/values). We run it once and let every such config compress the full keys/values into its own cache
(`adapter.compress_for_each`); the question and the greedy decoding of all those configs then run as one
batch (`decoder.BatchedDecoder`). Protocols (a config's `protocol`):

- query-agnostic (default, kvpress's pipeline token for token): prefill the context, compress once, ask.
- decode-time: as query-agnostic, and the cache is compressed again every `interval` decoding steps back
  to the size the prefill left (kvpress's PrefillDecodingPress with a DecodingPress), in the same batch.
- streaming: the context arrives in chunks of `chunk` tokens and each config's cache is compressed back
  under its budget after each chunk (a DecodingPress whose steps are the chunks), then the question is
  asked. Every config's chunks are fed as one batch.

Presses that change the forward itself or mask heads through kvpress's attention patch fall back to a run
of their own that follows the pipeline's flow for that single config.
"""

import contextlib
import logging
from dataclasses import dataclass, field

import torch
from kvpress import BasePress
from kvpress.utils import compute_n_kept

from kvbench.adapter import (
    DynamicCache,
    attention_implementation,
    clear_head_masks,
    clock,
    compress_for_each,
    compresses_decoding,
    compresses_prefill,
    decoding_press,
    empty_batch,
    is_shareable,
    language_model,
    masked_entries,
    moves_positions,
    pad_caches,
    seed_press,
)
from kvbench.config import PROTOCOLS, Config
from kvbench.decoder import BatchedDecoder
from kvbench.errors import BadInput
from kvbench.presses import PRESSES, config_press, needs_eager
from kvbench.tasks.base import Sample
from kvbench.tasks.prompt import Prompt, tokenize_sample

logger = logging.getLogger(__name__)

BYTES_PER_VALUE = 2  # memory is counted as a 16-bit cache stores it, whatever dtype the run computes in


@dataclass
class Run:
    """One config's press, its compressed cache and its measurements within a sample."""

    config: Config
    press: BasePress | None
    needs_attentions: bool  # the press scores with attention weights
    cache: DynamicCache | None = field(default_factory=DynamicCache)
    compress_s: float = 0.0
    result: dict = field(default_factory=dict)


def evaluate_sample(
    model, tokenizer, sample: Sample, configs: list[Config], *, batch_configs: int = 16
) -> list[dict]:
    """Answer `sample` under every config; one dict per config, in order.

    Keys: prediction, context_tokens, kv_kept, kv_total (KV entries = tokens x layers x KV heads, after and
    before compression), kv_bytes, kv_bytes_full (what a 16-bit store of the compressed and of the full
    context cache holds, metadata included), prefill_s, decode_s. Times are amortised: a config's share of
    the shared prefill plus its own compression time, and its share of the batched decoding, so that they
    add up to the wall time over configs. Configs are processed `batch_configs` at a time to bound memory.
    """
    if batch_configs < 1:
        raise BadInput(f"batch_configs must be at least 1, got {batch_configs}")
    prompt = tokenize_sample(tokenizer, sample)
    # Each (sample, config) draws its own randomness: the same answer alone, in any sweep and on resume.
    runs = [
        Run(
            config,
            seed_press(config_press(config), f"{sample.task}/{sample.id}/{config!r}"),
            needs_eager(config.press, dict(config.press_args)),
        )
        for config in configs
    ]
    streaming = [run for run in runs if run.config.protocol == "streaming"]
    shared = [run for run in runs if run not in streaming and is_shareable(run.press)]
    alone = [run for run in runs if run not in streaming and not is_shareable(run.press)]
    with torch.no_grad():
        for group, process in ((shared, run_shared), (streaming, run_streaming)):
            for start in range(0, len(group), batch_configs):
                process(model, prompt, group[start : start + batch_configs], sample.max_new_tokens)
        log_fallback(alone)
        for run in alone:
            # As the pipeline on an eager model when the press needs attention weights.
            eager = run.needs_attentions
            with attention_implementation(model, "eager" if eager else model.config._attn_implementation):
                run_alone(model, prompt, run, sample.max_new_tokens)
    for run in runs:
        run.result["prediction"] = decode_prediction(tokenizer, run.result.pop("tokens"), sample)
    return [run.result for run in runs]


def check_protocol(config: Config) -> None:
    """Fail before any work if a protocol is unknown, lacks its arguments, or cannot run the press."""
    if config.protocol not in PROTOCOLS:
        raise BadInput(f"unknown protocol {config.protocol!r} (one of {', '.join(PROTOCOLS)})")
    args = dict(config.protocol_args)
    if sorted(args) != sorted(PROTOCOLS[config.protocol]):
        wanted = ", ".join(PROTOCOLS[config.protocol]) or "no arguments"
        raise BadInput(f"protocol {config.protocol!r} takes {wanted}, got {sorted(args) or 'none'}")
    for name, value in args.items():
        if not isinstance(value, int) or value < 1:
            raise BadInput(f"--{name} must be a whole number of at least 1, got {value}")
    if config.protocol != "query-agnostic":
        check_compresses_live(config)


def check_compresses_live(config: Config) -> None:
    """Fail before any work if the config's press cannot compress a cache as it grows (kvpress's
    DecodingPress around it), which every protocol but query-agnostic asks, live-cache perplexity too."""
    if config.press == "none":
        return
    press = config_press(config)
    if compresses_decoding(press) or not is_shareable(press):
        raise BadInput(
            f"press {config.press!r} cannot run under the {config.protocol} protocol: it changes the "
            "forward or compresses while decoding by itself; kvpress's DecodingPress takes scorers"
        )
    decoding_press(press, 1, 1)  # a press kvpress's DecodingPress does not take fails here


def prepare_press(press: BasePress | None, model, prompt: Prompt) -> None:
    """What a press learns before the prefill: the model, and the regions of context and question for those
    that ask (the question reaches the cache during decode-time compression)."""
    if press is None:
        return
    press.post_init_from_model(model)
    if hasattr(press, "use_regions") and prompt.regions is not None:
        press.use_regions(prompt.all_regions())


def log_fallback(runs: list[Run]) -> None:
    """Say once per press class that it runs alone (it costs a prefill per config)."""
    for name in sorted({type(run.press).__name__ for run in runs} - _logged_fallbacks):
        logger.info("%s cannot share the prefill of other presses: it runs alone", name)
        _logged_fallbacks.add(name)


_logged_fallbacks: set[str] = set()


def budget_entries(config: Config, context_length: int) -> int:
    """The entries per head a config's budget allows of `context_length` tokens: its absolute `budget`
    (at most the whole context); else int(L x (1 - ratio)) for an evictor, and for a codec its memory in
    16-bit entries (which a codec given a target ratio reads so)."""
    if config.budget is not None:
        return min(config.budget, context_length)
    codec = config.press in PRESSES and PRESSES[config.press].codec
    memory = config.memory if config.memory is not None else 1 - config.ratio
    return compute_n_kept(context_length, 1 - memory if codec else config.ratio)


def decode_time_press(run: Run, context_length: int):
    """The DecodingPress of a decode-time run (None for other protocols): the run's own press (its state
    from the prefill goes on), compressing every `interval` steps back to the budget."""
    if run.config.protocol != "decode-time" or run.press is None:
        return None
    interval = dict(run.config.protocol_args)["interval"]
    return decoding_press(run.press, interval, budget_entries(run.config, context_length))


def run_shared(model, prompt: Prompt, runs: list[Run], max_new_tokens: int) -> None:
    """One uncompressed prefill whose hooks fill every run's compressed cache, then one batched decoding."""
    for run in runs:
        prepare_press(run.press, model, prompt)
    start = clock(model)
    with compress_for_each(model, runs):
        language_model(model)(input_ids=prompt.context_ids.to(model.device), past_key_values=DynamicCache())
    forward_s = clock(model) - start - sum(run.compress_s for run in runs)
    context_length = prompt.context_ids.shape[1]
    for run in runs:
        run.result.update(kv_counts(model, prompt, cache_entries(run.cache), run.press))
        run.result["prefill_s"] = forward_s / len(runs) + run.compress_s

    # Longest caches first, so that the attention can skip the padding of rows of equal length together.
    runs = sorted(runs, key=lambda run: -max(layer.keys.shape[2] for layer in run.cache.layers))
    room = prompt.question_ids.shape[1] + max_new_tokens
    presses = {row: decode_time_press(run, context_length) for row, run in enumerate(runs)}
    cache, padding = pad_caches([run.cache for run in runs], room)
    for run in runs:
        run.cache = None  # the batch holds a copy; free the per-config caches
    start = clock(model)
    decoder = BatchedDecoder(model, cache, padding, presses, attention_rows(runs, presses))
    tokens = decoder.decode(prompt.question_ids, context_length, max_new_tokens)
    decode_s = (clock(model) - start) / len(runs)
    for run, run_tokens in zip(runs, tokens, strict=True):
        run.result.update(tokens=run_tokens, decode_s=decode_s)


def attention_rows(runs: list[Run], presses: dict) -> list[int]:
    return [row for row, run in enumerate(runs) if presses.get(row) is not None and run.needs_attentions]


def run_streaming(model, prompt: Prompt, runs: list[Run], max_new_tokens: int) -> None:
    """The context fed `chunk` tokens at a time to every run as one batch; after each chunk, each run's
    press compresses its cache back under its budget (the entries the query-agnostic protocol would keep of
    the whole context), then the question is asked and answered as one batch.

    The compression follows kvpress's DecodingPress with the chunks as its steps (interval 1, a buffer of
    the last chunk's hidden states). As DecodingPress skips the prefill, the first chunk is compressed
    together with the second: the cache never holds more than its budget plus one chunk.
    """
    context_length = prompt.context_ids.shape[1]
    chunk = dict(runs[0].config.protocol_args)["chunk"]
    presses = {}
    for row, run in enumerate(runs):
        prepare_press(run.press, model, prompt)
        if run.press is not None:
            target = budget_entries(run.config, context_length)
            presses[row] = decoding_press(run.press, interval=1, target_size=target, buffer_size=1)
    room = context_length + prompt.question_ids.shape[1] + max_new_tokens
    decoder = BatchedDecoder(
        model, empty_batch(model, len(runs), room), None, presses, attention_rows(runs, presses)
    )
    start = clock(model)
    with decoder.attending():
        for position in range(0, context_length, chunk):
            decoder.feed(prompt.context_ids[:, position : position + chunk], position, logits_to_keep=1)
    prefill_s = (clock(model) - start) / len(runs)
    kept = decoder.real_entries().sum(0) * model.config.get_text_config().num_key_value_heads
    for row, run in enumerate(runs):
        run.result.update(kv_counts(model, prompt, (int(kept[row]), None), run.press), prefill_s=prefill_s)
    decoder.presses = {}  # the question and the answer are not compressed
    start = clock(model)
    tokens = decoder.decode(prompt.question_ids, context_length, max_new_tokens)
    decode_s = (clock(model) - start) / len(runs)
    for run, run_tokens in zip(runs, tokens, strict=True):
        run.result.update(tokens=run_tokens, decode_s=decode_s)


def run_alone(model, prompt: Prompt, run: Run, max_new_tokens: int) -> None:
    """The pipeline's flow for one config whose press cannot share the prefill (query-agnostic only:
    `check_protocol` keeps such presses out of the other protocols)."""
    press = run.press
    prepare_press(press, model, prompt)
    context_length = prompt.context_ids.shape[1]
    cache = DynamicCache()
    try:
        start = clock(model)
        with press(model) if compresses_prefill(press) else contextlib.nullcontext():
            language_model(model)(input_ids=prompt.context_ids.to(model.device), past_key_values=cache)
        run.result["prefill_s"] = clock(model) - start
        run.result.update(kv_counts(model, prompt, cache_entries(cache, masked_entries(model)), run.press))
        if moves_positions(press):
            context_length = cache.get_seq_length()
        start = clock(model)
        with press(model) if compresses_decoding(press) else contextlib.nullcontext():
            decoder = BatchedDecoder(model, cache, attention=None)
            (tokens,) = decoder.decode(prompt.question_ids, context_length, max_new_tokens)
        run.result.update(tokens=tokens, decode_s=clock(model) - start)
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


def kv_counts(model, prompt: Prompt, held: tuple[int, int | None], press: BasePress | None) -> dict:
    """Entries and bytes of the compressed context cache, against the full one. `held` is (entries,
    values) or (entries, None) for full-width entries. A codec press reports its own bytes (`layer_bytes`:
    codes, scales, bases, indices); everyone else stores its kept entries at 16 bits."""
    config = model.config.get_text_config()
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    entries, values = held
    values = entries * 2 * head_dim if values is None else values
    context_tokens = prompt.context_ids.shape[1]
    kv_total = context_tokens * config.num_hidden_layers * config.num_key_value_heads
    layer_bytes = getattr(press, "layer_bytes", None)
    return {
        "context_tokens": context_tokens,
        "kv_kept": entries,
        "kv_total": kv_total,
        "kv_bytes": sum(layer_bytes.values()) if layer_bytes else values * BYTES_PER_VALUE,
        "kv_bytes_full": kv_total * 2 * head_dim * BYTES_PER_VALUE,
    }


def decode_prediction(tokenizer, tokens: list[int], sample: Sample) -> str:
    prediction = tokenizer.decode(tokens, skip_special_tokens=True)
    if sample.first_line:
        prediction = prediction.lstrip("\n").split("\n")[0]
    return prediction
