from types import SimpleNamespace

import pytest
import torch
from kvpress import ScorerPress
from kvpress.utils import compute_n_kept
from transformers import DynamicCache

import kvbench.presses as registry
from kvbench import models
from kvbench.models import load_model
from kvbench.presses import PRESSES, UnknownPress, build_press, check_press_runnable, parse_press_args
from kvbench.presses.h2o import H2OPress

# Presses that need something this machine lacks (hub files, trained weights or a calibration made for
# the model: tested in test_kvp*, test_distillcache, test_memdecay).
NOT_OFFLINE = {name for name, spec in PRESSES.items() if "hub" in spec.needs} | {
    "kvp",
    "distillcache",
    "memdecay",
    "none",
}
OFFLINE = sorted(set(PRESSES) - NOT_OFFLINE)


@pytest.mark.parametrize("name", OFFLINE)
def test_every_offline_press_compresses_a_prefill(name, tiny_model_dir):
    eager = registry.needs_eager(name)
    model, tokenizer = load_model(tiny_model_dir, attn_implementation="eager" if eager else None)
    press = build_press(name, 0.5)
    torch.manual_seed(0)
    ids = torch.randint(3, 1000, (1, 200))
    cache = DynamicCache()
    with press(model):
        model.model(input_ids=ids, past_key_values=cache)
    lengths = [cache.layers[i].keys.shape[2] for i in range(len(cache))]
    if isinstance(press, ScorerPress) and name not in {"pyramidkv"}:
        # Plain scorers keep exactly int(L * (1 - r)) entries in every layer and head.
        assert lengths == [compute_n_kept(200, 0.5)] * len(lengths)
    elif name == "think":  # zeroes key channels, keeps every token
        zero_channels = (cache.layers[0].keys == 0).all(dim=2).sum()
        assert lengths == [200] * len(lengths) and zero_channels > 0
    elif name == "decoding":  # compresses only while decoding
        assert lengths == [200] * len(lengths)
    else:
        assert lengths, name


def test_pyramidkv_budgets_shrink_with_depth_and_average_to_the_ratio(tiny_model_dir):
    model, _ = load_model(tiny_model_dir)
    cache = DynamicCache()
    with build_press("pyramidkv", 0.5)(model):
        model.model(input_ids=torch.randint(3, 1000, (1, 400)), past_key_values=cache)
    lengths = [layer.keys.shape[2] for layer in cache.layers]
    assert lengths[0] > lengths[-1]


def h2o_inputs(length=10, kv_heads=2, group=2, dim=8):
    torch.manual_seed(1)
    logits = torch.randn(1, kv_heads * group, length, length)
    causal = torch.ones(length, length).tril().bool()
    attentions = logits.masked_fill(~causal, float("-inf")).softmax(-1)
    keys = torch.randn(1, kv_heads, length, dim)
    return SimpleNamespace(head_dim=dim), keys, keys.clone() * 2, attentions


def test_h2o_keeps_the_recent_window_plus_the_heavy_hitters():
    module, keys, values, attentions = h2o_inputs()
    press = H2OPress(compression_ratio=0.5)  # keep 5 of 10: 2 recent + 3 heavy hitters
    kept_keys, _ = press.compress(module, None, keys, values, attentions, {})
    accumulated = attentions.sum(2).view(1, 2, 2, 10).sum(2)  # by hand: received attention per KV head
    for head in range(2):
        heavy = accumulated[0, head, :8].topk(3).indices.tolist()
        expected = sorted(heavy + [8, 9])
        kept = sorted(int(torch.nonzero((keys[0, head] == row).all(-1))[0]) for row in kept_keys[0, head])
        assert kept == expected


def test_h2o_recent_fraction_splits_the_budget():
    module, keys, values, attentions = h2o_inputs()
    only_recent = H2OPress(compression_ratio=0.5, recent_fraction=1.0)
    kept, _ = only_recent.compress(module, None, keys, values, attentions, {})
    assert torch.equal(kept.sort(dim=2).values, keys[:, :, 5:].sort(dim=2).values)
    with pytest.raises(ValueError):
        H2OPress(compression_ratio=0.5, recent_fraction=1.5)


def test_h2o_without_attention_weights_says_to_use_eager():
    module, keys, values, _ = h2o_inputs()
    with pytest.raises(ValueError, match="eager"):
        H2OPress(compression_ratio=0.5).compress(module, None, keys, values, None, {})


def test_press_args_are_typed_and_reach_the_press():
    assert parse_press_args(["window_size=32", "inner=tova", "x=0.5", "flag=true"]) == {
        "window_size": 32,
        "inner": "tova",
        "x": 0.5,
        "flag": True,
    }
    assert build_press("snapkv", 0.25, window_size=32).window_size == 32
    wrapped = build_press("adakv", 0.5, inner="tova")
    assert type(wrapped.press).__name__ == "TOVAPress" and wrapped.press.compression_ratio == 0.5
    with pytest.raises(ValueError, match="key=value"):
        parse_press_args(["window_size"])


@pytest.mark.parametrize(
    "call, error",
    [
        (lambda: build_press("nope", 0.5), UnknownPress),
        (lambda: build_press("snapkv", 1.0), ValueError),
        (lambda: build_press("snapkv", -0.1), ValueError),
        (lambda: build_press("snapkv", 0.5, no_such_arg=1), ValueError),
        (lambda: build_press("adakv", 0.5, inner="none"), UnknownPress),
    ],
)
def test_bad_press_requests_are_one_line_errors(call, error):
    with pytest.raises(error) as info:
        call()
    assert "\n" not in str(info.value)


def test_hub_presses_fail_before_work_when_the_hub_is_unreachable(monkeypatch):
    monkeypatch.setattr(models, "hub_reachable", lambda timeout=3.0: False)
    with pytest.raises(UnknownPress, match="hub"):
        check_press_runnable("qfilter")
    check_press_runnable("snapkv")  # offline presses never ask
