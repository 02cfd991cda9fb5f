import contextlib
import functools
from types import SimpleNamespace

import pytest
import torch
from kvpress import ScorerPress
from kvpress.utils import compute_n_kept
from transformers import DynamicCache

import kvbench.presses as registry
from kvbench.bridge import adapter, models
from kvbench.bridge.models import load_model
from kvbench.learned.fitted import METHODS as FITTED
from kvbench.presses import PRESSES, UnknownPress, build_press, check_press_runnable, parse_press_args
from kvbench.presses.h2o import H2OPress

# Presses that need something this machine lacks (hub files, trained weights or a calibration made for
# the model: tested in test_kvp*, test_distillcache, test_memdecay, test_gate), and those set by a knob of
# their own at ratio 0 (dms, simlayerkv, per_layer_compression: tested in test_kvpress_presses).
# Learned and fitted presses need state fitted for the tiny model: tests/learned/test_fitted_presses.py and
# the learned presses' own tests run them.
NOT_OFFLINE = (
    {name for name, spec in PRESSES.items() if "hub" in spec.needs or spec.knob}
    | set(FITTED)
    | {
        "kvp",
        "distillcache",
        "memdecay",
        "gate",
        "none",
    }
)
OFFLINE = sorted(set(PRESSES) - NOT_OFFLINE)


# What each press that is not a plain scorer does to a prefill of 200 tokens at ratio (or memory) 0.5.
# Keep every entry and mask half of them, with budgets per head (and per layer for kvzip's and kvgrad's).
HEAD_MASKS = {"adakv", "andpro", "critical_adakv", "kvzip", "kvgrad"}
WHOLE_CHUNKS = {"chunkkv", "entropy_gated_chunkkv", "block", "chunk"}  # drop entries, keep the rest whole
CODECS = {"quant", "lowrank", "varrate"}  # keep every position, each at fewer bits or a lower rank


def prefill(model, ids, press=None) -> DynamicCache:
    cache = DynamicCache()
    with torch.no_grad(), press(model) if press is not None else contextlib.nullcontext():
        model.model(input_ids=ids, past_key_values=cache)
    return cache


def positions(kept: torch.Tensor, full: torch.Tensor) -> torch.Tensor:
    """(batch, heads, kept) index in `full` of each kept row, -1 where the row is not one of full's. (Keys
    carry their position's rotation, so a key row names one position; a value row may not.)"""
    match = (kept[:, :, :, None, :] == full[:, :, None, :, :]).all(-1)
    return torch.where(match.any(-1), match.float().argmax(-1), -1)


