"""Every press by name: kvpress's presses that run here on a stock model, plus ours (h2o, kvp, ...).

`build_press(name, ratio, **press_args)` returns a kvpress press whose `compression_ratio` is the fraction of
KV entries removed, or the press's own main knob where kvpress gives it one (think: key channels,
duo_attention: heads). Presses whose kvpress `compression_ratio` is read-only (dms, simlayerkv,
per_layer_compression: a threshold or per-layer ratios decide, and what they removed is known after the
prefill) run at ratio 0 with that knob as a press argument (`PressSpec.knob`). Wrappers (adakv, chunkkv, ...)
wrap the scorer named by `inner` (default snapkv). kvpress's exported presses the registry does not build are
in `NOT_REGISTERED` with the reason.

The registry is open (`kvbench.core.registry`): `register_press(spec)` adds a press, installed packages add
theirs through the entry-point group `kvbench.presses`, and `resolve_press` turns a user's own press (a
class or factory object, `module:Class` or `path/to/file.py:Class`) into a registered name whose spec
records where it comes from (`PressSpec.source`).
"""

import dataclasses
import hashlib
import importlib
import inspect
import re
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvbench.core import resources
from kvbench.core.config import Config
from kvbench.core.errors import BadInput, KvbenchError, UnknownPress, did_you_mean
from kvbench.core.press_hooks import declared
from kvbench.core.registry import (
    USER_CODE_FAILURES,
    PluginError,
    Registry,
    Source,
    first_line,
    is_target,
    load_target,
    source_of,
)
from kvbench.core.validation import parse_value
from kvbench.learned.catalog import LEARNED

_DEFAULT_INNER = "snapkv"


@dataclass(frozen=True)
class LearnedState:
    """Where a learned press reads its state, so that the digest its rows are keyed by (`press_state`) is
    known from the files alone, before torch or the model load: the press argument naming the folder, the
    method's folder under presses/ (the default, per model), the file whose sha256 is the digest, and
    whether the press hashes the file's text (as read, universal newlines) rather than its bytes."""

    folder_arg: str
    method: str
    file: str
    hashes_text: bool = False


@dataclass(frozen=True)
class PressSpec:
    name: str
    description: str
    factory: "Factory | None"  # (ratio, **press_args) -> BasePress, or None for no compression
    needs: tuple[str, ...] = ()  # "eager" (attention weights), "hub" (downloads from the HF hub), "gpu"
    codec: bool = False  # keeps entries at fewer bits or a lower rank: built from a memory budget
    # The press argument that sets how much it removes, for presses whose kvpress `compression_ratio` is
    # read-only (measured after the prefill): they run at ratio 0 and need that argument.
    knob: str = ""
    state: LearnedState | None = None  # learned presses only
    # Scores a whole prefill only (kvpress asserts it): refused where a cache is compressed again.
    prefill_only: bool = False
    # Where the press does not keep what kvbench's conformance kit checks (docs/conformance.md), and why.
    caveat: str = ""
    source: Source | None = None  # a user's press: where its class or factory is defined


def press_class(path: str) -> type:
    """`"KnormPress"` (a kvpress class) or `"kvbench.presses.h2o:H2OPress"`, imported on first use: the
    registry's names and descriptions must load without torch or kvpress (`kvbench presses` is instant)."""
    module, _, name = path.rpartition(":")
    return getattr(importlib.import_module(module or "kvpress"), name)


@dataclass(frozen=True)
class Factory:
    """Builds a press from (ratio, **press_args); knows the press class it builds ("module:Class") and the
    arguments it takes itself (`inner`), so that press arguments are checked against the class's fields
    before anything is built."""

    build: Callable
    press_path: str  # "" for a user's factory function: its arguments are its signature's
    own_args: tuple[str, ...] = ()
    # A wrapper's default inner press: the factory is given the press its `inner` argument names, resolved
    # (a ResolvedPress); "" for a press that wraps none.
    inner: str = ""
    # A chain's default presses ("a+b"): the factory is given those its `presses` argument names, resolved
    # (a tuple of ResolvedPress); "" for a press that chains none.
    chains: str = ""

    def __call__(self, ratio: float, **press_args):
        return self.build(ratio, **press_args)


def builds(path: str, *own_args: str, inner: str = "", chains: str = "") -> Callable[[Callable], Factory]:
    named = (("inner",) if inner else ()) + (("presses",) if chains else ())
    return lambda build: Factory(build, path, own_args + named, inner, chains)


def scorer(path: str, ratio_field: str = "compression_ratio") -> Factory:
    return builds(path)(lambda ratio, **args: press_class(path)(**{ratio_field: ratio}, **args))


def wrapper(path: str) -> Factory:
    return builds(path, inner=_DEFAULT_INNER)(
        lambda ratio, inner, **args: press_class(path)(inner.build(ratio), **args)
    )


