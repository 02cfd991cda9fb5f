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
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch
from kvpress import BasePress, SnapKVPress
from kvpress.utils import compute_n_kept

from kvbench.bridge.adapter import (
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
    layer_holding,
    masked_entries,
    moves_positions,
    pad_caches,
    seed_press,
    stop_token_ids,
)
from kvbench.core.config import PROTOCOLS, Config, protocol_of
from kvbench.core.errors import BadInput
from kvbench.engine.decoder import BatchedDecoder
from kvbench.presses import PRESSES, config_press, needs_eager
from kvbench.tasks.base import Sample
from kvbench.tasks.prompt import Prompt, tokenize_sample

logger = logging.getLogger(__name__)

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


def evaluate_sample(
    model, tokenizer, sample: Sample, configs: list[Config], *, batch_configs: int = 16
) -> list[dict]:
    """Answer `sample` under every config; one dict per config and question (config by config, each
    config's questions in order: one question but under the multi-question protocols).

    Keys: prediction, context_tokens, kv_kept, kv_total (KV entries = tokens x layers x KV heads, after and
    before compression), kv_bytes, kv_bytes_full (what a 16-bit store of the compressed and of the full
    context cache holds, metadata included), prefill_s, decode_s. Times are amortised: a config's share of
    the shared prefill plus its own compression time, and its share of the batched decoding, so that they
    add up to the wall time over configs. Configs are processed `batch_configs` at a time to bound memory.
    Under multi-turn, a turn's context_tokens and kv counts are those of the cache its question is asked
    of (the context and the turns before, compressed).
    """
    if batch_configs < 1:
        raise BadInput(f"batch_configs must be at least 1, got {batch_configs}")
    prompts = {}
    for config in configs:
        aware = protocol_of(config).question_prefilled
        if aware not in prompts:
            prompts[aware] = tokenize_sample(tokenizer, sample, query_aware=aware)
    runs = []
    for config in configs:
        prompt = prompts[protocol_of(config).question_prefilled]
        sized = sized_config(config, prompt.context_ids.shape[1])
        # Each (sample, config) draws its own randomness: the same answer alone, in any sweep and on resume.
        press = seed_press(config_press(sized), f"{sample.task}/{sample.id}/{config!r}")
        runs.append(Run(sized, press, needs_eager(config.press, dict(config.press_args)), prompt))
    streaming = [run for run in runs if protocol_of(run.config).context_streamed]
    shared = [run for run in runs if run not in streaming and is_shareable(run.press)]
    alone = [run for run in runs if run not in streaming and not is_shareable(run.press)]
    # Runs that prefill the same prompt and answer the same way share a prefill and a batched decoding.
    groups: dict[tuple, list[Run]] = {}
    for run in shared:
        answering = run.config.protocol if protocol_of(run.config).several_questions else "one"
        groups.setdefault((id(run.prompt), answering), []).append(run)
    with torch.no_grad():
        for group in [*groups.values(), streaming]:
            for start in range(0, len(group), batch_configs):
                batch = group[start : start + batch_configs]
                if group is streaming:
                    run_streaming(model, batch, sample.max_new_tokens)
                else:
                    run_shared(model, batch, sample.max_new_tokens, sample.questions())
        log_fallback(alone)
        for run in alone:
            # As the pipeline on an eager model when the press needs attention weights.
            eager = run.needs_attentions
            with attention_implementation(model, "eager" if eager else model.config._attn_implementation):
                run_alone(model, run, sample.max_new_tokens)
    results = []
    for run in runs:
        asked = sample.questions() if protocol_of(run.config).several_questions else [sample]
        for answer, part in zip(run.answers, asked, strict=True):
            prediction = decode_prediction(tokenizer, answer.pop("tokens"), part)
            results.append({**run.result, **answer, "prediction": prediction})
    return results


def sized_config(config: Config, context_length: int) -> Config:
    """The config with the ratio its absolute budget gives for this context: exactly `budget` entries kept
    per head (kvpress's compute_n_kept of the ratio), none removed when the context is not longer."""
    if config.budget is None:
        return config
    if config.budget >= context_length:
        return replace(config, ratio=0.0)
    ratio = (context_length - config.budget) / context_length
    # (L - N) / L in floating point can keep N - 1 or N + 1 entries: step to the next float until it keeps N.
    while compute_n_kept(context_length, ratio) < config.budget:
        ratio = math.nextafter(ratio, 0.0)
    while compute_n_kept(context_length, ratio) > config.budget:
        ratio = math.nextafter(ratio, 1.0)
    return replace(config, ratio=ratio)


