"""VarRate and its uniform-rank ablation against references written here: the water level found by plain
event-by-event filling, the truncation as an explicit projection on SVD directions, and the byte count of
really packed tensors."""

import math
from types import SimpleNamespace

import pytest
import torch
from transformers import DynamicCache

from kvbench.bridge.models import load_model
from kvbench.presses import PRESSES, build_press
from kvbench.presses.lowrank import Layout, LowRankPress, VarRatePress

HEADS, DIM = 2, 8


def reference_bytes(ranks, heads, protected, key_dim, value_dim, indexed):
    """The accounting, spelled out: 2 bytes per stored 16-bit number, 1 byte per rank index."""
    columns = max((r for head in ranks for r in head), default=0)
    n = 0
    for head in ranks:
        for r in head:
            n += r * 2 + r * 2  # key coefficients + value coefficients
            n += 1 if indexed else 0  # its rank index
    n += heads * columns * key_dim * 2 + heads * columns * value_dim * 2  # the bases
    n += heads * protected * (key_dim + value_dim) * 2  # sinks and window at 16 bits
    return n


def reference_water_filling(salience, floor, top, cost, budget):
    """Raise the water level λ event by event (a token's rank r_t = floor + λ s_t crossing an integer) and
    stop before the first level whose ranks do not fit."""
    ranks = [[floor] * len(head) for head in salience]
    events = sorted(
        ((k - floor) / s, h, t)
        for h, head in enumerate(salience)
        for t, s in enumerate(head)
        if s > 0
        for k in range(floor + 1, top + 1)
    )
    i = 0
    while i < len(events):
        level = events[i][0]
        trial = [list(head) for head in ranks]
        while i < len(events) and events[i][0] == level:
            _, h, t = events[i]
            trial[h][t] += 1
            i += 1
        if cost(trial) > budget:
            break
        ranks = trial
    return ranks


def layout(length=60, sinks=4, window=8, indexed=True):
    return Layout(HEADS, length, sinks, window, DIM, DIM, indexed)


@pytest.mark.parametrize("memory", [0.95, 0.75, 0.6, 0.5])
def test_water_filling_matches_the_reference_and_fills_the_budget(memory):
    torch.manual_seed(0)
    shape = layout()
    salience = torch.rand(HEADS, shape.n_middle, dtype=torch.float64) ** 3  # skewed, like attention
    press = VarRatePress(memory=memory, min_rank=2)
    budget = int(memory * shape.full)
    ranks = press.allocate(salience, shape, DIM, budget)

    def cost(r):
        return reference_bytes(r, HEADS, 12, DIM, DIM, True)

    expected = reference_water_filling(salience.tolist(), 2, DIM, cost, budget)
    assert ranks.tolist() == expected
    assert cost(expected) <= budget == int(memory * 60 * HEADS * 2 * DIM * 2)
    # Fills: the next level up (the first token to gain a rank) no longer fits, unless all are at the top.
    below_top = ranks < DIM
    if below_top.any():
        next_level = ((ranks + 1 - 2) / salience)[below_top].min()
        raised = ranks + (below_top & torch.isclose((ranks + 1 - 2) / salience, next_level)).long()
        assert cost(raised.tolist()) > budget
    # More salient tokens never get a lower rank, across the heads of the layer.
    order = salience.flatten().argsort()
    assert (ranks.flatten()[order].diff() >= 0).all()
    assert ranks.min() >= 2 and ranks.max() <= DIM


def test_uniform_rank_is_the_largest_that_fits():
    shape = layout(indexed=False)
    for memory in (1.0, 0.7, 0.5, 0.35):
        budget = int(memory * shape.full)
        ranks = LowRankPress(memory=memory).allocate(None, shape, DIM, budget)
        fits = [
            r
            for r in range(1, DIM + 1)
            if reference_bytes([[r] * 48] * HEADS, HEADS, 12, DIM, DIM, False) <= budget
        ]
        assert ranks.unique().tolist() == [fits[-1]]