@builds("RandomPress")
def _build_random(ratio, seed=0, **args):
    return press_class("RandomPress")(compression_ratio=ratio, seed=seed, **args)


def codec(path: str) -> Factory:
    """A codec press is built from its memory budget alone (the registry passes memory=...)."""
    return builds(path)(lambda ratio, **args: press_class(path)(**args))


@builds("CompressionRatioDecodingPress", inner="knorm")
def _build_decoding(ratio, inner, **args):
    return press_class("CompressionRatioDecodingPress")(
        base_press=inner.build(0.0), target_compression_ratio=ratio, **args
    )


@builds("kvbench.presses.andpro:AnDProPress")
def _build_andpro(ratio, **args):
    return press_class("kvbench.presses.andpro:andpro_press")(ratio, **args)


def _inner_scorer(inner: "ResolvedPress"):
    """The press `inner` as the scorer of a kvpress wrapper that only calls its `score` (DMS, CaM,
    per-layer ratios): it must be a plain scorer; its own ratio is unused (0)."""
    press = inner.build(0.0)
    if not isinstance(press, press_class("ScorerPress")):
        raise UnknownPress(f"inner press {inner.spec.name!r} is not a scorer (knorm, snapkv, tova, ...)")
    return press


def listed(value, kind: type) -> list:
    """A press argument that is a list, given as one ('a+b', '0.3,0.7') or as a YAML list."""
    items = value if isinstance(value, (list, tuple)) else str(value).replace("+", ",").split(",")
    try:
        return [kind(item.strip() if isinstance(item, str) else item) for item in items]
    except (TypeError, ValueError):
        raise BadInput(f"cannot read {value!r} as a list of {kind.__name__}") from None


@builds("DMSPress", inner=_DEFAULT_INNER)
def _build_dms(ratio, inner, threshold=None, **args):
    return press_class("DMSPress")(press=_inner_scorer(inner), threshold=threshold, **args)


@builds("SimLayerKVPress")
def _build_simlayerkv(ratio, **args):
    return press_class("SimLayerKVPress")(**args)


@builds("PerLayerCompressionPress", "compression_ratios", inner=_DEFAULT_INNER)
def _build_per_layer(ratio, inner, compression_ratios=None, **args):
    ratios = listed(compression_ratios, float)
    if not all(0 <= r < 1 for r in ratios):
        raise BadInput(f"per_layer_compression: every ratio must be in [0, 1), got {compression_ratios!r}")
    scorer = _inner_scorer(inner)
    return press_class("PerLayerCompressionPress")(press=scorer, compression_ratios=ratios, **args)


@builds("ComposedPress", chains="snapkv+think")
def _build_composed(ratio, presses):
    """kvpress's ComposedPress over registry presses, each built at the config's ratio (each its own knob:
    think's is its share of key channels), as kvpress's evaluation builds its `snap_think`."""
    chained = []
    for part in presses:
        spec = part.spec
        chainable = spec.factory is not None and not (spec.codec or spec.knob)
        press = part.build(ratio) if chainable else None
        if press is None or not _compresses_in_the_hook(press):
            raise not_composable(spec.name)
        chained.append(press)
    return press_class("ComposedPress")(chained)


def not_composable(name) -> UnknownPress:
    return UnknownPress(
        f"press {name!r} cannot be composed: ComposedPress chains evictors that compress in kvpress's hook "
        "at a ratio (not adakv, kvzip, codecs, decoding presses or presses that change the forward)"
    )


def _compresses_in_the_hook(press) -> bool:
    """Whether a press compresses within kvpress's per-layer hook and nowhere else (what ComposedPress
    chains): no forward of its own, no head-wise masks (AdaKV), no decoding-time compression."""
    kinds = tuple(press_class(name) for name in ("AdaKVPress", "KVzipPress", "DecodingPress"))
    return type(press).__call__ is press_class("BasePress").__call__ and not isinstance(press, kinds)


@builds("KVComposePress")
def _build_kvcompose(ratio, **args):
    if args.get("structured") is False:
        raise BadInput(
            "kvcompose: structured=false is not offered: kvpress 0.5.5's unstructured variant masks entries "
            "but leaves its second pass over the context in the cache (the context twice)"
        )
    return press_class("KVComposePress")(compression_ratio=ratio, **args)


@builds("kvbench.presses.cam:CAMRatioPress", inner="knorm")
def _build_cam(ratio, inner, **args):
    cam = press_class("kvbench.presses.cam:CAMRatioPress")
    return cam(base_press=_inner_scorer(inner), target_compression_ratio=ratio, **args)


