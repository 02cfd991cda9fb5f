"""VarRate's variants (issue 28 item 3): keys fitted before RoPE and re-rotated, one λ per KV head; the
defaults untouched, the budgets kept, bad values refused."""

import pytest
import torch
from transformers import DynamicCache

from kvbench.bridge.models import load_model
from kvbench.presses import build_press
from kvbench.presses.lowrank import rope_tables, rotate


def capture_layer(model, ids, layer_idx=0):
    seen = {}

    def hook(module, args, kwargs, output):
        layer = kwargs["past_key_values"].layers[layer_idx]
        seen.update(module=module, hidden_states=kwargs["hidden_states"], kwargs=dict(kwargs))
        seen.update(keys=layer.keys.clone(), values=layer.values.clone())

    model.model.layers[layer_idx].self_attn.rotary_emb = model.model.rotary_emb
    handle = model.model.layers[layer_idx].self_attn.register_forward_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            model.model(input_ids=ids, past_key_values=DynamicCache())
    finally:
        handle.remove()
    return seen


@pytest.fixture(scope="module")
def layer(tiny_model_dir):
    model, _ = load_model(tiny_model_dir)
    torch.manual_seed(0)
    return capture_layer(model, torch.randint(3, 1000, (1, 150)))


def compress(press, seen):
    with torch.no_grad():
        return press.compress(
            seen["module"], seen["hidden_states"], seen["keys"], seen["values"], None, seen["kwargs"]
        )


def test_rope_undone_is_the_cached_keys_rotated_back(layer):
    cos, sin = rope_tables(layer["module"], layer["keys"])
    back = rotate(layer["keys"], cos, sin, inverse=True)
    assert torch.allclose(rotate(back, cos, sin), layer["keys"], atol=1e-5)
    assert not torch.allclose(back, layer["keys"], atol=1e-3)
    # What the cache holds at position 0 is not rotated at all.
    assert torch.allclose(back[:, :, 0], layer["keys"][:, :, 0], atol=1e-6)


@pytest.mark.parametrize("name", ["lowrank", "varrate"])
def test_pre_rope_basis_costs_the_same_bytes_and_is_exact_at_full_rank(layer, name):
    post, pre = (build_press(name, 0.0, memory=0.5, basis=b) for b in ("post-rope", "pre-rope"))
    post_keys, _ = compress(post, layer)
    pre_keys, pre_values = compress(pre, layer)
    assert pre.layer_bytes[0] == post.layer_bytes[0]
    assert pre_keys.shape == layer["keys"].shape and not torch.allclose(pre_keys, post_keys)
    # Sinks are stored as they are: only the 16-bit rounding of the rotated-back keys differs.
    assert torch.allclose(pre_keys[:, :, :4], post_keys[:, :, :4], atol=2e-3)
    full = build_press(name, 0.0, memory=1.2, basis="pre-rope")
    keys, values = compress(full, layer)
    assert torch.allclose(keys, layer["keys"], atol=2e-2, rtol=2e-2)


def test_per_head_lambda_stays_within_the_layer_budget_and_differs_from_the_shared_one(layer):
    full_bytes = 150 * 2 * (16 + 16) * 2
    for memory in (0.45, 0.6, 0.8):
        shared = build_press("varrate", 0.0, memory=memory)
        per_head = build_press("varrate", 0.0, memory=memory, share="head")
        compress(shared, layer)
        keys, _ = compress(per_head, layer)
        assert 0 < per_head.layer_bytes[0] <= memory * full_bytes
        assert keys.shape == layer["keys"].shape
    assert build_press("varrate", 0.0).share == "layer" and build_press("lowrank", 0.0).basis == "post-rope"


@pytest.mark.parametrize(("name", "args"), [("lowrank", {"basis": "prerope"}), ("varrate", {"share": "x"})])
def test_bad_variant_values_are_refused(name, args):
    with pytest.raises(ValueError, match="needs"):
        build_press(name, 0.0, memory=0.5, **args)
