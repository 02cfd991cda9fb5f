"""The conformance kit: a fixed battery of checks that says whether a press does what it claims.

`check_press(press, press_args)` runs the press on tiny random-init float64 models built from configs (a
Llama-shaped one with grouped KV heads, a Qwen2-shaped one with as many KV heads as query heads) and, unless
`quick`, on a loaded model (the embedded one by default), and returns one `Check` per check:

1. budget kept: at ratios 0, 0.1, 0.5, 0.9 and absolute budgets, the entries held per head are
   kvpress's n_kept (`compute_n_kept`): exactly, in every layer and head, for a press whose cache keeps one
   length per layer; in total per layer for a press that masks heads (kvpress's head-wise masks); in total
   over layers for one whose layers differ. No head is ever empty, and contexts of 1, 2 and window-size
   tokens neither crash nor empty the cache (a press may refuse them with an assertion of its own). A
   kvpress ScorerPress's scores are finite, there and at every budget, and at ratio 0.5 each head keeps
   entries scored at least as high as every entry it drops (the top of its scores, ties aside).
2. memory freed: the cache's tensors allocate what its `kv_bytes` accounts (in the model's dtype); a press
   that masks heads frees nothing by design and is reported so (n/a), with its bytes.
3. cache order: kept entries stay in position order when kvbench compresses a cache again (decode-time,
   streaming, multi-turn), as read by matching kept keys to the uncompressed prefill's keys.
4. determinism: two runs with one seed (kvbench's `seed_press`) keep identical caches.
5. protocol isolation: under query-agnostic, the compressed cache does not change with the question.
6. shared prefill: kvbench's engine answers as kvpress's pipeline does, token for token.
7. protocols: decode-time, streaming, multi-turn and query-aware each run where `engine.check_protocol`
   admits the press, and their rows hold the budget's entries.
8. cost: prefill time against no compression and against knorm, side by side (the fastest of 3 repeats;
   a difference smaller than the spread of the repeats is said to be within their noise), and the cache's
   allocated bytes (peak allocated bytes on CUDA); informational: it fails only if the press crashes.

A check fails on the first model where it fails; an exception inside a check is its failure. Evidence names
the model, layer, head, context or ratio, and what was expected against what was observed.
"""

import contextlib
import dataclasses
import functools
import random
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvbench.core.config import PROTOCOLS, Config
from kvbench.core.press_hooks import declared
from kvbench.presses import PRESSES, ResolvedPress, build_press, config_press, resolve, resolve_press
from kvbench.store.conformance import ConformanceRecord

CHECKS = (
    "budget kept",
    "memory freed",
    "cache order",
    "determinism",
    "protocol isolation",
    "shared prefill",
    "protocols",
    "cost",
)
VERDICTS = ("pass", "fail", "n/a")
RATIOS = (0.0, 0.1, 0.5, 0.9)
BUDGETS = (1, 16)
RATIO = 0.5  # the ratio of every check but the budget's
CONTEXT_WORDS = 96  # the tiny models' context: longer than SnapKV's default window of 64 queries
COST_TOKENS = 512
COST_REPEATS = 3  # interleaved, the fastest counts
MAX_NEW_TOKENS = 8
# Protocol arguments sized for the tiny context (each protocol's default is made for long ones).
LIVE_PROTOCOLS = {"decode-time": 16, "streaming": 32, "multi-turn": 2, "query-aware": None}


@dataclass(frozen=True)
class Check:
    """One check's outcome: `verdict` is "pass", "fail" or "n/a"; `evidence` says what was seen (for a
    failure: where, expected against observed; for n/a: why the check does not apply)."""

    name: str
    verdict: str
    evidence: str


