"""Codec presses (quant, qevict): faithfulness to plain-loop references, byte accounting against really packed
tensors, budgets, and real prefills of the tiny models through kvpress's own hooks."""

from types import SimpleNamespace

import pytest
import torch
from transformers.models.llama.modeling_llama import rotate_half

from kvbench.bridge.models import load_model
from kvbench.presses import build_press
from kvbench.presses import qevict as qevict_module
from kvbench.presses import quant as quant_module
from kvbench.presses import queries as queries_module
from kvbench.presses.qevict import QEvictPress
from kvbench.presses.quant import QuantPress
from tests.conftest import prefill_into_cache

LAYER = SimpleNamespace(layer_idx=0)


# ---- plain-loop references -------------------------------------------------------------------------------


def reference_min_max(group: torch.Tensor, bits: int):
    """Asymmetric min-max of one group (any shape): codes, fp16 scale, fp16 zero-point, float32 decoding."""
    low, high = group.float().min(), group.float().max()
    scale = ((high - low) / (2**bits - 1)).half()
    if scale == 0:
        scale = torch.tensor(1.0).half()
    zero = low.half()
    codes = ((group.float() - zero.float()) / scale.float()).round().clamp(0, 2**bits - 1)
    return codes, scale, zero, codes * scale.float() + zero.float()


def reference_quant(x: torch.Tensor, bits: int, keys: bool) -> torch.Tensor:
    """KIVI with groups of 32: keys per channel over 32 tokens, values per token over 32 channels (or the
    whole head when 32 does not divide it); the tokens after the last whole group of 32 stay at 16 bits."""
    out = x.to(torch.float16).to(x.dtype).clone()
    batch, heads, length, dim = x.shape
    whole = length // 32 * 32
    size = 32 if dim % 32 == 0 else dim
    for b in range(batch):
        for h in range(heads):
            if keys:
                for start in range(0, whole, 32):
                    for c in range(dim):
                        group = x[b, h, start : start + 32, c]
                        out[b, h, start : start + 32, c] = reference_min_max(group, bits)[3].to(x.dtype)
            else:
                for t in range(whole):
                    for start in range(0, dim, size):
                        group = x[b, h, t, start : start + size]
                        out[b, h, t, start : start + size] = reference_min_max(group, bits)[3].to(x.dtype)
    return out


