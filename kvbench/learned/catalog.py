"""Every learned and fitted press, declared once: what the press registry (`kvbench presses`, `--press NAME`)
and the commands (`kvbench NAME ...`, `kvbench fit NAME`) read of it, without torch. A new fitted press is
its module (kvbench/learned/fitted/NAME.py: its press class and its `fit`), its entry here and its tests."""

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Fit:
    """How `kvbench fit NAME` fits a press's state: its module kvbench/learned/fitted/NAME.py holds
    `fit(model, tokenizer, contexts, options) -> (tensors, validation)`; `options` are those it takes, each
    with its default (a value on the command line is read as the default's type); `summary` is what one
    line of `kvbench fit` says it fits; `min_prompts` the fewest prompts it fits on."""

    summary: str
    options: dict = field(default_factory=dict)
    min_prompts: int = 1


@dataclass(frozen=True)
class LearnedPress:
    """A press whose state is learned or fitted for a model, read from presses/NAME/MODEL/ by default.

    name: the press's name, its state's method (the card's `method`) and its folder under presses/.
    description: its line in `kvbench presses`.
    press: its class as `module:Class`, imported when it is built.
    state_file: the file beside card.json whose sha256 keys its rows (`hashes_text`: of its text).
    folder_arg: the press argument naming another folder than the shipped one.
    ratio_field, prefill_only, caveat: as the registry's `PressSpec` (kvbench.presses.registry).
    command: its own command group as (`module:group`, one-line help): `kvbench NAME ...`.
    fit: for a fitted press, how `kvbench fit NAME` fits it.
    """

    name: str
    description: str
    press: str
    state_file: str
    folder_arg: str = "weights"
    hashes_text: bool = False
    ratio_field: str = "compression_ratio"
    prefill_only: bool = False
    caveat: str = ""
    command: tuple[str, str] | None = None
    fit: Fit | None = None


def fitted(name: str, description: str, press: str, fit: Fit, **rest) -> LearnedPress:
    """A fitted press: kvpress's press class `press` of kvbench/learned/fitted/NAME.py, with its state in
    `state.safetensors`."""
    return LearnedPress(
        name, description, f"kvbench.learned.fitted.{name}:{press}", "state.safetensors", **rest, fit=fit
    )


LEARNED = [
    LearnedPress(
        "kvp",
        "KVP: learned per-head eviction agents (presses/kvp/<model>/)",
        "kvbench.learned.kvp.press:KVPPress",
        "agents.safetensors",
        folder_arg="agents",
        command=(
            "kvbench.cli.kvp:kvp",
            "Make KVP eviction agents for a model: datagen, then train; report shows how good they are.",
        ),
    ),
    LearnedPress(
        "distillcache",
        "DistillCache: learned KL-rewarded eviction policy (presses/distillcache/<model>/)",
        "kvbench.learned.distillcache.press:DistillCachePress",
        "policy.safetensors",
        command=(
            "kvbench.cli.distillcache:distillcache",
            "Make a DistillCache eviction policy for a model: datagen, then train; report shows how good it "
            "is.",
        ),
    ),
    LearnedPress(
        "memdecay",
        "MemDecay: region priorities decaying since last attended, page eviction (presses/memdecay/<model>/)",
        "kvbench.learned.memdecay.press:MemDecayPress",
        "calibration.json",
        folder_arg="calibration",
        hashes_text=True,
        command=(
            "kvbench.cli.memdecay:memdecay",
            "MemDecay's per-region half-lives and base priorities, measured on a model (see `calibrate`).",
        ),
    ),
    LearnedPress(
        "gate",
        "Gate: learned sigmoid gates per KV head, trained soft, evicting by gate (presses/gate/<model>/)",
        "kvbench.learned.gate.press:GatePress",
        "gates.safetensors",
        command=(
            "kvbench.cli.gate:gate",
            "Learned sigmoid gates per (layer, KV head): trained soft on the frozen model, evicting hard.",
        ),
    ),
    fitted(
        "qfilter",
        "Q-Filters: kvpress's press, filters fitted by `kvbench fit qfilter` (presses/qfilter/<model>/)",
        "FittedQFilterPress",
        Fit("one filter direction per (layer, KV head) from the queries' SVD"),
    ),
    fitted(
        "kvzap",
        "KVzap: kvpress's press, surrogates fitted by `kvbench fit kvzap` (presses/kvzap/<model>/)",
        "FittedKVzapPress",
        Fit(
            "linear and MLP surrogates of KVzip+ scores per layer, from the hidden states",
            {
                "tokens": 500,
                "hidden_dim": 512,
                "epochs": 15,
                "lr": 5e-3,
                "batch_size": 512,
                "alpha": 1.0,
                "seed": 0,
            },
            min_prompts=2,  # one is held out to validate
        ),
        prefill_only=True,
        caveat="kvpress's KVzapPress scores only the forward's new tokens (from their hidden states): it "
        "compresses a prefill, not a cache again (kvpress pairs it with DMSPress to compress while decoding)",
    ),
    fitted(
        "fastkvzip",
        "Fast KVzip: kvpress's press, gates fitted by `kvbench fit fastkvzip` (presses/fastkvzip/<model>/)",
        "FittedFastKVzipPress",
        Fit(
            "a low-rank sink-attention gate per layer, distilled from KVzip's scores",
            {"dim": 16, "sink": 16, "steps": 5000, "batch_size": 1000, "lr": 0.2, "seed": 0},
        ),
        caveat="one budget over all layers (kvpress's layerwise=False evicts the lowest gate scores of the "
        "whole cache, rounded down once): a layer can hold more than the ratio's share (174 for 172 at "
        "ratio 0.1 of 96 tokens)",
    ),
    fitted(
        "expected_attention_stats",
        "expected attention: kvpress's press, query statistics fitted by `kvbench fit` (presses/NAME/MODEL/)",
        "FittedExpectedAttentionStatsPress",
        Fit(
            "mean and covariance of the queries before RoPE per layer and head",
            {"n_sink": 4, "bfloat16": False},
        ),
    ),
    fitted(
        "duo_attention",
        "DuoAttention: kvpress's press, head patterns fitted by `kvbench fit duo_attention`",
        "FittedDuoAttentionPress",
        Fit(
            "retrieval and streaming heads by the area under the mean query's cumulated attention",
            {"q_len": 500},
        ),
        ratio_field="head_compression_ratio",
        caveat="its ratio is kvpress's head_compression_ratio, the share of heads made streaming; a "
        "streaming head keeps its 128 sink and 256 recent tokens, so the entries kept are not the ratio's "
        "(none removed under 384 tokens)",
    ),
]
FITTED = {press.name: press for press in LEARNED if press.fit is not None}