@dataclass
class Subject:
    """A model the checks run on: its name in evidence, the model, its tokenizer, and the words its
    contexts are drawn from."""

    name: str
    model: Any  # a transformers causal LM
    tokenizer: Any
    words: list[str]

    def context(self, words: int = CONTEXT_WORDS, seed: int = 0) -> str:
        return " ".join(random.Random(seed).choices(self.words, k=words))

    def sample(self, question: str | None = None, **changes):
        from kvbench.tasks.base import Sample

        question = question or " ".join(self.words[1:4])
        fields = dict(max_new_tokens=MAX_NEW_TOKENS, metric="string_match_all")
        fields.update(changes)
        return Sample("conformance", "0", self.context(), question, self.words[5], [self.words[4]], **fields)

    def context_ids(self, tokens: int | None = None):
        """The context's ids (without a template), or `tokens` of them, repeated as needed."""
        ids = self.tokenizer(self.context(), add_special_tokens=False, return_tensors="pt").input_ids
        tokens = tokens or ids.shape[1]
        return ids.repeat(1, -(-tokens // ids.shape[1]))[:, :tokens].to(self.model.device)

    @property
    def shape(self) -> tuple[int, int]:
        config = self.model.config.get_text_config()
        return config.num_hidden_layers, config.num_key_value_heads


@dataclass
class Target:
    """The press under check: its registry name and arguments, how a config of it at a ratio is built."""

    name: str
    args: tuple

    @functools.cached_property
    def resolved(self) -> ResolvedPress:
        return resolve(self.name, self.args)

    def config(self, ratio: float, **changes) -> Config:
        """A config of the press at `ratio`: a codec at memory 1 - ratio, a press set by a knob of its own
        at ratio 0 (its knob among the arguments)."""
        press = self.resolved
        if press.spec.codec:
            return Config(self.name, 0.0, self.args, memory=1 - ratio, resolved=press, **changes)
        return Config(self.name, 0.0 if press.spec.knob else ratio, self.args, resolved=press, **changes)

    def press(self, ratio: float = RATIO):
        return config_press(self.config(ratio))

    @property
    def eager(self) -> bool:
        return self.resolved.needs_eager


class NotApplicable(Exception):
    """A check that does not apply to this press (or on this model): the message says why."""


# ---------------------------------------------------------------------------------------------- models


@functools.cache
def tiny_subjects() -> list[Subject]:
    """Two tiny random-init float64 models (seed 0) with trial_model's word-level tokenizer: Llama-shaped
    with 4 query heads over 2 KV heads, Qwen2-shaped with 4 over 4; 2 layers of 16-dim heads (enough
    dimensions for kvpress's head-wise masks to find their fake keys)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from kvbench.bridge.adapter import seed_generators
    from kvbench.harness.planning import TRIAL_WORDS, trial_model

    _, tokenizer = trial_model()
    subjects = []
    for name, build, kv_heads in (
        (TINY[0], lambda shape: LlamaForCausalLM(LlamaConfig(**shape)), 2),
        (TINY[1], lambda shape: Qwen2ForCausalLM(Qwen2Config(**shape)), 4),
    ):
        shape = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)
        shape.update(num_key_value_heads=kv_heads, head_dim=16, vocab_size=len(tokenizer), eos_token_id=2)
        shape.update(max_position_embeddings=4096, initializer_range=0.1, attn_implementation="sdpa")
        with torch.random.fork_rng():
            seed_generators(0)
            model = build(shape).to(torch.float64).eval()
        subjects.append(Subject(name, model, tokenizer, list(TRIAL_WORDS)))
    return subjects


def loaded_subject(name: str) -> Subject:
    from kvbench.bridge.models import load_model

    model, tokenizer = load_model(name)
    words = "red green blue cat dog bird one two three north south east west river hill stone".split()
    return Subject(name, model, tokenizer, words)


# ------------------------------------------------------------------------------------------ prefills


@dataclass
class Compressed:
    """A context prefilled under a press: the cache, and per layer which entries each head holds
    ((heads, entries) booleans: False where kvpress's head-wise masks hide an entry)."""

    cache: Any  # a transformers DynamicCache
    held: list
    masks: bool  # the press masked entries instead of removing them

    def counts(self) -> list[list[int]]:
        return [layer.sum(-1).tolist() for layer in self.held]


def prefill(subject: Subject, target: Target, press, ids, prompt=None) -> Compressed:
    """`ids` prefilled into a new cache under `press` (None: uncompressed) as kvpress applies it, the press
    first given the model (and the prompt's regions, as the engine does)."""
    import torch

    from kvbench.bridge.adapter import (
        DynamicCache,
        attention_implementation,
        clear_head_masks,
        compresses_prefill,
        language_model,
    )
    from kvbench.engine.steps import prepare_press
    from kvbench.tasks.prompt import Prompt

    model = subject.model
    cache = DynamicCache()
    implementation = "eager" if target.eager else model.config._attn_implementation  # the reference's too
    try:
        with torch.no_grad(), attention_implementation(model, implementation):
            prepare_press(press, model, prompt or Prompt(ids, ids[:, :0]))
            with press(model) if compresses_prefill(press) else contextlib.nullcontext():
                language_model(model)(input_ids=ids, past_key_values=cache)
        held, masks = [], False
        attentions = [layer.self_attn for layer in language_model(model).layers]
        for layer, attention in zip(cache.layers, attentions, strict=True):
            shown = torch.ones(layer.keys.shape[1:3], dtype=torch.bool)
            indices = getattr(attention, "masked_key_indices", None)
            if indices is not None:
                shown[indices[1].cpu(), indices[2].cpu()] = False
                masks = True
            held.append(shown)
    finally:
        clear_head_masks(model)
    return Compressed(cache, held, masks)


def kept_positions(compressed: Compressed, full: Compressed) -> list[list[list[int]]] | None:
    """Per layer and head, the context positions of the entries held, in cache order, found by matching
    each kept key to the uncompressed prefill's keys; None when a kept key matches none (the press rewrites
    keys: merges, re-rotates, quantises)."""
    import torch

    positions = []
    layers = zip(compressed.cache.layers, full.cache.layers, compressed.held, strict=True)
    for layer, reference, held in layers:
        keys, original = layer.keys[0], reference.keys[0]
        if keys.shape[-1] != original.shape[-1] or keys.shape[0] != original.shape[0]:
            return None
        distance, index = torch.cdist(
            keys.double(), original.double(), compute_mode="donot_use_mm_for_euclid_dist"
        ).min(-1)
        if keys.shape[1] and bool((distance > 1e-9 * (1 + original.abs().max())).any()):
            return None
        positions.append([index[head][held[head]].tolist() for head in range(keys.shape[0])])
    return positions


def same_cache(first: Compressed, second: Compressed) -> str:
    """ "" when two compressed caches hold the same entries; else where they first differ."""
    import torch

    for number, (a, b, held_a, held_b) in enumerate(
        zip(first.cache.layers, second.cache.layers, first.held, second.held, strict=True)
    ):
        if a.keys.shape != b.keys.shape:
            return f"layer {number} holds {a.keys.shape[2]} entries, then {b.keys.shape[2]}"
        for head in range(a.keys.shape[1]):
            equal = torch.equal(a.keys[0, head], b.keys[0, head]) and torch.equal(
                a.values[0, head], b.values[0, head]
            )
            if not equal or not torch.equal(held_a[head], held_b[head]):
                return f"layer {number} head {head} keeps different entries"
    return ""


def short_window(press) -> int:
    """The largest `window_size` of the press or a press it wraps (0 if none)."""
    from kvbench.engine.steps import pressed_tree

    return max([getattr(p, "window_size", 0) or 0 for p in pressed_tree(press)] + [0])


def kind_of(target: Target, press) -> str:
    """What the press's budget promises, read from what it is: "codec" (every entry at fewer bits),
    "decoding" (compresses while decoding only), "channels" (prunes key channels, not entries) or
    "evictor"."""
    from kvpress import DecodingPress, ThinKPress

    if target.resolved.spec.codec or declared(press, "shares_prefill", False):
        return "codec"
    if isinstance(press, DecodingPress):
        return "decoding"
    if isinstance(press, ThinKPress):
        return "channels"
    return "evictor"


# -------------------------------------------------------------------------------------------- checks


def check_budget(subject: Subject, target: Target) -> str:
    press = target.press()
    kind = kind_of(target, press)
    if kind != "evictor":
        raise NotApplicable(f"a {kind} press: its budget is not entries kept at the prefill")
    layers, heads = subject.shape
    ids = subject.context_ids()
    length = ids.shape[1]
    spec = target.resolved.spec
    from kvpress import ScorerPress
    from kvpress.utils import compute_n_kept

    from kvbench.engine import sized_config

    budgets = []  # (label, config, entries promised per head)
    if spec.knob:
        budgets.append((f"{spec.knob} as given", target.config(0.0), None))
    else:
        budgets += [(f"ratio {r:g}", target.config(r), compute_n_kept(length, r)) for r in RATIOS]
        for budget in BUDGETS:
            config = sized_config(dataclasses.replace(target.config(0.0), budget=budget), length)
            budgets.append((f"budget {budget}", dataclasses.replace(config, budget=None), budget))
    seen, followed = [], ""
    for label, config, promised in budgets:
        budgeted = config_press(config)
        recorded = recording_scores(budgeted)
        compressed = prefill(subject, target, budgeted, ids)
        counts = compressed.counts()
        where = f"{label} of {length} tokens"
        unfinite = not_finite(recorded)
        if unfinite:
            raise AssertionError(f"{where}: {unfinite}")
        if config == target.config(RATIO) and isinstance(budgeted, ScorerPress) and not compressed.masks:
            full = prefill(subject, target, None, ids)
            own = [entry for entry in recorded if entry[0] is budgeted]
            followed = scores_followed(compressed, full, own, where)
        empty = [
            (layer, head) for layer in range(layers) for head in range(heads) if counts[layer][head] == 0
        ]
        if empty:
            raise AssertionError(f"{where}: layer {empty[0][0]} head {empty[0][1]} holds no entry")
        if promised is None:
            seen.append(f"{label}: {sum(map(sum, counts))} entries (set by its knob)")
            continue
        lengths = {layer.keys.shape[2] for layer in compressed.cache.layers}
        if compressed.masks:  # head-wise: each layer's total
            totals = [sum(layer) for layer in counts]
            wrong = [(n, total) for n, total in enumerate(totals) if total != promised * heads]
            if wrong:
                raise AssertionError(
                    f"{where}: layer {wrong[0][0]} holds {wrong[0][1]} entries over its {heads} heads, "
                    f"expected {promised * heads} ({promised} a head, in total)"
                )
            seen.append(f"{label}: {promised}/head in total (head-wise masks)")
        elif len(lengths) > 1:  # one length per layer: the total over layers
            total = sum(map(sum, counts))
            if total != promised * heads * layers:
                raise AssertionError(
                    f"{where}: {total} entries over layers of {sorted(lengths)}, expected "
                    f"{promised * heads * layers} ({promised} a head, in total)"
                )
            seen.append(f"{label}: {promised}/head in total (per-layer budgets)")
        else:
            for layer in range(layers):
                for head in range(heads):
                    if counts[layer][head] != promised:
                        raise AssertionError(
                            f"{where}: layer {layer} head {head} holds {counts[layer][head]} entries, "
                            f"expected {promised} (kvpress's n_kept)"
                        )
            seen.append(f"{label}: {promised}/head (exact per head)")
    shorts = short_contexts(subject, target, press)
    kinds = sorted({entry.partition("(")[2].rstrip(")") or "one length a layer" for entry in seen})
    asked = ", ".join(label for label, _, _ in budgets)
    promise = f"{asked} of {length} tokens: as promised ({', '.join(kinds)})"
    return "; ".join(filter(None, [promise, followed, f"short contexts: {shorts}"]))


def short_contexts(subject: Subject, target: Target, press) -> str:
    """Contexts of 1, 2 and window-size tokens (and one more) at ratio 0.9: each compresses to at least one
    entry a head, or is refused by a check of the press's own (an assertion, a ValueError or kvbench's
    BadInput, with a message); a crash or an emptied head fails."""
    from kvbench.core.errors import KvbenchError

    window = short_window(press)
    lengths = sorted({1, 2, *((window, window + 1) if window else ())})
    compressed_at, refused = [], {}
    for length in lengths:
        short = target.press(0.9)
        recorded = recording_scores(short)
        try:
            compressed = prefill(subject, target, short, subject.context_ids(length))
        except (AssertionError, ValueError, KvbenchError) as error:
            if not str(error):
                raise AssertionError(f"a {length}-token context: refused without a message") from None
            refused.setdefault(str(error).splitlines()[0][:80], []).append(str(length))
            continue
        except Exception as error:
            raise AssertionError(
                f"a {length}-token context crashes: {type(error).__name__}: {error}"
            ) from None
        unfinite = not_finite(recorded)
        if unfinite:
            raise AssertionError(f"a {length}-token context at ratio 0.9: {unfinite}")
        if min(min(layer) for layer in compressed.counts()) == 0:
            raise AssertionError(f"a {length}-token context at ratio 0.9 leaves a head empty")
        compressed_at.append(str(length))
    said = [f"{', '.join(at)} tokens refused by the press ({reason})" for reason, at in refused.items()]
    return "; ".join(([f"{', '.join(compressed_at)} tokens compress"] if compressed_at else []) + said)


def recording_scores(press) -> list[tuple[Any, int | None, Any]]:
    """A list that gets (scorer, layer, scores) for each call of `score`, from now on, of every kvpress
    ScorerPress in `press`'s tree."""
    from kvpress import ScorerPress

    from kvbench.engine.steps import pressed_tree

    recorded = []
    for scorer in pressed_tree(press):
        if not isinstance(scorer, ScorerPress):
            continue

        def recording(module, *args, scorer=scorer, score=scorer.score, **kwargs):
            scores = score(module, *args, **kwargs)
            recorded.append((scorer, getattr(module, "layer_idx", None), scores))
            return scores

        scorer.score = recording  # shadows the method on this press
    return recorded


def not_finite(recorded: list) -> str:
    """ "" when every recorded score is finite; else which layer's are not, and how."""
    import torch

    for _, layer, scores in recorded:
        if isinstance(scores, torch.Tensor) and not bool(torch.isfinite(scores).all()):
            how = "NaN" if bool(torch.isnan(scores).any()) else "inf"
            return f"scores not finite ({how}) at layer {layer}"
    return ""


def scores_followed(compressed: Compressed, full: Compressed, recorded: list, where: str) -> str:
    """What was read of whether each head kept entries its press scored at least as high as every entry it
    dropped (the top of its scores, ties aside): "" where it cannot be read (keys rewritten, each layer
    scored more than once or in another shape). AssertionError at the first head that does not."""
    import torch

    positions = kept_positions(compressed, full)
    if positions is None:
        return ""
    read = 0
    for layer, heads in enumerate(positions):
        scored = [scores for _, number, scores in recorded if number == layer]
        length = full.cache.layers[layer].keys.shape[2]
        if len(scored) != 1 or tuple(scored[0].shape[1:]) != (len(heads), length):
            continue
        read += 1
        for head, kept in enumerate(heads):
            chosen = torch.zeros(length, dtype=torch.bool)
            chosen[kept] = True
            if chosen.all() or not chosen.any():
                continue
            scores = scored[0][0, head].cpu()
            lowest, highest = scores[chosen].min(), scores[~chosen].max()
            if lowest < highest:
                raise AssertionError(
                    f"{where}: layer {layer} head {head} keeps an entry it scored {float(lowest):.3g} and "
                    f"drops one scored {float(highest):.3g} (expected the top {len(kept)} of its scores)"
                )
    return "each head keeps the top of its scores" if read else ""


def check_memory(subject: Subject, target: Target) -> str:
    from kvbench.bridge.adapter import masked_entries  # noqa: F401 (the engine's accounting below reads masks)
    from kvbench.diagnostics.speed import allocated_bytes
    from kvbench.engine.steps import BYTES_PER_VALUE, cache_entries, kv_counts

    press = target.press()
    kind = kind_of(target, press)
    if kind in ("codec", "decoding"):  # a press that prunes channels frees what it accounts
        raise NotApplicable(
            "a codec: it accounts the bytes of its own store (layer_bytes) and hands attention "
            "reconstructed tensors"
            if kind == "codec"
            else "compresses while decoding: nothing is freed at the prefill"
        )
    ids = subject.context_ids()
    compressed = prefill(subject, target, press, ids)
    full = prefill(subject, target, None, ids)
    masked = sum(int((~held).sum()) for held in compressed.held)
    counted = kv_counts(subject.model, ids.shape[1], cache_entries(compressed.cache, masked), press)
    size = subject.model.dtype.itemsize
    accounted = counted["kv_bytes"] * size // BYTES_PER_VALUE
    allocated, whole = allocated_bytes(compressed.cache), allocated_bytes(full.cache)
    if compressed.masks:
        raise NotApplicable(
            f"masks, frees nothing: {allocated:,} B allocated of {whole:,} B uncompressed, where kv_bytes "
            f"counts {accounted:,} B (at ratio {RATIO:g})"
        )
    if allocated != accounted:
        raise AssertionError(
            f"ratio {RATIO:g}: the cache allocates {allocated:,} B, kv_bytes says {accounted:,} B "
            f"({whole:,} B uncompressed)"
            + (" - a kept tensor is a view of a larger one" if allocated > accounted else "")
        )
    return f"ratio {RATIO:g}: {allocated:,} of {whole:,} B allocated, as kv_bytes says"


def compresses_again(target: Target) -> str:
    """ "" if kvbench compresses this press's cache again (decode-time, streaming, multi-turn); else why
    not, as `engine.check_protocol` says."""
    from kvbench.core.errors import BadInput
    from kvbench.engine import check_compresses_live

    reasons = []
    for protocol in ("decode-time", "streaming", "multi-turn"):
        config = target.config(RATIO, protocol=protocol, protocol_args=protocol_args(protocol))
        try:
            check_compresses_live(config)
            return ""
        except BadInput as error:
            reasons.append(str(error))
    return reasons[0]


def check_order(subject: Subject, target: Target) -> str:
    from kvpress import ScorerPress

    from kvbench.bridge.adapter import keep_cache_order

    refused = compresses_again(target)
    if refused:
        raise NotApplicable(f"never compressed again: {refused}")
    press = target.press()
    if isinstance(press, ScorerPress):
        keep_cache_order(press)  # what kvbench does before it compresses a cache again
    ids = subject.context_ids()
    positions = kept_positions(prefill(subject, target, press, ids), prefill(subject, target, None, ids))
    if positions is None:
        raise NotApplicable("the press rewrites the keys it keeps: their positions cannot be read")
    for layer, heads in enumerate(positions):
        for head, kept in enumerate(heads):
            if any(b <= a for a, b in zip(kept, kept[1:], strict=False)):
                shown = ", ".join(map(str, kept[:8]))
                raise AssertionError(
                    f"ratio {RATIO:g}: layer {layer} head {head} keeps positions {shown}, ... "
                    "(expected increasing: a second compression would score them out of place)"
                )
    return f"ratio {RATIO:g}: kept entries in position order in every layer and head"


def seed_torch(model, seed: int) -> None:
    """As torch.manual_seed(seed) for what `model` draws on: the CPU's generator and its GPU's
    (`adapter.seed_generators`)."""
    from kvbench.bridge.adapter import seed_generators

    seed_generators(seed, [model.device] if model.device.type == "cuda" else [])


def seeded_runs(subject: Subject, target: Target, runs, prompt=None) -> list[Compressed]:
    """The context compressed once per (global seed, kvbench seed key) of `runs`, each under a fresh press
    seeded as the engine seeds it (`seed_press`); Python's and torch's global random states set apart."""
    import torch

    from kvbench.bridge.adapter import seed_press

    ids = prompt.context_ids.to(subject.model.device) if prompt is not None else subject.context_ids()
    compressed = []
    for seed, key in runs:
        random.seed(seed)
        with torch.random.fork_rng():
            seed_torch(subject.model, seed)
            press = seed_press(target.press(), f"conformance/{key}")
            compressed.append(prefill(subject, target, press, ids, prompt))
    return compressed


def unrepeatable(subject: Subject, target: Target) -> str:
    """ "" when two runs under one kvbench seed keep the same cache; else where they differ."""
    return same_cache(*seeded_runs(subject, target, ((1, "a"), (2, "a"))))


def check_determinism(subject: Subject, target: Target) -> str:
    first, again, other = seeded_runs(subject, target, ((1, "a"), (2, "a"), (3, "b")))
    differs = same_cache(first, again)
    if differs:
        raise AssertionError(
            f"two runs with one seed, ratio {RATIO:g}: {differs} (randomness kvbench does not seed: "
            "draw from torch's generator inside compress, or from a generator of the press's own seed)"
        )
    draws = " (it draws random numbers: the seed changes what it keeps)" if same_cache(first, other) else ""
    return f"two runs with one seed keep identical caches{draws}"


def check_isolation(subject: Subject, target: Target) -> str:
    from kvbench.tasks.prompt import tokenize_sample

    if unrepeatable(subject, target):
        raise NotApplicable("not deterministic (see determinism): a question's effect cannot be told apart")
    questions = (" ".join(subject.words[1:4]), " ".join(subject.words[7:16]))
    prompts = [tokenize_sample(subject.tokenizer, subject.sample(question)) for question in questions]
    assert all(prompt.context_ids.equal(prompts[0].context_ids) for prompt in prompts)
    # One seed key for both, as the engine's: the sample and the config, not the question.
    runs = [seeded_runs(subject, target, ((0, "q"),), prompt)[0] for prompt in prompts]
    differs = same_cache(*runs)
    if differs:
        raise AssertionError(f"query-agnostic, two questions, ratio {RATIO:g}: {differs}")
    return "query-agnostic: the same cache whatever the question"


@contextlib.contextmanager
def decoded_ids(tokenizer):
    """The ids of every `tokenizer.decode` call within the block (the engine and the pipeline decode each
    answer once)."""
    calls = []
    decode = tokenizer.decode

    def recording(ids, *args, **kwargs):
        calls.append([int(i) for i in ids])
        return decode(ids, *args, **kwargs)

    tokenizer.decode = recording
    try:
        yield calls
    finally:
        del tokenizer.decode


def check_shared_prefill(subject: Subject, target: Target) -> str:
    from kvbench.bridge.adapter import is_shareable, seed_press

    press = target.press()
    if declared(press, "use_regions"):
        raise NotApplicable("reads the prompt's regions, which kvpress's pipeline does not give")
    if unrepeatable(subject, target):
        raise NotApplicable("not deterministic (see determinism): no two runs answer alike")
    config = target.config(RATIO)
    sample = subject.sample()
    none = Config("none", 0.0)
    with decoded_ids(subject.tokenizer) as calls:
        evaluate_sample_of(subject, sample, [none, config])
    engine = dict(zip((none, config), calls, strict=True))
    # The pipeline's press seeded as the engine seeds its config's (`evaluate_sample`).
    seeded = seed_press(config_press(config), f"{sample.task}/{sample.id}/{config!r}")
    pipeline = {
        none: pipeline_ids(subject, target, sample, None),
        config: pipeline_ids(subject, target, sample, seeded),
    }
    shared = (
        "shares the prefill" if is_shareable(press) else "runs alone (changes the forward or masks heads)"
    )
    if engine[config] != pipeline[config]:
        raise AssertionError(
            f"{shared}; ratio {RATIO:g}: the engine answers {engine[config]}, kvpress's pipeline "
            f"{pipeline[config]}"
        )
    if engine[none] != pipeline[none]:
        raise AssertionError(
            f"{shared}, but the uncompressed config beside it answers {engine[none]} where kvpress's "
            f"pipeline answers {pipeline[none]}: the press writes into the keys or values it is given"
        )
    return f"{shared}; the engine's {len(engine[config])} tokens equal kvpress's pipeline's"


def evaluate_sample_of(subject: Subject, sample, configs: list[Config]) -> list[dict]:
    from kvbench.engine import evaluate_sample

    return evaluate_sample(subject.model, subject.tokenizer, sample, configs)


def pipeline_ids(subject: Subject, target: Target, sample, press) -> list[int]:
    """The token ids kvpress's pipeline answers `sample` with under `press` (eager where it needs it)."""
    from kvpress import KVPressTextGenerationPipeline

    from kvbench.bridge.adapter import attention_implementation

    model, tokenizer = subject.model, subject.tokenizer
    pipeline = KVPressTextGenerationPipeline(model=model, tokenizer=tokenizer, device=model.device)
    implementation = "eager" if press is not None and target.eager else model.config._attn_implementation
    try:
        with decoded_ids(tokenizer) as calls, attention_implementation(model, implementation):
            pipeline(
                sample.context,
                question=sample.question,
                answer_prefix=sample.answer_prefix,
                press=press,
                max_new_tokens=sample.max_new_tokens,
            )
    except Exception as error:
        raise NotApplicable(f"kvpress's pipeline cannot run it: {type(error).__name__}: {error}") from None
    return calls[0]


def protocol_args(protocol: str) -> tuple:
    """A protocol's argument sized for the tiny context (`LIVE_PROTOCOLS`), or its default."""
    wanted = PROTOCOLS[protocol]
    return ((wanted.option, LIVE_PROTOCOLS.get(protocol) or wanted.default),) if wanted.option else ()


def check_protocols(subject: Subject, target: Target) -> str:
    from kvbench.core.errors import BadInput
    from kvbench.engine import check_protocol, evaluate_sample
    from kvbench.engine.steps import budget_entries

    layers, heads = subject.shape
    seen, refused = [], []
    for protocol in LIVE_PROTOCOLS:
        config = target.config(RATIO, protocol=protocol, protocol_args=protocol_args(protocol))
        try:
            check_protocol(config)
        except BadInput as error:
            refused.append((protocol, str(error)))
            continue
        sample = subject.sample()
        if PROTOCOLS[protocol].several_questions:
            sample.parts = [
                dataclasses.replace(sample, question=f"{word} {word}") for word in subject.words[1:3]
            ]
        try:
            rows = evaluate_sample(subject.model, subject.tokenizer, sample, [config])
        except Exception as error:
            raise AssertionError(f"{protocol} crashes: {type(error).__name__}: {error}") from None
        for turn, row in enumerate(rows):
            promised = budget_entries(config, row["context_tokens"]) * layers * heads
            if kind_of(target, target.press()) != "evictor" or target.resolved.spec.knob:
                continue  # a codec holds every entry; a knob press's budget is its own
            if row["kv_kept"] != promised:
                raise AssertionError(
                    f"{protocol}{f' turn {turn}' if len(rows) > 1 else ''}: {row['kv_kept']} entries held "
                    f"of {row['context_tokens']} tokens, expected {promised}"
                )
        seen.append(protocol)
    said = f"{', '.join(p for p, _ in refused)} refused by kvbench ({refused[0][1]})" if refused else ""
    if not seen:
        raise NotApplicable(said)
    return "; ".join(filter(None, [f"{', '.join(seen)} run and keep their budget", said]))


def check_cost(subject: Subject, target: Target) -> str:
    import torch

    from kvbench.bridge.adapter import attention_implementation, clear_head_masks
    from kvbench.diagnostics.speed import allocated_bytes
    from kvbench.diagnostics.speed import prefill as timed_prefill

    model = subject.model
    ids = subject.context_ids(COST_TOKENS)
    knorm = build_press("knorm", RATIO)
    cuda = model.device.type == "cuda"
    times: dict[str, list[float]] = {"none": [], "knorm": [], target.name: []}
    kept_bytes = peak = 0
    implementation = "eager" if target.eager else model.config._attn_implementation
    for _ in range(COST_REPEATS):
        for name, press in (("none", None), ("knorm", knorm), (target.name, target.press())):
            if cuda:
                torch.cuda.synchronize(model.device)
                torch.cuda.reset_peak_memory_stats(model.device)
            try:
                with attention_implementation(model, implementation if name == target.name else "sdpa"):
                    seconds, cache, _ = timed_prefill(model, ids, press)
            finally:
                clear_head_masks(model)
            times[name].append(seconds)
            if name == target.name:
                kept_bytes = allocated_bytes(cache)
                peak = torch.cuda.max_memory_allocated(model.device) if cuda else 0
    press_s = min(times[target.name])
    memory = f"peak {peak:,} B allocated" if cuda else f"cache {kept_bytes:,} B allocated (peak: CUDA only)"
    against = ", ".join(versus(times[target.name], times[other], other) for other in ("none", "knorm"))
    return f"{COST_TOKENS}-token prefill {press_s * 1e3:.1f} ms: {against}; {memory}"


def versus(press: list[float], other: list[float], name: str) -> str:
    """The press's fastest time against `name`'s, e.g. "+14% vs none (9.5 ms)"; said to be within the
    noise of the repeats when the difference is smaller than the spread (max - min) of either's times."""
    difference = min(press) - min(other)
    spread = max(max(press) - min(press), max(other) - min(other))
    noise = f", within the noise of {len(press)} repeats" if abs(difference) < spread else ""
    return f"{min(press) / min(other) - 1:+.0%} vs {name} ({min(other) * 1e3:.1f} ms{noise})"


BATTERY: dict[str, Callable[[Subject, Target], str]] = dict(
    zip(
        CHECKS,
        (
            check_budget,
            check_memory,
            check_order,
            check_determinism,
            check_isolation,
            check_shared_prefill,
            check_protocols,
            check_cost,
        ),
        strict=True,
    )
)


# --------------------------------------------------------------------------------------------- entry


def check_press(
    press, press_args: dict | None = None, *, model: str | None = None, quick: bool = False
) -> list[Check]:
    """The battery's verdicts on `press` (a registered name, `module:Class`, `path/to/file.py:Class`, a
    class or a factory) built with `press_args`: one `Check` per name of CHECKS, in that order. On the tiny
    models, and unless `quick` on `model` too (a name for `models.load_model`, default the embedded model).
    Bad input (an unknown press, an argument it does not take, one that does not build) raises BadInput
    before any model is built."""
    from kvbench.bridge.models import EMBEDDED

    name = resolve_press(press)
    target = Target(name, tuple(sorted(dict(press_args or {}).items())))
    resolved = target.resolved  # the press, resolved once
    if resolved.spec.factory is None:
        from kvbench.core.errors import BadInput

        raise BadInput(f"press {name!r} compresses nothing: there is nothing to check")
    resolved.check_runnable()
    resolved.check_args()
    # Every budget the battery builds (a codec's at RATIO only): a bad argument fails here, in one line.
    for ratio in (RATIO,) if resolved.spec.codec or resolved.spec.knob else RATIOS:
        config_press(target.config(ratio))
    subjects = tiny_subjects() + ([] if quick else [loaded_subject(model or EMBEDDED)])
    outcomes: dict[str, list[tuple[str, str]]] = {check: [] for check in CHECKS}
    scratch = tempfile.TemporaryDirectory(prefix="kvbench-check-")  # state fitted for the tiny models
    for subject in subjects:
        tiny = subject.name in TINY
        with one_thread() if tiny else contextlib.nullcontext():
            on_subject = fitted_on(subject, target, Path(scratch.name) / subject.name) if tiny else target
            ready = ready_on(subject, on_subject)
            for check, run in BATTERY.items():
                if ready:
                    outcomes[check].append(("n/a", f"{subject.name}: {ready}"))
                    continue
                outcomes[check].append(run_check(run, subject, on_subject))
    scratch.cleanup()
    return [verdict_of(check, outcomes[check], [s.name for s in subjects]) for check in CHECKS]


TINY = ("llama-gqa", "qwen2-mha")


def fitted_on(subject: Subject, target: Target, folder: Path) -> Target:
    """`target`, where it is a fitted press given no state (`kvbench fit`), with state fitted on the tiny
    `subject` (on two of its contexts, kvzap's surrogates and Fast KVzip's training at a tiny size) into
    `folder`: so the battery checks kvpress's press with fitted state on the tiny models too."""
    import torch

    from kvbench.learned.fitted import METHODS, FitConfig, card_of, check_options, method, save_fitted

    if target.name not in METHODS or "weights" in dict(target.args):
        return target
    tiny = {"kvzap": {"hidden_dim": "8", "epochs": "2", "tokens": "32"}, "fastkvzip": {"steps": "50"}}
    options = check_options(target.name, tiny.get(target.name, {}))
    contexts = [
        subject.tokenizer(subject.context(seed=seed), add_special_tokens=False, return_tensors="pt").input_ids
        for seed in (1000, 1001)
    ]
    with torch.random.fork_rng():
        seed_torch(subject.model, 0)
        tensors, validation = method(target.name).fit(subject.model, subject.tokenizer, contexts, options)
    card = card_of(subject.model, FitConfig(options=options), contexts, 0.0, validation)
    save_fitted(folder, target.name, tensors, card)
    return Target(target.name, tuple(sorted({**dict(target.args), "weights": str(folder)}.items())))


@contextlib.contextmanager
def one_thread():
    """Tiny models run several times faster on one thread than on cores shared with other work."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def ready_on(subject: Subject, target: Target) -> str:
    """ "" when the press can be set up on the subject's model; else why not (a learned press without state
    for it, a press that loads the model's files)."""
    from kvbench.core.errors import KvbenchError

    try:
        prefill(subject, target, target.press(), subject.context_ids())
    except (KvbenchError, OSError, LookupError) as error:  # files it loads for a model: state, tokenizer
        return f"cannot be set up on this model ({type(error).__name__}: {str(error).splitlines()[0][:100]})"
    except Exception:  # the press's own failure: the checks say where
        pass
    return ""


def run_check(run: Callable, subject: Subject, target: Target) -> tuple[str, str]:
    import torch

    try:
        with torch.random.fork_rng():
            seed_torch(subject.model, 0)
            return "pass", run(subject, target)
    except NotApplicable as reason:
        return "n/a", str(reason)
    except AssertionError as error:
        return "fail", f"{subject.name}: {error}"
    except Exception as error:
        return "fail", f"{subject.name}: crashes: {type(error).__name__}: {str(error).splitlines()[0][:160]}"


def verdict_of(check: str, outcomes: list[tuple[str, str]], subjects: list[str]) -> Check:
    """One verdict over the models: fail if any fails, else pass if any passes, else n/a."""
    for verdict in ("fail", "pass"):
        found = [evidence for v, evidence in outcomes if v == verdict]
        if found:
            if verdict == "pass":
                where = [s for s, (v, _) in zip(subjects, outcomes, strict=True) if v == "pass"]
                return Check(check, verdict, f"{found[0]} [{', '.join(where)}]")
            return Check(check, verdict, "; ".join(found))
    return Check(check, "n/a", outcomes[0][1])


def failed(checks: list[Check]) -> bool:
    return any(check.verdict == "fail" for check in checks)


def table(checks: list[Check]) -> str:
    """The checks as one text table: check, verdict, evidence."""
    rows = [("check", "verdict", "evidence")] + [(c.name, c.verdict, c.evidence) for c in checks]
    first = max(len(row[0]) for row in rows)
    lines = [f"{name:<{first}}  {verdict:<7}  {evidence}" for name, verdict, evidence in rows]
    return "\n".join(lines)


def checkable_presses() -> dict[str, str]:
    """Every press of the registry by name: "" for those `check_press` can run with their defaults, else
    why not (no compression, a knob of their own to give, files from the hub)."""
    reasons = {}
    for name, spec in PRESSES.items():
        if spec.factory is None:
            reasons[name] = "compresses nothing"
        elif spec.knob:
            reasons[name] = f"set by a knob of its own: check it with --press-arg {spec.knob}="
        elif "hub" in spec.needs:
            reasons[name] = "downloads its files per model from the hub"
        else:
            reasons[name] = ""
    return reasons


BOARD_HEAD = """# Conformance of the registry's presses

Generated by `kvbench check-press --all --quick --markdown docs/conformance.md` (the tiny random-init
models; `tests/diagnostics/test_conformance.py` checks that this page is what the command writes today). Each
check is described in [extending kvbench](extending.md#check-your-press-kvbench-check-press); a failure of
a built-in press is stated in `kvbench presses` beside it.

"""


def board(results: dict[str, list[Check]], skipped: dict[str, str]) -> str:
    """A markdown page: one line per press (its verdict per check), the presses not checked and why, then
    the evidence of every failure and, where `kvbench presses` states one, the press's caveat."""
    lines = [BOARD_HEAD + "| press | " + " | ".join(CHECKS) + " |", "|---|" + "---|" * len(CHECKS)]
    lines += [
        f"| {name} | " + " | ".join(c.verdict for c in checks) + " |" for name, checks in results.items()
    ]
    if skipped:
        lines += ["", "Not checked:", ""] + [f"- {name}: {why}" for name, why in skipped.items()]
    failures = [(name, c) for name, checks in results.items() for c in checks if c.verdict == "fail"]
    if failures:
        lines += ["", "Failures:", ""] + [f"- {name}, {c.name}: {c.evidence}" for name, c in failures]
    caveats = {name: resolve(name).spec.caveat for name in results}
    caveats = {name: caveat for name, caveat in caveats.items() if caveat and failed(results[name])}
    if caveats:
        lines += ["", "Stated in `kvbench presses`:", ""] + [
            f"- {name}: {caveat}" for name, caveat in caveats.items()
        ]
    return "\n".join(lines) + "\n"


def record_of(
    name: str, press_args: dict, checks: list[Check], *, quick: bool, model: str
) -> ConformanceRecord:
    """What `kvbench check-press --out` writes of a press's checks (`store.conformance.write_record`)."""
    from datetime import datetime, timezone

    source = resolve(name, press_args).spec.source
    return ConformanceRecord(
        press=name,
        press_args=dict(press_args),
        verdicts={check.name: check.verdict for check in checks},
        quick=quick,
        model=model,
        written=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        source=source.as_dict() if source is not None else None,
    )