def learned_specs(fitted: bool) -> list[PressSpec]:
    """The specs of the learned presses (`fitted=False`) or of the fitted ones, from their declarations
    (kvbench.learned.catalog)."""
    return [
        PressSpec(
            press.name,
            press.description,
            scorer(press.press, press.ratio_field),
            state=LearnedState(press.folder_arg, press.name, press.state_file, press.hashes_text),
            prefill_only=press.prefill_only,
            caveat=press.caveat,
        )
        for press in LEARNED
        if (press.fit is not None) == fitted
    ]


_SPECS = [
    PressSpec("none", "no compression (the reference)", None),
    PressSpec("knorm", "evict keys with the largest L2 norm", scorer("KnormPress")),
    PressSpec("snapkv", "attention of the last prompt window's queries, pooled", scorer("SnapKVPress")),
    PressSpec(
        "tova",
        "attention of the last prompt query, averaged over heads",
        scorer("TOVAPress"),
        caveat="kvpress's TOVAPress crashes on a 1-token context (max() of an empty tensor)",
    ),
    PressSpec(
        "streaming_llm",
        "keep the first tokens (sinks) and the most recent",
        scorer("StreamingLLMPress"),
    ),
    PressSpec(
        "expected_attention",
        "attention expected from future queries (statistics of RoPE)",
        scorer("ExpectedAttentionPress"),
    ),
    PressSpec("random", "uniformly random eviction (seeded; press-arg seed=0)", _build_random),
    PressSpec(
        "observed_attention",
        "mean attention received over the prompt",
        scorer("ObservedAttentionPress"),
        ("eager",),
    ),
    PressSpec(
        "h2o",
        "H2O: heavy hitters by accumulated attention + a recent window",
        scorer("kvbench.presses.h2o:H2OPress"),
        ("eager",),
    ),
    *learned_specs(fitted=False),
    PressSpec("keydiff", "evict keys most similar to the mean key", scorer("KeyDiffPress")),
    PressSpec("lagkv", "lag-relative statistics of keys and values", scorer("LagKVPress")),
    PressSpec(
        "pyramidkv",
        "SnapKV with a per-layer pyramid budget",
        scorer("PyramidKVPress"),
        caveat="its per-layer budgets round up: a few entries more than the ratio's total (10 a head for 9 "
        "at ratio 0.9 of 96 tokens)",
    ),
    PressSpec("cur", "CUR decomposition leverage of keys and values", scorer("CURPress")),
    PressSpec(
        "leverage", "approximate leverage scores of keys", scorer("LeverageScorePress"), prefill_only=True
    ),
    PressSpec(
        "non_causal_attention",
        "chunked non-causal attention scores",
        scorer("NonCausalAttnPress"),
        prefill_only=True,
    ),
    PressSpec(
        "compactor",
        "leverage + non-causal attention blend",
        scorer("CompactorPress"),
        prefill_only=True,
        caveat="kvpress's CompactorPress crashes on a 1-token context (a reshape of 0 elements)",
    ),
    PressSpec("cap", "CAP: expected attention with a tempered prior", scorer("CapPress")),
    PressSpec(
        "think",
        "ThinK: prune key channels (ratio of channels, not tokens)",
        scorer("ThinKPress", "key_channel_compression_ratio"),
    ),
    PressSpec("kvzip", "KVzip: context reconstruction scores (extra forward passes)", scorer("KVzipPress")),
    PressSpec("kvgrad", "KVzip with gradient-based scores (extra passes)", scorer("KVgradPress")),
    PressSpec(
        "kvcompose",
        "KVCompose: attention of a second pass over the context; layer budgets from composite scores, "
        "one size for the heads of a layer",
        _build_kvcompose,
        caveat="its layer budgets round: a few entries more than the ratio's total (38 for 36 at ratio 0.9)",
    ),
    PressSpec(
        "simlayerkv",
        "SimLayerKV: lazy layers (last token's attention on sinks + recent) keep only those; "
        "ratio 0, press-arg lazy_threshold (kvpress: 0.9 Llama 3, 0.85 Qwen)",
        _build_simlayerkv,
        knob="lazy_threshold",
    ),
    PressSpec(
        "dms",
        "DMS without its trained evictor: evict entries past a sliding window that `inner` scores "
        "below a threshold; ratio 0, press-arg threshold",
        _build_dms,
        knob="threshold",
    ),
    PressSpec(
        "per_layer_compression",
        "`inner` at one ratio per layer; ratio 0, press-arg compression_ratios=r0,r1,...",
        _build_per_layer,
        knob="compression_ratios",
    ),
    PressSpec(
        "composed",
        "presses chained in one hook, each at the ratio (press-arg presses=snapkv+think, the default)",
        _build_composed,
    ),
    PressSpec(
        "adakv",
        "AdaKV head-wise budgets around `inner` (press-arg inner=snapkv)",
        wrapper("AdaKVPress"),
    ),
    PressSpec(
        "andpro",
        "AnDPro: chunks scored by projection on the window's anchor output, AdaKV head-wise budgets",
        _build_andpro,
        caveat="as the paper, no per-head floor: at high ratios a head can hold no entry",
    ),
    PressSpec(
        "varrate",
        "VarRate: every token at a salience-driven rank of a per-head SVD basis",
        codec("kvbench.presses.lowrank:VarRatePress"),
        codec=True,
    ),
    PressSpec(
        "lowrank",
        "every token at one rank of a per-head SVD basis (VarRate's ablation)",
        codec("kvbench.presses.lowrank:LowRankPress"),
        codec=True,
    ),
    PressSpec("critical_kv", "CriticalKV value-norm correction of `inner`", wrapper("CriticalKVPress")),
    PressSpec("critical_adakv", "CriticalKV + AdaKV around `inner`", wrapper("CriticalAdaKVPress")),
    PressSpec(
        "chunkkv",
        "keep whole chunks, scored by `inner`",
        wrapper("ChunkKVPress"),
        caveat="whole chunks: fewer entries than the ratio keeps (76 for 86 at ratio 0.1 of 96 tokens)",
    ),
    PressSpec(
        "entropy_gated_chunkkv",
        "ChunkKV whose spiky chunks (low score entropy) keep only their best tokens, scored by `inner`",
        wrapper("EntropyGatedChunkKVPress"),
    ),
    PressSpec("block", "apply `inner` block by block", wrapper("BlockPress")),
    PressSpec("chunk", "apply `inner` chunk by chunk", wrapper("ChunkPress")),
    PressSpec(
        "key_rerotation",
        "`inner`, then re-rotate kept keys to contiguous positions",
        wrapper("KeyRerotationPress"),
    ),
    PressSpec("merging", "`inner`, merging evicted entries into kept ones", wrapper("MergingPress")),
    PressSpec(
        "decoding", "compress during decoding to the ratio with `inner` (default knorm)", _build_decoding
    ),
    PressSpec(
        "cam",
        "CaM: compress during decoding to the ratio, merging evicted values into kept neighbours "
        "(`inner` scores, default knorm)",
        _build_cam,
    ),
    PressSpec(
        "quant",
        "KIVI-style uniform quantisation at 8/4/2 bits (press-arg bits; default: the widest that fits)",
        codec("kvbench.presses.quant:QuantPress"),
        codec=True,
    ),
    PressSpec(
        "qevict",
        "QEvict: attention-scored windows kept at 16 bits, int4, or evicted; recoverable on re-compression",
        codec("kvbench.presses.qevict:QEvictPress"),
        codec=True,
    ),
    *learned_specs(fitted=True),
    PressSpec(
        "restorekv",
        "RestoreKV: KVzip plus learned restore tokens (LoRA adapters downloaded per model; published for "
        "Llama-3.1-8B-Instruct and Qwen3-8B)",
        scorer("RestoreKVPress"),
        ("hub",),
    ),
]

