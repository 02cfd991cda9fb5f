"""Replaying a trace on a real model against each policy's prefix store: what had to be computed, how long it
took to the first token, and how far the answer moved from a full recompute.

Per request and policy: `ttft_s` (the wall time of what the policy does before the first token's logits:
looking up the store, assembling the reused KV, shifting positions, applying transitions, computing what is
missing, the question included), tokens reused and computed, chunks or blocks hit and missed, bytes held
after the request, `bookkeeping_s` (the store's own lookups, inserts and evictions, tensors aside), and
accuracy against `none` (the full recompute, replayed first): the largest absolute first-token logit
difference, whether the first token and the greedy answer are the same.

With a `Compression`, every entry a policy stores is first compressed by a kvbench press (compressed prefix
caching): the request that computed the entry answers from its full KV, later requests reuse the
compressed one; `compress_s` (after the first token, outside TTFT) is the press's time.
"""

import dataclasses
import time
from contextlib import nullcontext

from kvbench.bridge.adapter import attention_inputs, compress_entry, language_model
from kvbench.presses import build_press, needs_eager
from kvbench.serving.store import Node, Store
from kvbench.serving.trace import Trace

POLICIES = {
    "none": "no reuse: every prompt recomputed",
    "prefix": "exact-prefix reuse: radix tree of token blocks, LRU eviction (vLLM, SGLang)",
    "chunk": "stateless chunk reuse: each chunk's KV computed alone, reused anywhere (positions shifted)",
    "pegasus": "stateful path caching: states keyed by (path, chunk), RPPC eviction, sparse transitions",
}


def cost(tokens: int, offset: int) -> float:
    """Recompute cost of `tokens` tokens after `offset` others, in token units: linear in tokens, plus the
    attention to everything before (a 1k-token offset doubles a token's cost; the ratio is a choice, see the
    package docstring)."""
    return tokens * (1.0 + (offset + tokens / 2) / 1000.0)


@dataclasses.dataclass
class Settings:
    block: int = 16  # tokens per radix block
    transition_tol: float = 0.05  # a transition keeps the KV entries that change by more than this
    answer_tokens: int = 4  # greedy tokens decoded after the first, for the answer


@dataclasses.dataclass(frozen=True)
class Compression:
    """An evicting press of kvbench's registry that compresses every entry before it goes into the store,
    at `ratio` (the fraction of the entry's KV entries removed, kvpress's meaning)."""

    press: str
    ratio: float
    press_args: tuple = ()  # (key, value) pairs

    @property
    def label(self) -> str:
        return f"{self.press}@{self.ratio:g}"

    def build(self, model=None):
        """The press, set up for `model` when one is given (a learned press loads its state then)."""
        press = build_press(self.press, self.ratio, **dict(self.press_args))
        if model is not None:
            press.post_init_from_model(model)
        return press


@dataclasses.dataclass
class Fed:
    """Tokens one forward put in a cache: where they start in each layer (layers of a compressed cache may
    hold different lengths), the position of the first, and, when entries of them will be compressed, each
    attention layer's inputs."""

    starts: list[int]
    position: int
    inputs: dict | None


def bytes_per_token(model) -> int:
    """KV bytes of one token at 16 bits, every layer and KV head (as every kvbench row counts them)."""
    config = model.config.get_text_config()
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return config.num_hidden_layers * 2 * config.num_key_value_heads * head_dim * 2


# ---- KV segments: per layer (keys, values), each [1, kv_heads, tokens, head_dim] ----


def segment_of(cache, start: int, end: int) -> tuple:
    return tuple((layer.keys[:, :, start:end], layer.values[:, :, start:end]) for layer in cache.layers)


def segment_bytes(segment: tuple) -> int:
    """Bytes of a segment's entries at 16 bits (kvbench's rows count kept entries so)."""
    return sum(keys.numel() + values.numel() for keys, values in segment) * 2