def check_protocol(config: Config) -> None:
    """Fail before any work if a protocol is unknown, lacks its arguments, or cannot run the press."""
    if config.protocol not in PROTOCOLS:
        raise BadInput(f"unknown protocol {config.protocol!r} (one of {', '.join(PROTOCOLS)})")
    args = dict(config.protocol_args)
    if sorted(args) != sorted(PROTOCOLS[config.protocol].arguments):
        wanted = ", ".join(PROTOCOLS[config.protocol].arguments) or "no arguments"
        raise BadInput(f"protocol {config.protocol!r} takes {wanted}, got {sorted(args) or 'none'}")
    for name, value in args.items():
        if not isinstance(value, int) or value < 1:
            raise BadInput(f"--{name} must be a whole number of at least 1, got {value}")
    if config.budget is not None and config.press in PRESSES and PRESSES[config.press].codec:
        raise BadInput(
            f"press {config.press!r} is a codec: it stores every entry in fewer bits, so it takes --memory, "
            "not an absolute --budget of kept entries"
        )
    if protocol_of(config).several_questions or protocol_of(config).compresses_again:
        check_compresses_live(config)


def check_compresses_live(config: Config) -> None:
    """Fail before any work if the config's press cannot compress a cache as it grows (kvpress's
    DecodingPress around it), which every protocol but query-agnostic and query-aware asks (multi-question
    only shares the prefill), live-cache perplexity too (its configs' protocol is none of the engine's)."""
    if config.press == "none":
        return
    again = config.protocol not in PROTOCOLS or protocol_of(config).compresses_again
    press = config_press(config)
    if compresses_decoding(press) or not is_shareable(press):
        raise BadInput(
            f"press {config.press!r} cannot run under the {config.protocol} protocol: it changes the "
            "forward or compresses while decoding by itself"
            + ("; kvpress's DecodingPress takes scorers" if again else "")
        )
    if again:
        if config.press in PRESSES and PRESSES[config.press].prefill_only:
            raise BadInput(
                f"press {config.press!r} scores a whole prefill only (kvpress asserts it): it cannot "
                f"compress the cache again under the {config.protocol} protocol"
            )
        decoding_press(press, 1, 1)  # a press kvpress's DecodingPress does not take fails here
        check_query_window(config, press)


# A turn's feed holds at least its question; 8 tokens is what the shortest questions of kvbench's tasks hold.
SHORTEST_TURN = 8


def check_query_window(config: Config, press: BasePress) -> None:
    """SnapKV (and its kin) scores with its last `window_size` queries and asserts it has more: after the
    prefill it sees only the tokens of one compression step (decode-time: `interval` tokens; streaming: a
    chunk; multi-turn: a turn). Fail before any work where the step is too short for the window."""
    windows = [p.window_size for p in pressed_tree(press) if isinstance(p, SnapKVPress)]
    if not windows:
        return
    turns = config.protocol in PROTOCOLS and protocol_of(config).answers_stay
    steps = {"turns": SHORTEST_TURN} if turns else dict(config.protocol_args)
    name = next(iter(steps))
    if max(windows) >= steps[name]:
        raise BadInput(
            f"press {config.press!r} scores with its last {max(windows)} queries, but a {config.protocol} "
            f"step feeds {'as few as ' if name == 'turns' else ''}{steps[name]} tokens: give --press-arg "
            f"window_size=N with N below {steps[name]}"
            + ("" if name == "turns" else f", or a larger --{name}")
        )


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
    if not protocol_of(run.config).compresses_decoding or run.press is None:
        return None
    interval = dict(run.config.protocol_args)["interval"]
    return decoding_press(run.press, interval, budget_entries(run.config, context_length))


def run_shared(model, runs: list[Run], max_new_tokens: int, questions: Sequence[Sample] = ()) -> None:
    """One uncompressed prefill (of the runs' common prompt) whose hooks fill every run's compressed cache,
    then the question, or each of `questions` under the multi-question protocols, decoded for every run as
    one batch."""
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
    protocol = protocol_of(runs[0].config)
    if protocol.answers_stay:
        answer_turns(model, questions, runs)
    elif protocol.several_questions:
        answer_questions(model, questions, runs)
    else:
        answer_question(model, runs, max_new_tokens)


def longest_first(runs: list[Run]) -> list[Run]:
    """Longest caches first, so that the attention can skip the padding of rows of equal length together."""
    return sorted(runs, key=lambda run: -max(layer.keys.shape[2] for layer in run.cache.layers))


def answer_question(model, runs: list[Run], max_new_tokens: int) -> None:
    """The question fed on top of every run's compressed cache and the answers decoded as one batch (rows
    of decode-time runs compressing every `interval` steps)."""
    prompt = runs[0].prompt
    context_length = prompt.context_ids.shape[1]
    runs = longest_first(runs)
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
        run.answers.append({"tokens": run_tokens, "decode_s": decode_s})


def answer_questions(model, questions: list[Sample], runs: list[Run]) -> None:
    """Compress once, answer many (kvpress's pipeline given a list of questions): each question fed on top
    of every run's compressed cache and answered as one batch, from a copy, so that no answer stays in the
    cache of the next question."""
    prompt = runs[0].prompt
    context_length = prompt.context_ids.shape[1]
    runs = longest_first(runs)
    for question_ids, part in zip(prompt.part_question_ids, questions, strict=True):
        cache, padding = pad_caches([run.cache for run in runs], question_ids.shape[1] + part.max_new_tokens)
        start = clock(model)
        tokens = BatchedDecoder(model, cache, padding).decode(
            question_ids, context_length, part.max_new_tokens
        )
        decode_s = (clock(model) - start) / len(runs)
        for run, run_tokens in zip(runs, tokens, strict=True):
            run.answers.append({"tokens": run_tokens, "decode_s": decode_s})
    for run in runs:
        run.cache = None


