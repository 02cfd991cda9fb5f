"""Replaying a trace on a real model against each policy's prefix store: what had to be computed, how long it
took to the first token, and how far the answer moved from a full recompute.

Per request and policy: `ttft_s` (the wall time of what the policy does before the first token's logits:
looking up the store, assembling the reused KV, shifting positions, applying transitions, computing what is
missing, the question included), tokens reused and computed, chunks or blocks hit and missed, bytes held
after the request, `bookkeeping_s` (the store's own lookups, inserts and evictions, tensors aside), and
accuracy against `none` (the full recompute, replayed first): the largest absolute first-token logit
difference, whether the first token and the greedy answer are the same.
"""

import dataclasses
import time

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


def bytes_per_token(model) -> int:
    """KV bytes of one token at 16 bits, every layer and KV head (as every kvbench row counts them)."""
    config = model.config.get_text_config()
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return config.num_hidden_layers * 2 * config.num_key_value_heads * head_dim * 2


# ---- KV segments: per layer (keys, values), each [1, kv_heads, tokens, head_dim] ----


def segment_of(cache, start: int, end: int) -> tuple:
    return tuple((layer.keys[:, :, start:end], layer.values[:, :, start:end]) for layer in cache.layers)


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

    def __init__(self, model, tokenizer, trace: Trace, policy: str, budget: int, settings: Settings):
        self.model, self.policy, self.settings = model, policy, settings
        self.bpt = bytes_per_token(model)
        self.ids = {
            name: tokenizer(text, add_special_tokens=False)["input_ids"]
            for name, text in trace.chunks.items()
        }
        self.tokenizer = tokenizer
        self.sparsity: list[list[float]] = []  # per demotion, per layer fraction of entries kept
        demote = self.demote if policy == "pegasus" else None
        self.store = Store(budget, "rppc" if policy == "pegasus" else "lru", demote)
        self.demote_s = 0.0

    def forward(self, ids: list[int], cache):
        import torch

        with torch.no_grad():
            out = self.model(
                input_ids=torch.tensor([ids], device=self.model.device), past_key_values=cache, use_cache=True
            )
        return out.logits[0, -1]

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
        self.demote_s = 0.0
        start = time.perf_counter()
        inserts = []  # (parent, label, start, end, saved) made after the first token
        hits = misses = reused = transitions = 0
        if self.policy == "none":
            cache = cache_of([])
            logits = self.forward(context + question_ids, cache)
        elif self.policy == "prefix":
            block = self.settings.block
            labels = [tuple(context[i : i + block]) for i in range(0, len(context) - block + 1, block)]
            t0 = time.perf_counter()
            found = store.match(labels)
            store.pin(found)
            bookkeeping += time.perf_counter() - t0
            hits, misses, reused = len(found), len(labels) - len(found), len(found) * block
            cache = cache_of([n.payload for n in found])
            logits = self.forward(context[reused:] + question_ids, cache)
            parent = found[-1] if found else store.root
            for i in range(len(found), len(labels)):
                inserts.append((i, labels[i], i * block, (i + 1) * block, cost(block, i * block)))
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
                    self.forward(ids, alone)
                    segment = segment_of(alone, 0, len(ids))
                    misses, computed = misses + 1, computed + len(ids)
                    inserts.append((None, name, segment, None, cost(len(ids), 0)))
                segments.append(shift(self.model, segment, offset))
                offset += len(ids)
            cache = cache_of(segments)
            logits = self.forward(question_ids, cache)
        else:  # pegasus
            t0 = time.perf_counter()
            found = store.match(list(request.chunks))
            store.pin(found + [n.base for n in found if n.is_transition])
            bookkeeping += time.perf_counter() - t0
            hits, misses = len(found), len(request.chunks) - len(found)
            transitions = sum(n.is_transition for n in found)
            reused = sum(len(ids) for ids in chunk_ids[: len(found)])
            cache = cache_of([self.state(n) for n in found])
            logits = self.forward(context[reused:] + question_ids, cache)
            offset = reused
            for i in range(len(found), len(request.chunks)):
                n = len(chunk_ids[i])
                inserts.append((i, request.chunks[i], offset, offset + n, cost(n, offset)))
                offset += n
        ttft = time.perf_counter() - start
        first = int(logits.argmax())
        answer = [first]
        for _ in range(self.settings.answer_tokens):
            answer.append(int(self.forward([answer[-1]], cache).argmax()))
        t0 = time.perf_counter()
        if self.policy == "prefix":
            node = parent
            for _, label, a, b, saved in inserts:
                node = store.insert(node, label, segment_of(cache, a, b), (b - a) * self.bpt, saved)
                if node is None:
                    break
        elif self.policy == "chunk":
            for _, name, segment, _, saved in inserts:
                store.insert(store.root, name, segment, segment[0][0].shape[2] * self.bpt, saved)
        elif self.policy == "pegasus":
            node = found[-1] if found else store.root
            for _, label, a, b, saved in inserts:
                node = store.insert(node, label, (segment_of(cache, a, b), a), (b - a) * self.bpt, saved)
                if node is None:
                    break
        bookkeeping += time.perf_counter() - t0 - self.demote_s
        store.pin([])
        return {
            "request": request.id,
            "policy": self.policy,
            "ttft_s": ttft,
            "tokens": len(context) + len(question_ids),
            "reused": reused,
            "computed": len(context) + len(question_ids) - reused,
            "hits": hits,
            "misses": misses,
            "transition_hits": transitions,
            "bytes_held": store.held,
            "budget": store.budget,
            "bookkeeping_s": bookkeeping,
            "demote_s": self.demote_s,
            "answer_ids": answer,
            "answer": self.tokenizer.decode(answer),
            "logits": logits.float(),
        }


def question_ids(tokenizer, request) -> list[int]:
    return tokenizer(f"Question: {request.question}\nAnswer:", add_special_tokens=False)["input_ids"]


def replay(model, tokenizer, trace: Trace, policy: str, budget: int, settings: Settings | None = None):
    """(rows, the Replay) of `policy` over `trace` in order; rows as `Replay.serve` makes them."""
    run = Replay(model, tokenizer, trace, policy, budget, settings or Settings())
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
        "logit_error_max": max(r.get("logit_error", 0.0) for r in rows),
        "logit_error_mean": sum(r.get("logit_error", 0.0) for r in rows) / len(rows),
        "first_token_same": sum(r.get("first_token_same", True) for r in rows) / len(rows),
        "answer_same": sum(r.get("answer_same", True) for r in rows) / len(rows),
        "bookkeeping_mean_s": sum(r["bookkeeping_s"] for r in rows) / len(rows),
    }


def run_policies(model, tokenizer, trace: Trace, policies, budgets, settings: Settings | None = None):
    """(rows, summaries, transition sparsity per layer): `none` (the reference) and every other policy at
    every budget on the same trace. Request by request, every policy serves it in turn (each with its own
    store): on a machine whose load varies, every policy's timings see the same load."""
    settings = settings or Settings()
    runs = [Replay(model, tokenizer, trace, "none", max(budgets), settings)]
    runs += [
        Replay(model, tokenizer, trace, policy, budget, settings)
        for policy in policies
        if policy != "none"
        for budget in budgets
    ]
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