def cache_of(segments: list[tuple]):
    import torch
    from transformers import DynamicCache

    cache = DynamicCache()
    if segments:
        for layer in range(len(segments[0])):
            keys = torch.cat([s[layer][0] for s in segments], dim=2)
            values = torch.cat([s[layer][1] for s in segments], dim=2)
            cache.update(keys, values, layer)
    return cache


def shift(model, segment: tuple, delta: int) -> tuple:
    """The segment's keys rotated by `delta` more positions (RoPE: R(p + d) = R(d) R(p)); values as are."""
    import torch
    from transformers.models.llama.modeling_llama import rotate_half

    if delta == 0:
        return segment
    keys = segment[0][0]
    position_ids = torch.full((1, keys.shape[2]), delta, dtype=torch.long, device=keys.device)
    cos, sin = model.model.rotary_emb(keys, position_ids=position_ids)
    cos, sin = cos[:, None].to(keys.dtype), sin[:, None].to(keys.dtype)
    return tuple((k * cos + rotate_half(k) * sin, v) for k, v in segment)


def sparse_delta(target: tuple, base: tuple, tol: float) -> tuple[tuple, int, list[float]]:
    """target - base kept where it exceeds `tol`: (per layer (mask-free (index, value) pairs of keys and of
    values), bytes at 16-bit values and 32-bit indices, per layer fraction of entries kept)."""
    layers, nbytes, fractions = [], 0, []
    for (tk, tv), (bk, bv) in zip(target, base, strict=True):
        pair, kept = [], 0
        for t, b in ((tk, bk), (tv, bv)):
            diff = (t - b).flatten()
            index = (diff.abs() > tol).nonzero().flatten()
            pair.append((index, diff[index]))
            kept += index.numel()
        layers.append(tuple(pair))
        nbytes += kept * 6
        fractions.append(kept / (2 * tk.numel()))
    return tuple(layers), nbytes, fractions


def apply_delta(base: tuple, delta: tuple) -> tuple:
    out = []
    for (k, v), ((ki, kd), (vi, vd)) in zip(base, delta, strict=True):
        k2, v2 = k.clone().flatten(), v.clone().flatten()
        k2[ki] += kd
        v2[vi] += vd
        out.append((k2.view_as(k), v2.view_as(v)))
    return tuple(out)


# ---- the replay ----