def answer_turns(model, questions: list[Sample], runs: list[Run]) -> None:
    """The multi-turn protocol: each turn's question is answered on top of every run's cache as one batch
    (each row at its own position: earlier answers differ in length); then each run's turn (its question,
    its answer and the template's end of turn) is fed on top of its own cache, and its press, as kvpress's
    DecodingPress at that step, compresses the whole cache back to its budget of every token seen so far
    (`budget_entries`), scoring with that turn's tokens as its queries. A stateful press keeps its state
    across turns. The last turn is not fed back: nothing asks after it.

    A stop token that ends an answer is not fed back: the template's end of turn (`Prompt.turn_close_ids`)
    opens with its own."""
    prompt = runs[0].prompt
    seen = {id(run): prompt.context_ids.shape[1] for run in runs}  # tokens each run's cache has seen
    stop_ids = set(stop_token_ids(model))
    for turn, (question_ids, part) in enumerate(zip(prompt.part_question_ids, questions, strict=True)):
        order = longest_first(runs)
        for run in order:
            counts = kv_counts(model, seen[id(run)], cache_entries(run.cache), run.press)
            run.answers.append(counts)
        cache, padding = pad_caches([run.cache for run in order], question_ids.shape[1] + part.max_new_tokens)
        positions = torch.tensor([seen[id(run)] for run in order], device=model.device)
        start = clock(model)
        tokens = BatchedDecoder(model, cache, padding).decode(question_ids, positions, part.max_new_tokens)
        decode_s = (clock(model) - start) / len(order)
        del cache
        for run, run_tokens in zip(order, tokens, strict=True):
            run.answers[-1].update(tokens=run_tokens, decode_s=decode_s)
        if turn == len(questions) - 1:
            break
        for run, run_tokens in zip(order, tokens, strict=True):
            answer = run_tokens[:-1] if run_tokens and run_tokens[-1] in stop_ids else run_tokens
            fed = torch.cat(
                [question_ids, torch.tensor([answer], dtype=torch.long), prompt.turn_close_ids], 1
            )
            start = clock(model)
            run.cache = close_turn(model, run, fed, seen[id(run)])
            run.answers[-1]["decode_s"] += clock(model) - start
            seen[id(run)] += fed.shape[1]
    for run in runs:
        run.cache = None


def close_turn(model, run: Run, fed: torch.Tensor, position: int) -> DynamicCache:
    """`run`'s cache with `fed` on top, from `position` on, compressed back to the run's budget of every
    token it has seen by its press (kvpress DecodingPress semantics: one step, `fed`'s hidden states as the
    press's queries); uncompressed for `none`."""
    target = budget_entries(run.config, position + fed.shape[1])
    presses = {0: decoding_press(run.press, 1, target)} if run.press is not None else {}
    cache, _ = pad_caches([run.cache], fed.shape[1])
    decoder = BatchedDecoder(model, cache, None, presses, [0] if presses and run.needs_attentions else [])
    decoder.feed(fed, position, logits_to_keep=1)
    held = decoder.real_entries()[:, 0].tolist()
    kept = DynamicCache()
    for layer, real in zip(cache.layers, held, strict=True):  # the real entries are right-aligned
        length = layer.keys.shape[2]
        kept.layers.append(
            layer_holding(layer.keys[:, :, length - real :], layer.values[:, :, length - real :])
        )
    return kept


def attention_rows(runs: list[Run], presses: dict) -> list[int]:
    return [row for row, run in enumerate(runs) if presses.get(row) is not None and run.needs_attentions]


def run_streaming(model, runs: list[Run], max_new_tokens: int) -> None:
    """The context fed `chunk` tokens at a time to every run as one batch; after each chunk, each run's
    press compresses its cache back under its budget (the entries the query-agnostic protocol would keep of
    the whole context), then the question is asked and answered as one batch.

    The compression follows kvpress's DecodingPress with the chunks as its steps (interval 1, a buffer of
    the last chunk's hidden states). As DecodingPress skips the prefill, the first chunk is compressed
    together with the second: the cache never holds more than its budget plus one chunk.
    """
    prompt = runs[0].prompt
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
        counts = kv_counts(model, context_length, (int(kept[row]), None), run.press)
        run.result.update(counts, prefill_s=prefill_s)
    decoder.presses = {}  # the question and the answer are not compressed
    start = clock(model)
    tokens = decoder.decode(prompt.question_ids, context_length, max_new_tokens)
    decode_s = (clock(model) - start) / len(runs)
    for run, run_tokens in zip(runs, tokens, strict=True):
        run.answers.append({"tokens": run_tokens, "decode_s": decode_s})


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
