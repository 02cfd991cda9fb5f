"""Every press by name: kvpress's presses that run offline on a stock model, plus ours (h2o, kvp).

`build_press(name, ratio, **press_args)` returns a kvpress press whose `compression_ratio` is the fraction of
KV entries removed. Wrappers (adakv, chunkkv, ...) wrap the scorer named by `inner` (default snapkv).
"""

from collections.abc import Callable
from dataclasses import dataclass

import kvpress
import yaml

from kvbench import models
from kvbench.presses.andpro import andpro_press
from kvbench.presses.h2o import H2OPress
from kvbench.presses.lowrank import LowRankPress, VarRatePress
from kvbench.presses.qevict import QEvictPress
from kvbench.presses.quant import QuantPress

DEFAULT_INNER = "snapkv"


class UnknownPress(ValueError):
    """The press name is not in the registry."""


@dataclass(frozen=True)
class PressSpec:
    name: str
    description: str
    factory: Callable  # (ratio, **press_args) -> BasePress, or None for no compression
    needs: tuple[str, ...] = ()  # "eager" (attention weights), "hub" (downloads from the HF hub), "gpu"
    codec: bool = False  # keeps entries at fewer bits or a lower rank: built from a memory budget


def scorer(cls) -> Callable:
    return lambda ratio, **args: cls(compression_ratio=ratio, **args)


def wrapper(cls) -> Callable:
    def build(ratio, inner=DEFAULT_INNER, **args):
        if inner not in PRESSES or inner == "none" or PRESSES[inner].factory is None:
            raise UnknownPress(f"inner press {inner!r} is not a press that can be wrapped")
        return cls(build_press(inner, ratio), **args)

    return build


def build_kvp(ratio, **args):
    from kvbench.presses.kvp import KVPPress  # imported lazily: it loads agents and torch modules

    return KVPPress(compression_ratio=ratio, **args)


def build_memdecay(ratio, **args):
    from kvbench.presses.memdecay import MemDecayPress  # imported lazily, as kvp

    return MemDecayPress(compression_ratio=ratio, **args)


def build_random(ratio, seed=0, **args):
    return kvpress.RandomPress(compression_ratio=ratio, seed=seed, **args)


def codec(cls) -> Callable:
    """A codec press is built from its memory budget alone (the registry passes memory=...)."""
    return lambda ratio, **args: cls(**args)


def build_decoding(ratio, inner="knorm", **args):
    return kvpress.CompressionRatioDecodingPress(
        base_press=build_press(inner, 0.0), target_compression_ratio=ratio, **args
    )