def reference_quant_bytes(length: int, dim: int, bits: int) -> int:
    """One KV head: codes of whole groups, fp16 scale + zero per key group x channel and value group, and
    the residual tokens at 16 bits."""
    whole = length // 32 * 32
    groups_per_token = dim // (32 if dim % 32 == 0 else dim)
    return (
        2 * whole * dim * bits // 8
        + (whole // 32) * dim * 4
        + whole * groups_per_token * 4
        + (length - whole) * dim * 4
    )


def reference_int4_window(keys: torch.Tensor, values: torch.Tensor):
    """One window (ω, d): keys per channel over the window with channels c and c + d/2 sharing a range
    (RoPE pairs, as the authors' code), values per token. Returns (key codes, value codes, decoded keys,
    decoded values)."""
    window, dim = keys.shape
    key_codes, value_codes = torch.zeros(window, dim), torch.zeros(window, dim)
    decoded_keys, decoded_values = torch.zeros(window, dim), torch.zeros(window, dim)
    for c in range(dim // 2):
        pair = torch.stack([keys[:, c], keys[:, c + dim // 2]])
        _, scale, zero, _ = reference_min_max(pair, 4)
        for channel in (c, c + dim // 2):
            codes = ((keys[:, channel].float() - zero.float()) / scale.float()).round().clamp(0, 15)
            key_codes[:, channel] = codes
            decoded_keys[:, channel] = codes * scale.float() + zero.float()
    for t in range(window):
        value_codes[t], _, _, decoded_values[t] = reference_min_max(values[t], 4)
    return key_codes, value_codes, decoded_keys, decoded_values


class ReferenceQEvict:
    """QEvict on one KV-head group, written as plainly as possible: a list of entries per head, window
    scores as sums, tiers by sorting, every call re-tiering (promote, demote, delete)."""

    def __init__(self, memory, heads, dim, window=8, sinks=4, local_ratio=0.5, quant_ratio=0.1):
        self.memory, self.heads, self.dim, self.window, self.sinks = memory, heads, dim, window, sinks
        self.local_ratio, self.quant_ratio = local_ratio, quant_ratio
        self.entries = [[] for _ in range(heads)]  # dicts: position, score, int4, key, value
        self.length, self.local_start, self.budget = 0, 0, None

    def sizes(self):
        token = 4 * self.dim
        tokens = self.budget / token
        local = int(tokens * self.local_ratio)
        sinks = min(self.sinks, self.length)
        start = sinks
        while self.length - start > local and start + self.window <= self.length:
            start += self.window  # first window boundary leaving at most `local` tokens after it
        self.local_start = max(self.local_start, start)
        rest = self.budget - (sinks + self.length - self.local_start) * token
        assert rest >= 0
        fp_cost = self.window * token + 1
        int4_cost = self.window * self.dim + self.dim * 2 + self.window * 4 + 1
        fp = int(rest * (1 - self.quant_ratio) // fp_cost)
        return sinks, fp, int((rest - fp * fp_cost) // int4_cost)

    def call(self, keys, values, attention):
        """keys/values (heads, n, d) in fp16: the cache as the press returned it plus new entries at the end;
        attention (query heads, new queries, n)."""
        heads, n, dim = keys.shape
        if self.budget is None:
            self.budget = self.memory * n * 4 * dim
        group = attention.shape[0] // heads
        old = len(self.entries[0])
        for h in range(heads):
            entries = self.entries[h]
            for j in range(old, n):
                entries.append(dict(position=self.length + j - old, score=0.0, int4=False))
            for j, entry in enumerate(entries):
                entry["key"], entry["value"] = keys[h, j], values[h, j]
                for q in range(attention.shape[1]):
                    entry["score"] += sum(float(attention[h * group + g, q, j]) for g in range(group)) / group
        self.length += n - old
        sinks, fp, int4 = self.sizes()
        for h in range(heads):
            windows = {}
            for entry in self.entries[h]:
                if sinks <= entry["position"] < self.local_start:
                    windows.setdefault((entry["position"] - sinks) // self.window, []).append(entry)
            ranked = sorted(windows, key=lambda w: (-sum(e["score"] for e in windows[w]), w))
            kept = []
            for rank, w in enumerate(ranked):
                members = windows[w]
                if rank < fp:
                    for e in members:  # promoted: its dequantised values stay, now at 16 bits
                        e["int4"] = False
                    kept += members
                elif rank < fp + min(int4, len(ranked) - fp):
                    if not members[0]["int4"]:  # demoted (or fresh from the local zone): quantise
                        block_k = torch.stack([e["key"] for e in members])
                        block_v = torch.stack([e["value"] for e in members])
                        _, _, decoded_k, decoded_v = reference_int4_window(block_k, block_v)
                        for t, e in enumerate(members):
                            e["key"], e["value"] = decoded_k[t].half(), decoded_v[t].half()
                            e["int4"] = True
                    kept += members
            fixed = [e for e in self.entries[h] if not sinks <= e["position"] < self.local_start]
            self.entries[h] = sorted(fixed + kept, key=lambda e: e["position"])
        out_k = torch.stack([torch.stack([e["key"] for e in entries]) for entries in self.entries])
        out_v = torch.stack([torch.stack([e["value"] for e in entries]) for entries in self.entries])
        return out_k, out_v

    def tiers(self, h):
        return {e["position"]: e["int4"] for e in self.entries[h]}


# ---- quant ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bits", [8, 4, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_quant_matches_the_reference_quantiser(bits, dtype):
    torch.manual_seed(bits)
    keys, values = torch.randn(1, 2, 75, 16).to(dtype), (3 * torch.randn(1, 2, 75, 64) + 1).to(dtype)
    values_16 = values[..., :16]
    press = QuantPress(memory=1.0, bits=bits)
    got_keys, got_values = press.compress(LAYER, None, keys, values_16, None, {})
    assert got_keys.dtype == dtype and got_keys.shape == keys.shape
    assert torch.equal(got_keys, reference_quant(keys, bits, keys=True))
    assert torch.equal(got_values, reference_quant(values_16, bits, keys=False))
    # head_dim 64: values in two groups of 32 channels
    _, got_values = press.compress(LAYER, None, values, values, None, {})
    assert torch.equal(got_values, reference_quant(values, bits, keys=False))


@pytest.mark.parametrize("bits", [8, 4, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_quant_packed_store_holds_the_accounted_bytes_and_gives_back_the_cache(bits, dtype):
    torch.manual_seed(0)
    keys, values = torch.randn(2, 3, 70, 64).to(dtype), torch.randn(2, 3, 70, 64).to(dtype)
    press = QuantPress(memory=1.0, bits=bits)
    got_keys, got_values = press.compress(LAYER, None, keys, values, None, {})
    packed = quant_module.pack(keys, values, bits)
    assert (
        sum(t.nbytes for t in packed.values())
        == press.layer_bytes[0]
        == 6 * reference_quant_bytes(70, 64, bits)
    )
    assert packed["key_codes"].dtype == torch.uint8 and packed["key_scale"].dtype == torch.float16
    assert packed["key_codes"].shape[-1] == 64 * bits // 8  # codes packed several per byte
    unpacked_keys, unpacked_values = quant_module.unpack(packed, dtype)
    assert torch.equal(unpacked_keys, got_keys) and torch.equal(unpacked_values, got_values)


def test_quant_picks_the_widest_bits_that_fit_the_memory():
    length, dim = 100, 64
    full = length * 4 * dim
    fractions = {bits: reference_quant_bytes(length, dim, bits) / full for bits in (8, 4, 2)}
    assert fractions[8] > fractions[4] > fractions[2]
    keys = torch.randn(1, 1, length, dim)
    for memory, expected in [
        (1.0, 8),
        (fractions[8], 8),
        (fractions[8] - 1e-3, 4),
        (fractions[4], 4),
        ((fractions[4] + fractions[2]) / 2, 2),
    ]:
        press = QuantPress(memory=memory)
        press.compress(LAYER, None, keys, keys, None, {})
        assert press.layer_bytes[0] == reference_quant_bytes(length, dim, expected), memory
        assert press.layer_bytes[0] / full <= memory
    with pytest.raises(ValueError) as error:  # 8 bits asked for, only 4 fit
        QuantPress(memory=fractions[4], bits=8).compress(LAYER, None, keys, keys, None, {})
    assert "\n" not in str(error.value) and str(fractions[4]) in str(error.value)


@pytest.mark.parametrize("args", [dict(memory=0.5, bits=3), dict(memory=0.1), dict(memory=0.15, bits=2)])
def test_quant_rejects_bad_bits_and_budgets_it_cannot_meet_in_one_line(args):
    with pytest.raises(ValueError) as error:
        build_press("quant", 0.5, **args)
    assert "\n" not in str(error.value)


def test_quant_raises_when_the_16_bit_residual_breaks_the_budget():
    # 40 tokens: 32 quantised + 8 at 16 bits; at 2 bits that is more than 0.2 of the cache
    keys = torch.randn(1, 1, 40, 64)
    assert reference_quant_bytes(40, 64, 2) / (40 * 4 * 64) > 0.2
    with pytest.raises(ValueError) as error:
        QuantPress(memory=0.2).compress(LAYER, None, keys, keys, None, {})
    assert "\n" not in str(error.value)


# ---- qevict --------------------------------------------------------------------------------------------


def test_qevict_int4_quantiser_matches_the_reference():
    torch.manual_seed(0)
    keys, values = torch.randn(3, 5, 8, 16).half(), torch.randn(3, 5, 8, 16).half()
    codes, scale, zero = qevict_module.quantise_window_keys(keys)
    value_codes, value_scale, value_zero = qevict_module.quantise_token_values(values)
    for row in range(3):
        for w in range(5):
            ref_k, ref_v, ref_dk, ref_dv = reference_int4_window(keys[row, w], values[row, w])
            assert torch.equal(codes[row, w].float(), ref_k) and torch.equal(
                value_codes[row, w].float(), ref_v
            )
            decoded = qevict_module.decode_keys(codes[row, w], scale[row, w], zero[row, w])
            assert torch.equal(decoded, ref_dk)
            decoded = quant_module.decode(
                value_codes[row, w], value_scale[row, w, :, None], value_zero[row, w, :, None]
            )
            assert torch.equal(decoded, ref_dv)


def attention_rows(query_heads, queries, length, first_query, focus=None, seed=0):
    """Causal attention rows that put most mass on the first token (a sink) and spread the rest at random,
    or put `focus`'s share on the entries `focus` names (head -> entry indices)."""
    generator = torch.Generator().manual_seed(seed)
    rows = torch.zeros(query_heads, queries, length)
    for q in range(queries):
        visible = first_query + q + 1
        spread = torch.rand(query_heads, visible, generator=generator)
        rows[:, q, :visible] = 0.2 * spread / spread.sum(-1, keepdim=True)
        rows[:, q, 0] += 0.8
        if focus is not None:
            rows[:, q] *= 0.2
            for head, entries in focus.items():
                rows[head, q, entries] += 0.8 / len(entries)
    return rows


def check_store(press, keys, values):
    packed = qevict_module.pack(press, 0, keys, values)
    assert sum(t.nbytes for t in packed.values()) == press.layer_bytes[0]
    assert packed["key_codes"].dtype == torch.uint8 and packed["key_codes"].shape[-1] == keys.shape[-1] // 2
    unpacked_keys, unpacked_values = qevict_module.unpack(packed, press.sinks, keys.dtype)
    assert torch.equal(unpacked_keys, keys) and torch.equal(unpacked_values, values)


def test_qevict_tiers_promotes_and_demotes_as_the_reference_does():
    torch.manual_seed(0)
    heads, group, dim, length, memory = 2, 2, 8, 120, 0.5
    press = QEvictPress(memory=memory)
    reference = ReferenceQEvict(memory, heads, dim)
    keys, values = torch.randn(1, heads, length, dim).half(), torch.randn(1, heads, length, dim).half()
    attention = attention_rows(heads * group, length, length, 0)
    got_keys, got_values = press.compress(LAYER, None, keys, values, attention[None], {})
    ref_keys, ref_values = reference.call(keys[0], values[0], attention)
    assert torch.equal(got_keys[0], ref_keys) and torch.equal(got_values[0], ref_values)
    check_store(press, got_keys, got_values)
    budget = memory * length * 4 * dim * heads
    assert press.layer_bytes[0] <= budget
    before = [reference.tiers(h) for h in range(heads)]
    assert all(any(tiers.values()) for tiers in before)  # some int4 windows
    assert all(len(tiers) < length for tiers in before)  # and some deleted

    # Second call: 8 new tokens whose queries look at one int4 window of each head.
    focus = {}
    for h in range(heads):
        int4 = sorted(p for p, quantised in before[h].items() if quantised)
        positions = sorted(before[h])
        focus_positions = int4[:8]
        for g in range(group):
            focus[h * group + g] = [positions.index(p) for p in focus_positions]
    n = got_keys.shape[2] + 8
    keys = torch.cat([got_keys, torch.randn(1, heads, 8, dim).half()], dim=2)
    values = torch.cat([got_values, torch.randn(1, heads, 8, dim).half()], dim=2)
    attention = attention_rows(heads * group, 8, n, n - 8, focus=focus, seed=1)
    got_keys, got_values = press.compress(LAYER, None, keys, values, attention[None], {})
    ref_keys, ref_values = reference.call(keys[0], values[0], attention)
    assert torch.equal(got_keys[0], ref_keys) and torch.equal(got_values[0], ref_values)
    check_store(press, got_keys, got_values)
    assert press.layer_bytes[0] <= budget
    after = [reference.tiers(h) for h in range(heads)]
    expected = {"promoted": 0, "demoted": 0}
    for h in range(heads):
        promoted = [p for p in before[h] if before[h][p] and p in after[h] and not after[h][p]]
        demoted = [p for p in before[h] if not before[h][p] and after[h].get(p)]
        assert promoted and demoted, h
        expected["promoted"] += len(promoted)
        expected["demoted"] += len(demoted)
        # the press's own state says the same
        state = press.states[0]
        state_tiers = dict(zip(state.positions[h].tolist(), state.quantised[h].tolist(), strict=True))
        assert state_tiers == after[h]
    # its count of re-tiered entries is the reference's (the first call's quantising is no demotion)
    assert press.retiered == expected

    # Third call: 24 more tokens with no focus; windows leave the local zone and compete.
    n = got_keys.shape[2] + 24
    keys = torch.cat([got_keys, torch.randn(1, heads, 24, dim).half()], dim=2)
    values = torch.cat([got_values, torch.randn(1, heads, 24, dim).half()], dim=2)
    attention = attention_rows(heads * group, 24, n, n - 24, seed=2)
    got_keys, got_values = press.compress(LAYER, None, keys, values, attention[None], {})
    ref_keys, ref_values = reference.call(keys[0], values[0], attention)
    assert torch.equal(got_keys[0], ref_keys) and torch.equal(got_values[0], ref_values)
    check_store(press, got_keys, got_values)
    assert press.layer_bytes[0] <= budget


@pytest.mark.parametrize("memory", [0.5, 0.25, 0.1])
def test_qevict_budget_split_and_bytes_fit(memory):
    torch.manual_seed(0)
    heads, dim, length = 2, 16, 400
    keys, values = torch.randn(1, heads, length, dim), torch.randn(1, heads, length, dim)
    attention = torch.rand(1, heads * 2, length, length).tril()
    press = QEvictPress(memory=memory)
    got_keys, got_values = press.compress(LAYER, None, keys, values, attention, {})
    reference = ReferenceQEvict(memory, heads, dim)
    reference.budget, reference.length = memory * length * 4 * dim, length
    sinks, fp, int4 = reference.sizes()
    state = press.states[0]
    assert int(state.quantised[0].sum()) == int4 * 8
    assert got_keys.shape[2] == sinks + (fp + int4) * 8 + length - reference.local_start
    check_store(press, got_keys, got_values)
    assert press.layer_bytes[0] <= memory * length * 4 * dim * heads


def test_qevict_rejects_a_budget_below_the_sinks_and_local_zone_in_one_line():
    keys = torch.randn(1, 1, 40, 16)
    with pytest.raises(ValueError) as error:
        QEvictPress(memory=0.1).compress(LAYER, None, keys, keys, torch.rand(1, 2, 40, 40), {})
    assert "\n" not in str(error.value) and "0.1" in str(error.value)
    for bad in [dict(memory=0.0), dict(memory=1.5), dict(memory=0.5, local_ratio=2)]:
        with pytest.raises(ValueError):
            build_press("qevict", 0.5, **bad)


# ---- real prefills of the tiny models --------------------------------------------------------------------


@torch.no_grad()
def prefill(model, press, ids):
    return prefill_into_cache(model, press, ids)


def full_bytes(cache):
    return sum(layer.keys.numel() + layer.values.numel() for layer in cache.layers) * 2


def test_quant_compresses_a_prefill_closer_at_more_bits(tiny_model_dir):
    model, _ = load_model(tiny_model_dir)
    ids = torch.randint(3, 1000, (1, 150), generator=torch.Generator().manual_seed(0))
    reference = prefill(model, None, ids)
    errors = {}
    for bits in (8, 4, 2):
        press = build_press("quant", 0.0, memory=1.0, bits=bits)
        cache = prefill(model, press, ids)
        assert sum(press.layer_bytes.values()) <= full_bytes(reference)
        error, norm = 0.0, 0.0
        for got, full in zip(cache.layers, reference.layers, strict=True):
            assert got.keys.shape == full.keys.shape
            error += (got.keys - full.keys).norm() ** 2 + (got.values - full.values).norm() ** 2
            norm += full.keys.norm() ** 2 + full.values.norm() ** 2
        errors[bits] = float((error / norm).sqrt())
    assert 0 < errors[8] < errors[4] < errors[2]


@pytest.mark.parametrize("eager", [False, True])
def test_qevict_compresses_a_prefill_keeping_16_bit_entries_exact(tiny_model_dir, eager):
    model, _ = load_model(tiny_model_dir, attn_implementation="eager" if eager else None)
    ids = torch.randint(3, 1000, (1, 300), generator=torch.Generator().manual_seed(0))
    reference = prefill(model, None, ids)
    press = build_press("qevict", 0.0, memory=0.25, scored_queries="all")
    cache = prefill(model, press, ids)
    assert sum(press.layer_bytes.values()) <= 0.25 * full_bytes(reference)
    for layer_idx, (got, full) in enumerate(zip(cache.layers, reference.layers, strict=True)):
        state = press.states[layer_idx]
        assert got.keys.shape[2] < full.keys.shape[2]
        originals = qevict_module.gather_entries(full.keys, state.positions)
        kept = got.keys.view(originals.shape)
        sixteen_bit = ~state.quantised
        assert state.quantised.any() and sixteen_bit.any()
        assert torch.equal(kept[sixteen_bit], originals[sixteen_bit].half().float())
        # int4 entries: within half a step of their channel pair's scale
        step = qevict_module.paired(state.key_scale).float()
        bound = step / 2 * 1.01 + 1e-3 * originals.abs() + 1e-6  # + the 16-bit rounding before quantising
        assert ((kept - originals).abs() <= bound)[state.quantised].all()
        check = qevict_module.pack(press, layer_idx, got.keys, got.values)
        assert sum(t.nbytes for t in check.values()) == press.layer_bytes[layer_idx]
    if eager:
        return
    # Scores computed from the queries match the ones from eager attention weights.
    eager_model, _ = load_model(tiny_model_dir, attn_implementation="eager")
    eager_press = build_press("qevict", 0.0, memory=0.25)
    prefill(eager_model, eager_press, ids)
    for layer_idx, state in press.states.items():
        assert torch.allclose(state.scores, eager_press.states[layer_idx].scores, rtol=1e-3, atol=1e-4)


@torch.no_grad()
def test_qevict_scores_decoded_tokens_with_their_own_rope_positions(tiny_model_dir):
    """At decode time a layer sees the last step's RoPE embeddings only; the press rebuilds those of the
    buffered tokens from cache_position, and scores them as if it had been given them."""
    model, _ = load_model(tiny_model_dir)
    module = model.model.layers[0].self_attn
    module.rotary_emb = model.model.rotary_emb
    torch.manual_seed(0)
    hidden = torch.randn(1, 8, model.config.hidden_size)
    keys = torch.randn(1, 2, 40, 16)
    positions = torch.arange(32, 40)
    cos, sin = model.model.rotary_emb(hidden, positions.unsqueeze(0))
    key_positions = torch.arange(40).expand(1, 2, -1)
    given = dict(position_embeddings=(cos, sin), cache_position=positions)
    last_step = dict(position_embeddings=(cos[:, -1:], sin[:, -1:]), cache_position=positions[-1:])
    scores = qevict_module.received_attention(module, hidden, keys, None, key_positions, positions, given)
    rebuilt = qevict_module.received_attention(
        module, hidden, keys, None, key_positions, positions, last_step
    )
    assert torch.allclose(scores, rebuilt) and torch.allclose(scores.sum(-1), torch.full((1, 2), 8.0))


def reference_received_attention(module, hidden, keys, key_positions, query_positions, cos, sin, weight=None):
    """Dense: every query's masked softmax over every entry, averaged over the query heads of a KV head,
    summed over the queries (each times its `weight`, default 1), in float64."""
    batch, kv_heads, n, head_dim = keys.shape
    queries = module.q_proj(hidden).view(batch, len(query_positions), -1, head_dim).transpose(1, 2)
    queries = queries * cos.unsqueeze(1) + rotate_half(queries) * sin.unsqueeze(1)
    queries = queries.double().view(batch, kv_heads, -1, len(query_positions), head_dim)
    logits = torch.einsum("bhgqd,bhnd->bhgqn", queries, keys.double()) / head_dim**0.5
    future = key_positions.view(batch, kv_heads, 1, 1, n) > query_positions.view(1, 1, 1, -1, 1)
    per_query = logits.masked_fill(future, float("-inf")).softmax(-1).mean(2)
    weight = torch.ones(len(query_positions)) if weight is None else weight
    return (per_query * weight.double().view(1, 1, -1, 1)).sum(2)


@torch.no_grad()
@pytest.mark.parametrize("chunk", [3, 5, 512])
@pytest.mark.parametrize("prefill", [True, False])
def test_qevict_chunked_scores_match_a_dense_reference(tiny_model_dir, monkeypatch, chunk, prefill):
    """Chunk by chunk the scores leave out the entries no query of the chunk sees and mask only those some
    query does not see: the dense masked softmax's, at a prefill and on a compressed cache whose KV heads
    keep different positions."""
    monkeypatch.setattr(queries_module, "QUERY_CHUNK", chunk)
    model, _ = load_model(tiny_model_dir)
    module = model.model.layers[0].self_attn
    torch.manual_seed(0)
    count = 24 if prefill else 8
    kept = [torch.randperm(30)[:12].sort().values for _ in range(2)]
    old = torch.stack([torch.cat([k, torch.arange(32, 40)]) for k in kept]).unsqueeze(0)
    key_positions = torch.arange(24).expand(1, 2, -1) if prefill else old
    query_positions = torch.arange(24) if prefill else torch.arange(32, 40)
    hidden = torch.randn(1, count, model.config.hidden_size)
    keys = torch.randn(1, 2, key_positions.shape[2], 16)
    cos, sin = model.model.rotary_emb(hidden, query_positions.unsqueeze(0))
    given = dict(position_embeddings=(cos, sin), cache_position=query_positions)
    scores = qevict_module.received_attention(
        module, hidden, keys, None, key_positions, query_positions, given
    )
    expected = reference_received_attention(module, hidden, keys, key_positions, query_positions, cos, sin)
    torch.testing.assert_close(scores, expected.float(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("count", [2, 7, 64, 65, 300, 4096])
@pytest.mark.parametrize("scored", [2, 3, 8, 64, "all"])
def test_query_sample_stands_for_every_query_once(count, scored):
    """Each scored query stands for itself and the unscored ones just before it (its stratum): the indices
    are the running sum of what they stand for, minus one; the last scored // 2 stand for themselves; the
    strata differ in size by at most one."""
    index, stands_for = queries_module.query_sample(count, scored)
    expected = count if scored == "all" else min(count, scored)
    assert len(index) == expected and stands_for.sum() == count
    assert torch.equal(index, stands_for.long().cumsum(0) - 1)
    if scored != "all" and count > scored:
        assert torch.equal(stands_for[-(scored // 2) :], torch.ones(scored // 2))
        strata = stands_for[: scored - scored // 2]
        assert strata.max() - strata.min() <= 1 and strata.min() >= 1


@torch.no_grad()
def test_qevict_sampled_scores_are_the_weighted_sum_over_the_sample(tiny_model_dir, monkeypatch):
    """A 40-query prefill scored with 6 queries (in chunks of 4): each entry's score is the dense reference's
    attention of the sampled queries, each times the queries it stands for, not the sum over every query."""
    monkeypatch.setattr(queries_module, "QUERY_CHUNK", 4)
    model, _ = load_model(tiny_model_dir)
    module = model.model.layers[0].self_attn
    torch.manual_seed(1)
    positions = torch.arange(40)
    hidden = torch.randn(1, 40, model.config.hidden_size)
    keys = torch.randn(1, 2, 40, 16)
    key_positions = positions.expand(1, 2, -1)
    cos, sin = model.model.rotary_emb(hidden, positions.unsqueeze(0))
    given = dict(position_embeddings=(cos, sin), cache_position=positions)
    scores = qevict_module.received_attention(module, hidden, keys, None, key_positions, positions, given, 6)
    index, stands_for = queries_module.query_sample(40, 6)
    weight = torch.zeros(40).index_put_((index,), stands_for)
    expected = reference_received_attention(module, hidden, keys, key_positions, positions, cos, sin, weight)
    torch.testing.assert_close(scores, expected.float(), rtol=1e-5, atol=1e-6)
    exact = reference_received_attention(module, hidden, keys, key_positions, positions, cos, sin)
    assert not torch.allclose(scores, exact.float(), rtol=1e-2)
    torch.testing.assert_close(scores.sum(-1), torch.full((1, 2), 40.0))  # each query spreads one unit


@pytest.mark.parametrize("bad", ["1", "0", "-2", "some", "2.5"])
def test_qevict_scored_queries_must_be_all_or_at_least_two(bad):
    from kvbench.core.errors import BadInput
    from kvbench.presses import parse_press_args

    with pytest.raises(BadInput, match="scored_queries"):
        build_press("qevict", 0.0, memory=0.5, **parse_press_args([f"scored_queries={bad}"]))