_PRESS_NAME = re.compile(
    r"[A-Za-z_][A-Za-z0-9_-]*\Z"
)  # no ",", "=", "." or ":": sweeps and press args split on them


def _user_press_spec(name: str, obj: object, source: Source) -> PressSpec:
    """The spec of a user's press: a kvpress press class (a dataclass with a `compression_ratio` field, set
    to each config's ratio), a factory `(ratio, **press_args) -> press`, or a PressSpec of its own.
    PluginError when `obj` is none of these."""
    import kvpress

    what = f"press {source.target!r}"
    if isinstance(obj, PressSpec):
        return dataclasses.replace(obj, name=name, source=obj.source or source)
    if inspect.isclass(obj):
        if not issubclass(obj, kvpress.BasePress):
            raise PluginError(f"{what}: {obj.__name__} is not a kvpress press (a subclass of BasePress)")
        init = (
            [field.name for field in dataclasses.fields(obj) if field.init]
            if dataclasses.is_dataclass(obj)
            else []
        )
        if "compression_ratio" not in init:
            raise PluginError(
                f"{what}: {obj.__name__} has no compression_ratio field, through which kvbench sets the "
                "ratio (give a factory `(ratio, **press_args) -> press` instead)"
            )
        factory = scorer(f"{obj.__module__}:{obj.__qualname__}")
    elif callable(obj):
        try:
            inspect.signature(obj).bind(0.0)
        except (TypeError, ValueError):
            raise PluginError(
                f"{what}: a press factory must take the ratio as its one positional argument"
            ) from None
        factory = Factory(obj, "")
    else:
        raise PluginError(f"{what}: {type(obj).__name__} is neither a press class nor a press factory")
    doc = (inspect.getdoc(obj) or "").strip().splitlines()
    generated = not doc or doc[0].startswith(f"{getattr(obj, '__name__', '')}(")  # a dataclass's own
    return PressSpec(name, f"{source.target}" if generated else doc[0], factory, source=source)