class Replay:
    """One policy's store and counters across a trace."""

    def __init__(
        self,
        model,
        tokenizer,
        trace: Trace,
        policy: str,
        budget: int,
        settings: Settings,
        compression: Compression | None = None,
    ):
        self.model, self.policy, self.settings = model, policy, settings
        self.compression = compression if policy != "none" else None
        self.press = self.compression.build(model) if self.compression else None
        self.press_attentions = bool(self.compression) and needs_eager(
            compression.press, dict(compression.press_args)
        )
        self.compress_s = 0.0
        self.ids = {
            name: tokenizer(text, add_special_tokens=False)["input_ids"]
            for name, text in trace.chunks.items()
        }
        self.tokenizer = tokenizer
        self.sparsity: list[list[float]] = []  # per demotion, per layer fraction of entries kept
        demote = self.demote if policy == "pegasus" else None
        self.store = Store(budget, "rppc" if policy == "pegasus" else "lru", demote)
        self.demote_s = 0.0

    def forward(self, ids: list[int], cache, position: int):
        """Last-token logits of `ids` fed on top of `cache` from `position` on (positions count tokens, not
        the entries a compressed cache holds), and what was fed (`Fed`)."""
        import torch

        starts = [layer.keys.shape[2] for layer in cache.layers] or [0] * len(
            language_model(self.model).layers
        )
        positions = torch.arange(position, position + len(ids), device=self.model.device)[None]
        with torch.no_grad(), attention_inputs(self.model) if self.press else nullcontext({}) as inputs:
            out = self.model(
                input_ids=torch.tensor([ids], device=self.model.device),
                past_key_values=cache,
                position_ids=positions,
                use_cache=True,
            )
        return out.logits[0, -1], Fed(starts, position, inputs if self.press else None)

    def entry(self, cache, fed: Fed, start: int, end: int) -> tuple[tuple, int]:
        """(segment, bytes) of the tokens at positions [start, end) that `fed` put in `cache`, compressed by
        the press when there is one."""
        a, b = start - fed.position, end - fed.position
        segment = tuple(
            (layer.keys[:, :, s + a : s + b], layer.values[:, :, s + a : s + b])
            for layer, s in zip(cache.layers, fed.starts, strict=True)
        )
        if self.press is None:
            return segment, segment_bytes(segment)
        began, layers = time.perf_counter(), language_model(self.model).layers
        compressed = []
        for index, (keys, values) in enumerate(segment):
            hidden, (cos, sin) = fed.inputs[index]
            inputs = (hidden[:, a:b], (cos[:, a:b], sin[:, a:b]))
            module = layers[index].self_attn
            compressed.append(
                compress_entry(self.press, module, inputs, start, keys, values, self.press_attentions)
            )
        self.compress_s += time.perf_counter() - began
        return tuple(compressed), segment_bytes(compressed)

    def demote(self, node: Node):
        """A Pegasus state as a sparse transition from the most recently used other state of its chunk."""
        start = time.perf_counter()
        try:
            bases = [
                n
                for n in self.store.nodes()
                if n.label == node.label and n is not node and not n.is_transition
            ]
            if not bases:
                return None
            base = max(bases, key=lambda n: n.last)
            (segment, offset), (base_segment, base_offset) = node.payload, base.payload
            if any(t[0].shape != b[0].shape for t, b in zip(segment, base_segment, strict=True)):
                return None  # a press kept different numbers of entries under the two paths
            delta, nbytes, fractions = sparse_delta(
                segment, shift(self.model, base_segment, offset - base_offset), self.settings.transition_tol
            )
            self.sparsity.append(fractions)
            return (delta, offset), nbytes, base, node.saved * 0.9
        finally:
            self.demote_s += time.perf_counter() - start

    def state(self, node: Node) -> tuple:
        if not node.is_transition:
            return node.payload[0]
        delta, offset = node.payload
        base_segment, base_offset = node.base.payload
        return apply_delta(shift(self.model, base_segment, offset - base_offset), delta)

    def serve(self, request, question_ids: list[int]) -> dict:
        chunk_ids = [self.ids[name] for name in request.chunks]
        context = [t for ids in chunk_ids for t in ids]
        store, bookkeeping = self.store, 0.0
        self.demote_s = self.compress_s = 0.0
        start = time.perf_counter()
        # Entries to store after the first token: (label, where the tokens were fed, their cache, their
        # positions [a, b) there, latency saved)
        inserts = []
        hits = misses = reused = transitions = 0
        if self.policy == "none":
            cache = cache_of([])
            logits, fed = self.forward(context + question_ids, cache, 0)
        elif self.policy == "prefix":
            block = self.settings.block
            labels = [tuple(context[i : i + block]) for i in range(0, len(context) - block + 1, block)]
            t0 = time.perf_counter()
            found = store.match(labels)
            store.pin(found)
            bookkeeping += time.perf_counter() - t0
            hits, misses, reused = len(found), len(labels) - len(found), len(found) * block
            cache = cache_of([n.payload for n in found])
            logits, fed = self.forward(context[reused:] + question_ids, cache, reused)
            for i in range(len(found), len(labels)):
                a, b = i * block, (i + 1) * block
                inserts.append((labels[i], fed, cache, a, b, cost(block, a)))
        elif self.policy == "chunk":
            segments, offset, computed = [], 0, 0
            t0 = time.perf_counter()
            found = {name: store.match([name]) for name in request.chunks}
            store.pin([n for nodes in found.values() for n in nodes])
            bookkeeping += time.perf_counter() - t0
            for name, ids in zip(request.chunks, chunk_ids, strict=True):
                if found[name]:
                    segment = found[name][0].payload
                    hits, reused = hits + 1, reused + len(ids)
                else:
                    alone = cache_of([])
                    _, alone_fed = self.forward(ids, alone, 0)
                    segment = segment_of(alone, 0, len(ids))  # this request uses the full KV it computed
                    misses, computed = misses + 1, computed + len(ids)
                    inserts.append((name, alone_fed, alone, 0, len(ids), cost(len(ids), 0)))
                segments.append(shift(self.model, segment, offset))
                offset += len(ids)
            cache = cache_of(segments)
            logits, fed = self.forward(question_ids, cache, len(context))
        else:  # pegasus
            t0 = time.perf_counter()
            found = store.match(list(request.chunks))
            store.pin(found + [n.base for n in found if n.is_transition])
            bookkeeping += time.perf_counter() - t0
            hits, misses = len(found), len(request.chunks) - len(found)
            transitions = sum(n.is_transition for n in found)
            reused = sum(len(ids) for ids in chunk_ids[: len(found)])
            cache = cache_of([self.state(n) for n in found])
            logits, fed = self.forward(context[reused:] + question_ids, cache, reused)
            offset = reused
            for i in range(len(found), len(request.chunks)):
                n = len(chunk_ids[i])
                inserts.append((request.chunks[i], fed, cache, offset, offset + n, cost(n, offset)))
                offset += n
        ttft = time.perf_counter() - start
        first = int(logits.argmax())
        answer = [first]
        position = len(context) + len(question_ids)
        for step in range(self.settings.answer_tokens):
            answer.append(int(self.forward([answer[-1]], cache, position + step)[0].argmax()))
        t0 = time.perf_counter()
        # prefix blocks and Pegasus states hang below the path they extend; chunks from the root
        parent = found[-1] if self.policy in ("prefix", "pegasus") and found else store.root
        for label, where, held, a, b, saved in inserts:
            segment, nbytes = self.entry(held, where, a, b)
            payload = (segment, a) if self.policy == "pegasus" else segment
            node = store.insert(parent, label, payload, nbytes, saved)
            if self.policy == "chunk":
                continue  # every chunk hangs from the root
            if node is None:
                break
            parent = node
        bookkeeping += time.perf_counter() - t0 - self.demote_s - self.compress_s
        store.pin([])
        return {
            "request": request.id,
            "policy": self.policy,
            "press": self.compression.label if self.compression else "none",
            "ttft_s": ttft,
            "tokens": len(context) + len(question_ids),
            "reused": reused,
            "computed": len(context) + len(question_ids) - reused,
            "hits": hits,
            "misses": misses,
            "transition_hits": transitions,
            "bytes_held": store.held,
            "entries_held": len(store.nodes()),
            "budget": store.budget,
            "bookkeeping_s": bookkeeping,
            "demote_s": self.demote_s,
            "compress_s": self.compress_s,
            "answer_ids": answer,
            "answer": self.tokenizer.decode(answer),
            "logits": logits.float(),
        }