SPECS = [
    PressSpec("none", "no compression (the reference)", None),
    PressSpec("knorm", "evict keys with the largest L2 norm", scorer(kvpress.KnormPress)),
    PressSpec("snapkv", "attention of the last prompt window's queries, pooled", scorer(kvpress.SnapKVPress)),
    PressSpec("tova", "attention of the last prompt query, averaged over heads", scorer(kvpress.TOVAPress)),
    PressSpec(
        "streaming_llm",
        "keep the first tokens (sinks) and the most recent",
        scorer(kvpress.StreamingLLMPress),
    ),
    PressSpec(
        "expected_attention",
        "attention expected from future queries (statistics of RoPE)",
        scorer(kvpress.ExpectedAttentionPress),
    ),
    PressSpec("random", "uniformly random eviction (seeded; press-arg seed=0)", build_random),
    PressSpec(
        "observed_attention",
        "mean attention received over the prompt",
        scorer(kvpress.ObservedAttentionPress),
        ("eager",),
    ),
    PressSpec(
        "h2o", "H2O: heavy hitters by accumulated attention + a recent window", scorer(H2OPress), ("eager",)
    ),
    PressSpec("kvp", "KVP: learned per-head eviction agents (presses/kvp/<model>/)", build_kvp),
    PressSpec(
        "memdecay",
        "MemDecay: region priorities decaying since last attended, page eviction (presses/memdecay/<model>/)",
        build_memdecay,
    ),
    PressSpec("keydiff", "evict keys most similar to the mean key", scorer(kvpress.KeyDiffPress)),
    PressSpec("lagkv", "lag-relative statistics of keys and values", scorer(kvpress.LagKVPress)),
    PressSpec("pyramidkv", "SnapKV with a per-layer pyramid budget", scorer(kvpress.PyramidKVPress)),
    PressSpec("cur", "CUR decomposition leverage of keys and values", scorer(kvpress.CURPress)),
    PressSpec("leverage", "approximate leverage scores of keys", scorer(kvpress.LeverageScorePress)),
    PressSpec(
        "non_causal_attention", "chunked non-causal attention scores", scorer(kvpress.NonCausalAttnPress)
    ),
    PressSpec("compactor", "leverage + non-causal attention blend", scorer(kvpress.CompactorPress)),
    PressSpec("cap", "CAP: expected attention with a tempered prior", scorer(kvpress.CapPress)),
    PressSpec(
        "think",
        "ThinK: prune key channels (ratio of channels, not tokens)",
        lambda r, **a: kvpress.ThinKPress(key_channel_compression_ratio=r, **a),
    ),
    PressSpec(
        "kvzip", "KVzip: context reconstruction scores (extra forward passes)", scorer(kvpress.KVzipPress)
    ),
    PressSpec("kvgrad", "KVzip with gradient-based scores (extra passes)", scorer(kvpress.KVgradPress)),
    PressSpec(
        "adakv",
        "AdaKV head-wise budgets around `inner` (press-arg inner=snapkv)",
        wrapper(kvpress.AdaKVPress),
    ),
    PressSpec(
        "andpro",
        "AnDPro: chunks scored by projection on the window's anchor output, AdaKV head-wise budgets",
        andpro_press,
    ),
    PressSpec(
        "varrate",
        "VarRate: every token at a salience-driven rank of a per-head SVD basis",
        codec(VarRatePress),
        codec=True,
    ),
    PressSpec(
        "lowrank",
        "every token at one rank of a per-head SVD basis (VarRate's ablation)",
        codec(LowRankPress),
        codec=True,
    ),
    PressSpec("critical_kv", "CriticalKV value-norm correction of `inner`", wrapper(kvpress.CriticalKVPress)),
    PressSpec("critical_adakv", "CriticalKV + AdaKV around `inner`", wrapper(kvpress.CriticalAdaKVPress)),
    PressSpec("chunkkv", "keep whole chunks, scored by `inner`", wrapper(kvpress.ChunkKVPress)),
    PressSpec("block", "apply `inner` block by block", wrapper(kvpress.BlockPress)),
    PressSpec("chunk", "apply `inner` chunk by chunk", wrapper(kvpress.ChunkPress)),
    PressSpec(
        "key_rerotation",
        "`inner`, then re-rotate kept keys to contiguous positions",
        wrapper(kvpress.KeyRerotationPress),
    ),
    PressSpec("merging", "`inner`, merging evicted entries into kept ones", wrapper(kvpress.MergingPress)),
    PressSpec(
        "decoding", "compress during decoding to the ratio with `inner` (default knorm)", build_decoding
    ),
    PressSpec(
        "quant",
        "KIVI-style uniform quantisation at 8/4/2 bits (press-arg bits; default: the widest that fits)",
        codec(QuantPress),
        codec=True,
    ),
    PressSpec(
        "qevict",
        "QEvict: attention-scored windows kept at 16 bits, int4, or evicted; recoverable on re-compression",
        codec(QEvictPress),
        codec=True,
    ),
    PressSpec("qfilter", "Q-Filters (filters downloaded per model)", scorer(kvpress.QFilterPress), ("hub",)),
    PressSpec("kvzap", "KVzap (scorer weights downloaded per model)", scorer(kvpress.KVzapPress), ("hub",)),
    PressSpec(
        "fastkvzip", "Fast KVzip (gates downloaded per model)", scorer(kvpress.FastKVzipPress), ("hub",)
    ),
    PressSpec(
        "expected_attention_stats",
        "expected attention with statistics from a hub dataset",
        scorer(kvpress.ExpectedAttentionStatsPress),
        ("hub",),
    ),
    PressSpec(
        "duo_attention",
        "DuoAttention (head patterns downloaded per model)",
        lambda r, **a: kvpress.DuoAttentionPress(head_compression_ratio=r, **a),
        ("hub",),
    ),
]
PRESSES: dict[str, PressSpec] = {spec.name: spec for spec in SPECS}


def parse_press_args(pairs: list[str]) -> dict:
    """['window_size=32', 'inner=tova'] -> {'window_size': 32, 'inner': 'tova'} (values typed as YAML)."""
    args = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"press argument {pair!r} is not key=value")
        args[key.strip()] = yaml.safe_load(value)
    return args


def check_press_runnable(name: str) -> None:
    """Fail before any work if a press cannot run here (unknown, or needs an unreachable hub)."""
    if name not in PRESSES:
        raise UnknownPress(f"unknown press {name!r} (see `kvbench presses`)")
    if "hub" in PRESSES[name].needs and not models.hub_reachable():
        raise UnknownPress(
            f"press {name!r} downloads files from the Hugging Face hub, which is not reachable"
        )


def build_press(name: str, ratio: float, memory: float | None = None, **press_args):
    """The press `name` at compression ratio `ratio`; None for `none`.

    `memory` (fraction of the 16-bit full cache) is what a codec press solves its own knobs for; without it
    a codec gets memory = 1 - ratio. Evictors are given their ratio (1 - memory, chosen by the caller).
    """
    if name not in PRESSES:
        raise UnknownPress(f"unknown press {name!r} (see `kvbench presses`)")
    if not 0 <= ratio < 1:
        raise ValueError(f"ratio must be in [0, 1), got {ratio}")
    spec = PRESSES[name]
    if spec.factory is None:
        if press_args:
            raise ValueError("press 'none' takes no press arguments")
        return None
    if spec.codec:
        press_args = {**press_args, "memory": 1 - ratio if memory is None else memory}
    try:
        return spec.factory(ratio, **press_args)
    except TypeError as error:
        raise ValueError(f"bad press argument for {name!r}: {error}") from None


def press_state(press) -> str | None:
    """Digest of the learned state a press (or a press it wraps) loaded in `post_init_from_model`, e.g.
    KVP's agents; None for presses that are fully defined by their arguments."""
    if press is None:
        return None
    digests = [getattr(press, "state_digest", None)]
    digests += [press_state(inner) for inner in vars(press).values() if isinstance(inner, kvpress.BasePress)]
    digests = [digest for digest in digests if digest]
    return "+".join(digests) or None


def needs_eager(name: str, press_args: dict | None = None) -> bool:
    """Whether a press needs attention weights (so an eager attention implementation)."""
    if name not in PRESSES:
        return False
    inner = (press_args or {}).get("inner")
    return "eager" in PRESSES[name].needs or (inner is not None and needs_eager(inner))