def _press_from_plugin(name: str, loaded: object) -> PressSpec:
    return _user_press_spec(name, loaded, source_of(loaded))


PRESSES: Registry[PressSpec] = Registry("presses", _press_from_plugin)


def register_press(spec: PressSpec, *, replace: bool = False) -> PressSpec:
    """Add a press to the registry under `spec.name` (BadInput if taken, unless `replace`)."""
    return PRESSES.register(spec.name, spec, replace=replace)


for built_in in _SPECS:
    register_press(built_in)


def resolve_press(press: object, name: str | None = None) -> str:
    """The registry's name of `press`: a registered name as it is; a user's press (a class or factory, a
    target `module:Class` or `path/to/file.py:Class`, or `name=target`) registered first, under `name` or
    its class's name. The same target again (an edited file included) replaces its entry; a name taken
    by another press is refused. BadInput/PluginError in one line for what cannot be a press."""
    if isinstance(press, str):
        text = press.strip()
        alias, sep, rest = text.partition("=")
        if sep and is_target(rest.strip()):
            name, text = alias.strip(), rest.strip()
        elif sep:
            raise BadInput(
                f"press {text!r}: NAME= names a press of your own given by its target (NAME=module:Class or "
                f"NAME=file.py:Class); {rest.strip()!r} is not one"
            )
        if not is_target(text):
            if name is not None and name != text:
                raise BadInput(f"press {text!r} is registered: it keeps its name (not {name!r})")
            if text not in PRESSES and text.endswith(".py"):
                raise BadInput(f"press {text!r}: name the class in the file, as {text}:ClassName")
            if text not in PRESSES:
                raise unknown_press(text)
            return text
        obj = load_target(text, "press")
        module, _, attribute = text.rpartition(":")
        by_file = module.endswith(".py") or "/" in module
        source = source_of(obj, f"{Path(module).resolve()}:{attribute}" if by_file else text)
    elif callable(press):
        obj, source = press, source_of(press)
    else:
        raise BadInput(
            f"press {press!r}: give a press's name, a target (module:Class, file.py:Class), or a press class "
            "or factory"
        )
    name = name if name is not None else getattr(obj, "__name__", None)
    if not isinstance(name, str) or not _PRESS_NAME.match(name):
        raise BadInput(
            f"press name {name!r}: use letters, digits, _ and - (give one as NAME={source.target})"
        )
    existing = PRESSES.get(name)
    if existing is not None and (existing.source is None or existing.source.target != source.target):
        taken = "a built-in press" if existing.source is None else existing.source.target
        raise BadInput(f"press name {name!r} is taken by {taken}: give another, as OTHER={source.target}")
    if existing is not None and existing.source == source:
        return name
    register_press(_user_press_spec(name, obj, source), replace=True)
    return name


# kvpress's exported presses that the registry does not build, and why (tests/presses/test_kvpress_presses.py
# fails on an exported press that is neither registered nor here, so a new kvpress release cannot add one
# unseen).
NOT_REGISTERED: dict[str, str] = {
    "BasePress": "kvpress's base class, not a press",
    "ScorerPress": "kvpress's base class of scorers, not a press",
    "DecodingPress": "what --protocol decode-time and streaming wrap around a config's press",
    "PrefillDecodingPress": "what --protocol decode-time is: the press on the prefill, a DecodingPress after",
    "FinchPress": "adds a delimiter token to the tokenizer and a row to the model's embeddings, so the model "
    "it compresses is not the one every other press runs on (kvbench's query-aware protocol compresses "
    "context + question without it)",
    "LUKVPress": "needs a budget curve per (model, scorer), fetched from GitHub at run time, published only "
    "for Llama-3.1-8B-Instruct with expected attention",
}


def list_presses() -> list[PressSpec]:
    """Every press of the registry, plugins loaded (one that fails is left out: `PRESSES.broken()`): name,
    description, what it needs, whether it is a codec, where it comes from."""
    return list(PRESSES.loaded().values())


def parse_press_args(pairs: list[str]) -> dict:
    """['window_size=32', 'inner=tova', 'x=5e-1'] -> {'window_size': 32, 'inner': 'tova', 'x': 0.5}.

    Each value is typed by `validation.parse_value`'s one rule: decimal digits an int (`010` is 10), a
    decimal number with a point or an exponent a float, true/false a bool, null None, `[...]` and `{...}`
    a list and a dict, quoted text the text; anything else (`yes`, `0x10`, `1:30`, a path) the text as
    given. An empty value (`window_size=`) is refused: a slip, not a None. Errors name the press argument:
    `press argument 'seed' must be at most ...`.

    A list comes back as a tuple, so that a config holding it stays hashable; a dict is refused (no
    press of the registry takes one, and a config could not hold it), as is `memory`, the config's own
    memory budget (`--memory`), which `build_press` passes to codecs itself."""
    args = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise BadInput(f"press argument {pair!r} is not key=value")
        if key in args:
            raise BadInput(f"press argument {key!r} is given twice")
        if not value.strip():
            raise BadInput(f"press argument {key!r} has an empty value")
        if key.rpartition(".")[2] == "memory":
            raise BadInput(
                f"press argument {key!r}: a memory budget is the config's own (--memory), "
                "not a press argument"
            )
        args[key] = hashable(parse_value(value, f"press argument {key!r}"), key, value)
    return args