def question_ids(tokenizer, request) -> list[int]:
    return tokenizer(f"Question: {request.question}\nAnswer:", add_special_tokens=False)["input_ids"]


def replay(
    model,
    tokenizer,
    trace: Trace,
    policy: str,
    budget: int,
    settings: Settings | None = None,
    compression: Compression | None = None,
):
    """(rows, the Replay) of `policy` over `trace` in order; rows as `Replay.serve` makes them."""
    run = Replay(model, tokenizer, trace, policy, budget, settings or Settings(), compression)
    return [run.serve(request, question_ids(tokenizer, request)) for request in trace.requests], run


def compare(rows: list[dict], reference: list[dict]) -> list[dict]:
    """Rows with their accuracy against the full recompute's rows of the same requests (logits dropped)."""
    out = []
    for row, ref in zip(rows, reference, strict=True):
        row = dict(row)
        logits = row.pop("logits")
        row["logit_error"] = float((logits - ref["logits"]).abs().max())
        row["first_token_same"] = row["answer_ids"][0] == ref["answer_ids"][0]
        row["answer_same"] = row["answer_ids"] == ref["answer_ids"]
        out.append(row)
    return out


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def summarize(rows: list[dict]) -> dict:
    """One policy at one budget over a trace: TTFT percentiles, throughput, hit rate, reuse, accuracy."""
    ttft = [r["ttft_s"] for r in rows]
    hits, misses = sum(r["hits"] for r in rows), sum(r["misses"] for r in rows)
    return {
        "policy": rows[0]["policy"],
        "press": rows[0]["press"],
        "budget": rows[0]["budget"],
        "requests": len(rows),
        "ttft_p50_s": percentile(ttft, 50),
        "ttft_p90_s": percentile(ttft, 90),
        "ttft_p99_s": percentile(ttft, 99),
        "ttft_total_s": sum(ttft),
        "throughput_rps": len(rows) / sum(ttft),  # requests per second of prefill (time to first token)
        "hit_rate": hits / (hits + misses) if hits + misses else 0.0,
        "transition_hits": sum(r["transition_hits"] for r in rows),
        "reused_fraction": sum(r["reused"] for r in rows) / sum(r["tokens"] for r in rows),
        "bytes_held_max": max(r["bytes_held"] for r in rows),
        # bytes of an entry as the store holds it (a block, a state or a chunk): fewer under a press
        "bytes_per_entry": sum(r["bytes_held"] for r in rows) / max(1, sum(r["entries_held"] for r in rows)),
        "logit_error_max": max(r.get("logit_error", 0.0) for r in rows),
        "logit_error_mean": sum(r.get("logit_error", 0.0) for r in rows) / len(rows),
        "first_token_same": sum(r.get("first_token_same", True) for r in rows) / len(rows),
        "answer_same": sum(r.get("answer_same", True) for r in rows) / len(rows),
        "bookkeeping_mean_s": sum(r["bookkeeping_s"] for r in rows) / len(rows),
        "compress_mean_s": sum(r["compress_s"] for r in rows) / len(rows),
    }