def reference_truncation(matrix, ranks):
    """One head (tokens, dim): keep the projection of token t on the top ranks[t] right singular vectors."""
    _, _, vh = torch.linalg.svd(matrix.double(), full_matrices=False)
    out = torch.zeros_like(matrix, dtype=torch.float64)
    for t, r in enumerate(ranks):
        for i in range(r):
            out[t] += torch.dot(matrix[t].double(), vh[i]) * vh[i]
    return out


def test_truncation_matches_the_reference_projection():
    torch.manual_seed(0)
    keys, values = torch.randn(1, HEADS, 60, DIM), torch.randn(1, HEADS, 60, DIM) * 3
    shape = layout()
    ranks = torch.randint(1, DIM + 1, (HEADS, shape.n_middle))
    store = VarRatePress(memory=1.0).encode(keys[0], values[0], ranks, shape)
    restored_keys, restored_values = store.unpack(torch.float32)
    for original, restored in ((keys, restored_keys), (values, restored_values)):
        for h in range(HEADS):
            expected = reference_truncation(original[0, h, 4:52], ranks[h].tolist())
            scale = original.abs().max()
            assert torch.allclose(restored[h, 4:52].double(), expected, atol=2e-3 * scale)
            # Sinks and window are stored as they are (at 16 bits).
            assert torch.equal(restored[h, :4], original[0, h, :4].half().float())
            assert torch.equal(restored[h, 52:], original[0, h, 52:].half().float())


def capture_layer(model, ids, layer_idx=0):
    """What a press receives at one layer of a real prefill."""
    seen = {}

    def hook(module, args, kwargs, output):
        layer = kwargs["past_key_values"].layers[layer_idx]
        seen.update(module=module, hidden_states=kwargs["hidden_states"], kwargs=dict(kwargs))
        seen.update(keys=layer.keys.clone(), values=layer.values.clone())

    handle = model.model.layers[layer_idx].self_attn.register_forward_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            model.model(input_ids=ids, past_key_values=DynamicCache())
    finally:
        handle.remove()
    return seen


@pytest.mark.parametrize(
    "name, memory", [("varrate", 0.5), ("varrate", 0.8), ("lowrank", 0.3), ("lowrank", 1.1)]
)
def test_packed_store_holds_the_accounted_bytes_and_unpacks_to_what_compress_returns(
    tiny_model_dir, name, memory
):
    model, _ = load_model(tiny_model_dir)
    torch.manual_seed(0)
    seen = capture_layer(model, torch.randint(3, 1000, (1, 150)))
    press = build_press(name, 0.0, memory=memory)
    args = (seen["module"], seen["hidden_states"], seen["keys"], seen["values"])
    before = seen["keys"].clone(), seen["values"].clone()
    with torch.no_grad():
        keys, values = press.compress(*args[:2], seen["keys"], seen["values"], None, seen["kwargs"])
        (store,) = press.pack(*args, seen["kwargs"])
    assert torch.equal(seen["keys"], before[0]) and torch.equal(seen["values"], before[1])  # never written
    assert store.nbytes == press.layer_bytes[0] <= memory * 150 * 2 * (16 + 16) * 2
    unpacked_keys, unpacked_values = store.unpack(keys.dtype)
    assert torch.equal(unpacked_keys, keys[0]) and torch.equal(unpacked_values, values[0])
    assert store.key_coefficients.dtype == torch.float16 and store.key_basis.dtype == torch.float16
    if name == "varrate":
        assert store.ranks.dtype == torch.uint8 and store.ranks.shape == (2, 150 - 36)
        assert store.key_coefficients.numel() == int(store.ranks.long().sum())
    else:
        assert store.ranks is None
    ranks = store.ranks.long().tolist() if store.ranks is not None else [[store.key_basis.shape[2]] * 114] * 2
    assert store.nbytes == reference_bytes(ranks, 2, 36, 16, 16, name == "varrate")