def at_positions(full: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return full.gather(2, index.unsqueeze(-1).expand(-1, -1, -1, full.shape[-1]))


def record_scores(press) -> list[torch.Tensor]:
    """The scores a ScorerPress computes, layer by layer (it keeps the top ones)."""
    scores, score = [], press.score

    def recorded(*args, **kwargs):
        scores.append(score(*args, **kwargs))
        return scores[-1]

    press.score = recorded
    return scores


@functools.cache
def loaded_once(folder: str, attention: str | None):
    """The model of `folder`, loaded once per attention: a press leaves it as it found it (its hooks go with
    its context) but for head masks, which the test below clears."""
    return load_model(folder, attn_implementation=attention)[0]


@pytest.mark.parametrize("name", OFFLINE)
def test_every_offline_press_keeps_what_it_says(name, tiny_model_dir):
    """Which entries survive a prefill of a fixed input, press by press: a scorer its top-scored entries,
    whole (key and value of one position), int(L * (1 - r)) per head; the others as their kind does."""
    eager = registry.needs_eager(name)
    model = loaded_once(tiny_model_dir, "eager" if eager else None)
    adapter.clear_head_masks(model)
    ids = torch.randint(3, 1000, (1, 200), generator=torch.Generator().manual_seed(0))
    attention = "eager" if name == "kvcompose" else model.config._attn_implementation
    with adapter.attention_implementation(model, attention):
        full = prefill(model, ids)  # (kvcompose prefills in eager attention whatever the model's)
    press = build_press(name, 0.5)
    scores = record_scores(press) if isinstance(press, ScorerPress) else []
    cache = prefill(model, ids, press)
    n_kept = compute_n_kept(200, 0.5)
    for index, (layer, whole) in enumerate(zip(cache.layers, full.layers, strict=True)):
        at = positions(layer.keys, whole.keys)
        if isinstance(press, ScorerPress):  # (pyramidkv's budgets per layer: the test below)
            kept = layer.keys.shape[2]
            assert kept == n_kept or name == "pyramidkv"
            assert (at >= 0).all() and torch.equal(layer.values, at_positions(whole.values, at))
            top = scores[index].topk(kept, dim=-1).indices
            assert torch.equal(at.sort(-1).values, top.sort(-1).values)
        elif name in HEAD_MASKS:
            assert torch.equal(layer.keys, whole.keys) and torch.equal(layer.values, whole.values)
        elif name in WHOLE_CHUNKS:
            assert layer.keys.shape[2] == n_kept and (at >= 0).all()
            assert torch.equal(layer.values, at_positions(whole.values, at))
            if name == "chunkkv":  # whole chunks of 20 positions
                assert all(len(set((head // 20).tolist())) == n_kept // 20 for head in at[0])
            if name == "entropy_gated_chunkkv":  # chunks of 10, the spiky ones cut to their best 4
                per_chunk = torch.bincount(at[0, 0] // 10, minlength=20)
                assert torch.equal(at[0, 0], at[0, 1]) and ((per_chunk == 4) | (per_chunk == 10)).any()
                assert ((per_chunk > 0) & (per_chunk < 10)).any()
        elif name == "kvcompose":  # whole entries, as many in each head of a layer (layer sizes: below)
            assert (at >= 0).all() and torch.equal(layer.values, at_positions(whole.values, at))
        elif name == "composed":  # snapkv's entries, then think's zeroed key channels
            at_values = positions(layer.values, whole.values)
            assert layer.keys.shape[2] == n_kept and (at_values >= 0).all()
            assert ((layer.keys == 0).all(dim=2).sum(-1) == 8).all()
        elif name == "key_rerotation":  # the inner scorer's entries, keys rotated to new positions
            assert layer.keys.shape[2] == n_kept and (positions(layer.values, whole.values) >= 0).all()
            assert (at < 0).any()
        elif name == "merging":  # the kept keys whole, evicted values merged into the kept ones
            assert layer.keys.shape[2] == n_kept and (at >= 0).all()
            assert (positions(layer.values, whole.values) < 0).any()
        elif name in CODECS:
            error = (layer.keys - whole.keys).norm() / whole.keys.norm()
            assert layer.keys.shape == whole.keys.shape and 0 < error < (0.15 if name == "quant" else 1)
        elif name == "qevict":  # evicts some windows, keeps the rest at 16 or 4 bits
            assert n_kept <= layer.keys.shape[2] < 200
        elif name == "think":  # zeroes half the key channels of each head, keeps every token
            zero = (layer.keys == 0).all(dim=2).sum(-1)
            assert torch.equal(layer.values, whole.values) and (zero == 8).all()
        elif name in ("decoding", "cam"):  # compress only while decoding
            assert torch.equal(layer.keys, whole.keys)
        else:
            raise AssertionError(f"no expectation for press {name!r}: say what it keeps")
    if name == "kvcompose":  # layers of different sizes, half of all entries kept
        assert sum(layer.keys.shape[2] for layer in cache.layers) == len(cache.layers) * n_kept
    if name in HEAD_MASKS:  # half of the entries masked
        assert adapter.masked_entries(model) == len(cache.layers) * 2 * (200 - n_kept)
    adapter.clear_head_masks(model)


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


def test_press_args_are_typed_by_one_rule_and_a_config_can_hold_them():
    """YAML 1.1's surprises are gone (010 was 8, 1:30 was 90, yes was True, 5e-1 was text); a list is a
    tuple (a config is hashed); a dict and the config's own memory are refused, naming the argument."""
    args = parse_press_args(["seed=010", "x=1:30", "flag=yes", "threshold=5e-1", "ratios=[0.3, .7]"])
    assert args == {"seed": 10, "x": "1:30", "flag": "yes", "threshold": 0.5, "ratios": (0.3, 0.7)}
    hash(tuple(sorted(args.items())))
    for pair, culprit in (
        ("x={a: 1}", "press argument 'x': '{a: 1}' is a dict"),
        ("memory=0.5", "press argument 'memory'"),
        ("qevict.memory=0.5", "press argument 'qevict.memory'"),
        ("seed=1e999", "press argument 'seed' must be a finite number"),
    ):
        with pytest.raises(ValueError) as info:
            parse_press_args([pair])
        assert str(info.value).startswith(culprit) and "--ratio" not in str(info.value)


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
        check_press_runnable("restorekv")
    check_press_runnable("snapkv")  # offline presses never ask


class AskedAgain(dict):
    """A registry that fails when asked for a press by name: what a planned config must not do."""

    def __init__(self, real):
        super().__init__(real.entries)

    def get(self, *args):
        raise AssertionError("the registry was asked again")

    __getitem__ = __contains__ = get


def test_a_planned_press_is_resolved_once_and_carried(monkeypatch):
    """Planning resolves each press once; its configs carry it, so the checks (arguments, protocol, the
    trial run through the engine on a tiny model) and the rows' keys never ask the registry again."""
    from kvbench.harness import planning
    from kvbench.presses import registry as owner

    configs = planning.configs_for_sweep(
        "knorm,snapkv", ratios="0.25,0.5", press_args={"snapkv.window_size": 4}
    )
    assert all(isinstance(config.resolved, registry.ResolvedPress) for config in configs)
    assert {config.press: config.resolved.args for config in configs}["snapkv"] == (("window_size", 4),)
    monkeypatch.setattr(owner, "PRESSES", AskedAgain(owner.PRESSES))
    presses = planning.check_configs(configs, 64)  # snapkv's arguments are tried on the tiny model too
    assert [type(press).__name__ for press in presses] == [
        "NoneType",
        *["KnormPress"] * 2,
        *["SnapKVPress"] * 2,
    ]
    assert all(config.resolved.state(press) is None for config, press in zip(configs, presses, strict=True))


@pytest.mark.parametrize(
    ("name", "args", "built"),
    [
        ("adakv", {"inner": "tova"}, "AdaKVPress"),
        ("chunkkv", {}, "ChunkKVPress"),
        ("decoding", {}, "CompressionRatioDecodingPress"),
        ("dms", {"threshold": 0.5}, "DMSPress"),
        ("per_layer_compression", {"compression_ratios": "0.1,0.2"}, "PerLayerCompressionPress"),
        ("cam", {}, "CAMRatioPress"),
        ("composed", {"presses": "knorm+tova"}, "ComposedPress"),
        ("composed", {}, "ComposedPress"),
    ],
)
def test_a_wrapper_is_resolved_with_its_inner_press(monkeypatch, name, args, built):
    """A wrapper's inner press (given or its default), or a chain's presses, are resolved with it, once:
    building it never asks the registry for them by name."""
    from kvbench.presses import registry as owner

    resolved = registry.resolve(name, args)
    monkeypatch.setattr(owner, "PRESSES", AskedAgain(owner.PRESSES))
    ratio = 0.0 if resolved.spec.knob else 0.5
    assert type(resolved.build(ratio)).__name__ == built


@pytest.mark.parametrize("inner", ["nope", "none", 3])
def test_an_inner_press_that_cannot_be_wrapped_is_refused_at_resolution(inner):
    with pytest.raises(UnknownPress, match=f"inner press {inner!r} is not a press that can be wrapped"):
        registry.resolve("adakv", {"inner": inner})


def test_a_chain_of_a_press_the_registry_lacks_is_refused_at_resolution():
    with pytest.raises(UnknownPress, match="press 'nope' cannot be composed"):
        registry.resolve("composed", {"presses": "knorm+nope"})


def test_a_resolved_press_is_no_part_of_a_configs_identity():
    """Rows are keyed by the config's fields as before: the resolved press is not compared, hashed, shown
    or recorded, so every results folder written before it still resumes."""
    from kvbench.core.config import Config

    bare = Config("snapkv", 0.5, (("window_size", 4),))
    carried = Config(
        "snapkv", 0.5, (("window_size", 4),), resolved=registry.resolve("snapkv", {"window_size": 4})
    )
    assert carried == bare and hash(carried) == hash(bare) and repr(carried) == repr(bare)
    assert carried.as_record() == bare.as_record() and "resolved" not in carried.as_record()


def test_a_resolved_press_pickles_as_its_spec(tmp_path):
    """A Ray worker gets a resolved press as its spec (name, a user's target, arguments) and resolves it in
    its own registry: a user's press given by its file is registered there from the target."""
    import pickle
    import subprocess
    import sys

    (tmp_path / "mine.py").write_text(
        "from dataclasses import dataclass\nfrom kvpress import KnormPress\n\n\n"
        "@dataclass\nclass Mine(KnormPress):\n    pass\n"
    )
    name = registry.resolve_press(f"{tmp_path / 'mine.py'}:Mine")
    wrapped = registry.resolve("adakv", {"inner": name})
    inner_source = wrapped.inner.spec.source
    assert inner_source is not None and wrapped.source_digests() == [inner_source.digest]
    shipped = pickle.dumps(wrapped)
    assert b"compression_ratio" not in shipped  # the spec, not the factory and its class
    code = (
        "import pickle, sys; press = pickle.loads(sys.stdin.buffer.read()); "
        "print(press.spec.name, dict(press.args)['inner'], type(press.build(0.5).press).__name__)"
    )
    worker = subprocess.run([sys.executable, "-c", code], input=shipped, capture_output=True, check=True)
    assert worker.stdout.decode().split() == ["adakv", "Mine", "Mine"]