def run_policies(
    model,
    tokenizer,
    trace: Trace,
    policies,
    budgets,
    settings: Settings | None = None,
    compression: Compression | None = None,
):
    """(rows, summaries, transition sparsity per layer): `none` (the reference) and every other policy at
    every budget on the same trace, each also with its entries compressed when a `compression` is given.
    Request by request, every policy serves it in turn (each with its own store): on a machine whose load
    varies, every policy's timings see the same load."""
    settings = settings or Settings()
    runs = [Replay(model, tokenizer, trace, "none", max(budgets), settings)]
    runs += [
        Replay(model, tokenizer, trace, policy, budget, settings, pressed)
        for policy in policies
        if policy != "none"
        for budget in budgets
        for pressed in ([None, compression] if compression else [None])
    ]
    # One untimed prefill of the first prompt first: the model's first forward pays for allocations and
    # warm-up that would otherwise land on the first request of the first policy served
    first = trace.requests[0]
    warm_up = [t for name in first.chunks for t in runs[0].ids[name]] + question_ids(tokenizer, first)
    runs[0].forward(warm_up, cache_of([]), 0)
    served: list[list[dict]] = [[] for _ in runs]
    for request in trace.requests:
        question = question_ids(tokenizer, request)
        for run, rows in zip(runs, served, strict=True):
            rows.append(run.serve(request, question))
    reference = served[0]
    rows, summaries = [], []
    for got in served:
        got = compare(got, reference)
        rows += got
        summaries.append(summarize(got))
    sparsity = [fractions for run in runs for fractions in run.sparsity]
    layers = [sum(col) / len(col) for col in zip(*sparsity, strict=True)] if sparsity else []
    return rows, summaries, layers