def hashable(value, key: str, text: str):
    """A press argument's value as a config holds it: lists as tuples; a dict refused."""
    if isinstance(value, dict):
        raise BadInput(f"press argument {key!r}: {text.strip()!r} is a dict, which no press argument takes")
    if isinstance(value, list):
        return tuple(hashable(item, key, text) for item in value)
    return value


def _value_fits(value, hint) -> bool:
    """Whether a press argument's value (as YAML typed it) fits the dataclass field's annotation; kinds we
    do not know how to check (tensors, presses, callables) pass."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_value_fits(value, arg) for arg in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if origin is typing.Literal:
        return value in typing.get_args(hint)
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if origin in (list, tuple) or hint in (list, tuple):
        return isinstance(value, (list, tuple))
    if origin is dict or hint is dict:
        return isinstance(value, dict)
    return True


def _type_name(hint) -> str:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(_type_name(arg) for arg in typing.get_args(hint))
    return "null" if hint is type(None) else getattr(hint, "__name__", str(hint))


def unknown_press(name: str) -> UnknownPress:
    return UnknownPress(f"unknown press {name!r}{did_you_mean(name, PRESSES)} (see `kvbench presses`)")


@dataclass(frozen=True)
class ResolvedPress:
    """A press resolved once from the registry (`resolve`): its entry (`spec`: factory, source and digest,
    what it declares: codec, knob, prefill-only, needs; read there, as `resolved.spec.codec`) with its
    arguments, and the press its `inner` argument names (a wrapper's default included) or the presses its
    `presses` argument chains (`composed`), resolved with it and handed to its factory. Configs carry it
    (`Config.resolved`); checks, the planner, the engine and the wrappers ask it, never the registry. It
    pickles as its spec (name, a user's target, arguments): a Ray worker resolves it again in its own
    registry."""

    spec: PressSpec
    args: tuple[tuple[str, Any], ...] = ()
    inner: "ResolvedPress | None" = None  # the press named by `inner` (or its default), for wrappers
    parts: "tuple[ResolvedPress, ...]" = ()  # the presses named by `presses` (or its default), for chains

    @property
    def needs_eager(self) -> bool:
        """Whether it needs attention weights (so an eager attention implementation), itself or the press
        given as its `inner`."""
        given = self.inner is not None and "inner" in dict(self.args)
        return "eager" in self.spec.needs or (given and self.inner.needs_eager)

    def __reduce__(self):
        target = self.spec.source.target if self.spec.source is not None else None
        return (_resolved_again, (self.spec.name, target, self.args, self.inner, self.parts))

    def check_args(self) -> None:
        """Refuse unknown press arguments and values that do not fit the press's dataclass fields
        (`window_size=abc`), so that a typo fails in the CLI instead of deep inside the first prefill."""
        name, factory, press_args = self.spec.name, self.spec.factory, dict(self.args)
        if factory is None:
            return
        if not factory.press_path:  # a user's factory: its signature says what it takes
            try:
                inspect.signature(factory.build).bind(0.0, **press_args)
            except TypeError as error:
                raise BadInput(f"bad press argument for {name!r}: {error}") from None
            return
        cls = press_class(factory.press_path)
        fields = {field.name for field in dataclasses.fields(cls) if field.init}
        try:
            hints = typing.get_type_hints(cls)
        except Exception:  # annotations that do not resolve: only the names are checked
            hints = {}
        for key, value in press_args.items():
            if key in factory.own_args:
                continue
            if key not in fields:
                known = sorted(fields | set(factory.own_args))
                hint = did_you_mean(key, known)
                raise BadInput(f"press {name!r} has no argument {key!r}{hint} (it takes: {', '.join(known)})")
            if key in hints and not _value_fits(value, hints[key]):
                raise BadInput(
                    f"bad press argument for {name!r}: {key}={value!r} is not {_type_name(hints[key])}"
                )

    def check_runnable(self) -> None:
        """Fail before any work if the press cannot run here (it needs an unreachable hub)."""
        from kvbench.bridge import models

        if "hub" in self.spec.needs and not models.hub_reachable():
            raise UnknownPress(
                f"press {self.spec.name!r} downloads files from the Hugging Face hub, which is not reachable"
            )

    def build(self, ratio: float, memory: float | None = None):
        """The press at compression ratio `ratio`; None for `none`. `memory` (fraction of the 16-bit full
        cache) is what a codec solves its own knobs for; without it a codec gets memory = 1 - ratio.
        Evictors are given their ratio (1 - memory, chosen by the caller)."""
        name, spec, press_args = self.spec.name, self.spec, dict(self.args)
        if not 0 <= ratio < 1:
            raise BadInput(f"ratio must be in [0, 1), got {ratio}")
        if spec.factory is None:
            if press_args:
                raise BadInput(f"press 'none' takes no press arguments, got {', '.join(press_args)}")
            return None
        self.check_args()
        if spec.knob and ratio != 0:
            raise BadInput(
                f"press {name!r} is set by {spec.knob}, not by a ratio: give ratio 0 and --press-arg "
                f"{spec.knob}="
            )
        if spec.knob and spec.knob not in press_args:
            raise BadInput(
                f"press {name!r} needs --press-arg {spec.knob}= (it sets how much the press removes)"
            )
        if spec.codec:
            press_args = {**press_args, "memory": 1 - ratio if memory is None else memory}
        if self.wraps:
            press_args["inner"] = self.inner
        if spec.factory.chains:
            press_args["presses"] = self.parts
        if spec.source is not None:
            return _built_by_user(spec, ratio, press_args)
        try:
            return spec.factory(ratio, **press_args)
        except KvbenchError:
            raise
        except TypeError as error:
            raise BadInput(f"bad press argument for {name!r}: {error}") from None
        except (ValueError, AssertionError) as error:  # the press's own check of its arguments
            raise BadInput(str(error) or f"bad press arguments for {name!r}: {press_args}") from None

    def source_digests(self) -> list[str]:
        """The digests of the user's files that define the press and the press it wraps (`inner`): part of
        its rows' key, so that an edited press is scored again."""
        own = [self.spec.source.digest] if self.spec.source is not None else []
        return own + (self.inner.source_digests() if self.wraps and self.inner is not None else [])

    def state(self, press) -> str | None:
        """What a config's rows are keyed by beside its arguments: the learned state `press` (built from
        this) loaded (`press_state`), then the digests of the user's files that define it."""
        return "+".join(filter(None, [press_state(press), *self.source_digests()])) or None

    def state_from_files(self, model_name: str) -> str | None:
        """`state` once the press has loaded its state for `model_name`, read from files alone (no torch,
        no model). Raises LookupError when a file is missing: only building the press can say what is
        wrong."""
        learned = self.learned_state_from_files(model_name)
        return "+".join(filter(None, [learned, *self.source_digests()])) or None

    def learned_state_from_files(self, model_name: str) -> str | None:
        """What `press_state` gives the press once it has loaded its state for `model_name`, read from the
        learned state's files alone (no torch, no model): the digests of its own state (PressSpec.state)
        and of the inner press it wraps (built with its defaults), joined by "+". Raises LookupError when
        a file is missing: only building the press can say what is wrong."""
        learned, digests = self.spec.state, []
        if learned is not None:
            folder = dict(self.args).get(learned.folder_arg)
            folder = (
                Path(folder)
                if folder
                else resources.learned_state_dir(learned.method, model_name.replace("/", "--"))
            )
            path = folder / learned.file
            if not path.is_file():
                raise LookupError(path)
            data = path.read_text().encode() if learned.hashes_text else path.read_bytes()
            digests.append(hashlib.sha256(data).hexdigest()[:12])
        if self.wraps and self.inner is not None:
            digests.append(self.inner.learned_state_from_files(model_name))
        return "+".join(filter(None, digests)) or None

    @property
    def wraps(self) -> bool:
        """Whether it wraps the press its `inner` argument names (kvbench's wrappers)."""
        return self.spec.factory is not None and bool(self.spec.factory.inner)

    @property
    def inner_name(self):
        """The `inner` argument given, else the wrapper's default; None for a press that wraps none."""
        return dict(self.args).get("inner", self.spec.factory.inner if self.wraps else None)


def resolve(name: str, press_args: dict | tuple = ()) -> ResolvedPress:
    """The press `name` of the registry with its arguments, resolved once (the one place that asks the
    registry for a press by name); UnknownPress for a name the registry does not hold."""
    spec = PRESSES.get(name) if isinstance(name, str) else None
    if spec is None:
        raise unknown_press(str(name))
    args = tuple(sorted(dict(press_args).items()))
    resolved = ResolvedPress(spec, args)
    inner = resolved.inner_name
    if isinstance(inner, str) and inner in PRESSES:
        resolved = dataclasses.replace(resolved, inner=resolve(inner))
    if resolved.wraps and (resolved.inner is None or resolved.inner.spec.factory is None):
        wrappable = [spec.name for spec in _SPECS if spec.factory is not None]
        raise UnknownPress(
            f"inner press {inner!r} is not a press that can be wrapped{did_you_mean(str(inner), wrappable)}"
        )
    if spec.factory is not None and spec.factory.chains:
        names = listed(dict(args).get("presses", spec.factory.chains), str)
        unknown = [name for name in names if name not in PRESSES]
        if unknown:
            raise not_composable(unknown[0])
        resolved = dataclasses.replace(resolved, parts=tuple(resolve(name) for name in names))
    return resolved


def _resolved_again(
    name: str, target: str | None, args: tuple, inner: ResolvedPress | None, parts: tuple = ()
) -> ResolvedPress:
    """A ResolvedPress unpickled in another process (a Ray worker): a user's press registered there from
    its target first (`inner` and `parts`, unpickled before, have registered themselves)."""
    if target is not None:
        resolve_press(target, name)
    return resolve(name, args)


def press_of(config: Config) -> ResolvedPress:
    """The resolved press a config carries (`Config.resolved`, set where it was planned), else its press
    resolved now."""
    carried = config.resolved
    if (
        isinstance(carried, ResolvedPress)
        and carried.spec.name == config.press
        and carried.args == tuple(sorted(config.press_args))
    ):
        return carried
    return resolve(config.press, config.press_args)


def check_press_args(name: str, press_args: dict) -> None:
    """`ResolvedPress.check_args` of the press `name` with `press_args`."""
    resolve(name, press_args).check_args()


def check_press_runnable(name: str) -> None:
    """Fail before any work if a press cannot run here (unknown, or needs an unreachable hub)."""
    resolve(name).check_runnable()


def build_press(name: str, ratio: float, /, memory: float | None = None, **press_args):
    """The press `name` at compression ratio `ratio` (`ResolvedPress.build`); None for `none`."""
    return resolve(name, press_args).build(ratio, memory)


def _built_by_user(spec: PressSpec, ratio: float, press_args: dict):
    """The press a user's class or factory builds at `ratio`; BadInput in one line when it raises anything
    (sys.exit included) or returns what is not a kvpress press (None would run uncompressed)."""
    import kvpress

    where = f"press {spec.name!r} at ratio {ratio}"
    try:
        press = spec.factory(ratio, **press_args)
    except KvbenchError:
        raise
    except TypeError as error:
        raise BadInput(f"bad press argument for {spec.name!r}: {error}") from None
    except USER_CODE_FAILURES as error:  # the user's code may fail in any way
        raise BadInput(f"{where} fails to build: {first_line(error)}") from None
    if not isinstance(press, kvpress.BasePress):
        raise BadInput(f"{where}: its factory returned {type(press).__name__}, not a kvpress press")
    return press


def check_distinct_presses(configs: list[Config], presses: list) -> None:
    """BadInput when a user's factory returned one press object for two configs (a cached press): the
    configs would share its ratio and state, the last built setting them for all."""
    seen: dict[int, Config] = {}
    for config, press in zip(configs, presses, strict=True):
        if press is None or press_of(config).spec.source is None:
            continue
        first = seen.setdefault(id(press), config)
        if first is not config:
            raise BadInput(
                f"press {config.press!r}: its factory returned one press object for ratios {first.ratio} and "
                f"{config.ratio}; build a new press on each call"
            )


def config_press(config: Config):
    """The press of a config, as `ResolvedPress.build` makes it; None for `none`."""
    if config.press == "none":
        return None
    return press_of(config).build(config.ratio, config.memory)


def press_state(press) -> str | None:
    """Digest of the learned state a press (or a press it wraps) loaded in `post_init_from_model`, e.g.
    KVP's agents; None for presses that are fully defined by their arguments."""
    import kvpress

    if press is None:
        return None
    digests = [declared(press, "state_digest")]
    digests += [press_state(inner) for inner in vars(press).values() if isinstance(inner, kvpress.BasePress)]
    digests = [digest for digest in digests if digest]
    return "+".join(digests) or None


def config_state(name: str, press_args: dict, press) -> str | None:
    """`ResolvedPress.state` of the press `name` with `press_args`, built as `press`."""
    return resolve(name, press_args).state(press)


def press_state_from_files(name: str, press_args: dict, model_name: str) -> str | None:
    """`ResolvedPress.state_from_files` of the press `name` with `press_args`."""
    return resolve(name, press_args).state_from_files(model_name)


def needs_eager(name: str, press_args: dict | None = None) -> bool:
    """Whether a press needs attention weights (so an eager attention implementation); False for a name
    the registry does not hold."""
    return name in PRESSES and resolve(name, press_args or {}).needs_eager