@pytest.mark.parametrize(
    "name, memories", [("varrate", [1.2, 0.8, 0.6, 0.45]), ("lowrank", [1.2, 0.6, 0.35, 0.2])]
)
def test_a_real_prefill_keeps_every_token_and_loses_more_as_memory_shrinks(tiny_model_dir, name, memories):
    model, _ = load_model(tiny_model_dir)
    torch.manual_seed(0)
    ids = torch.randint(3, 1000, (1, 300))
    full = DynamicCache()
    with torch.no_grad():
        model.model(input_ids=ids, past_key_values=full)
    errors = []
    for memory in memories:
        press, cache = build_press(name, 0.0, memory=memory), DynamicCache()
        with torch.no_grad(), press(model):
            model.model(input_ids=ids, past_key_values=cache)
        assert [layer.keys.shape[2] for layer in cache.layers] == [300] * len(cache.layers)
        full_bytes = 300 * 2 * (16 + 16) * 2
        assert all(0 < press.layer_bytes[i] <= memory * full_bytes for i in range(len(cache.layers)))
        errors.append(
            max(
                (torch.cat([c.keys, c.values]) - torch.cat([f.keys, f.values])).norm().item()
                / torch.cat([f.keys, f.values]).norm().item()
                for c, f in zip(cache.layers, full.layers, strict=True)
            )
        )
    assert errors[0] < 1e-2  # enough memory for every rank: only the 16-bit rounding is lost
    assert errors == sorted(errors) and errors[-1] > 10 * errors[0]


def test_codecs_are_registered_as_memory_presses():
    for name in ("varrate", "lowrank"):
        assert PRESSES[name].codec
        press = build_press(name, 0.6)  # memory = 1 - ratio when only a ratio is given
        assert math.isclose(press.memory, 0.4) and type(press).shares_prefill
    assert build_press("varrate", 0.0, memory=0.3, min_rank=2).min_rank == 2


def test_varrate_lowers_its_rank_floor_to_meet_a_small_budget(tiny_model_dir):
    model, _ = load_model(tiny_model_dir)
    press = build_press("varrate", 0.0, memory=0.3)  # rank 4 everywhere alone would need more
    with press(model):
        model.model(input_ids=torch.randint(3, 1000, (1, 200)), past_key_values=DynamicCache())
    full = 200 * model.config.num_key_value_heads * 16 * 2 * 2
    assert all(0 < stored <= 0.3 * full for stored in press.layer_bytes.values())


@pytest.mark.parametrize("name, memory", [("varrate", 0.15), ("lowrank", 0.02)])
def test_an_unmeetable_memory_is_a_one_line_error(tiny_model_dir, name, memory):
    model, _ = load_model(tiny_model_dir)
    press = build_press(name, 0.0, memory=memory)
    with pytest.raises(ValueError, match=f"{name}: memory {memory}") as info, press(model):
        model.model(input_ids=torch.randint(3, 1000, (1, 200)), past_key_values=DynamicCache())
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "name, args", [("varrate", dict(memory=0)), ("lowrank", dict(rank=0)), ("varrate", dict(kernel_size=4))]
)
def test_bad_codec_arguments_are_one_line_errors(name, args):
    with pytest.raises(ValueError) as info:
        build_press(name, 0.0, **args)
    assert "\n" not in str(info.value)


def test_a_context_of_only_sinks_and_window_cannot_shrink():
    press = LowRankPress(memory=0.5)
    keys = torch.randn(1, HEADS, 30, DIM)
    with pytest.raises(ValueError, match="sinks or window"):
        press.pack(SimpleNamespace(layer_idx=0), None, keys, keys, {})
    keys_out, _ = LowRankPress(memory=1.0).compress(SimpleNamespace(layer_idx=0), None, keys, keys, None, {})
    assert torch.equal(keys_out, keys.half().float())
