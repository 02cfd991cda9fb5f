"""kvpress's presses, all of them: every exported press is registered or listed with the reason it is not, and
the presses that run alone (their own forward, head masks, read-only ratios, per-layer cache lengths,
decoding-time merging, a LoRA pass) answer in the engine as kvpress runs them.

The reference is kvpress's pipeline; where layers keep different numbers of entries the pipeline cannot
decode on CPU (it masks every layer as the first), and the reference is the pipeline's flow with the question
fed one token at a time (`stepwise_reference`), as for pyramidkv in tests/engine/test_engine.py.
"""

import contextlib

import kvpress
import pytest
import torch
from kvpress import KVPressTextGenerationPipeline
from kvpress.presses import restorekv_press
from safetensors.torch import save_file

from kvbench.bridge import adapter
from kvbench.bridge.models import EMBEDDED, converted
from kvbench.core.config import Config
from kvbench.core.errors import BadInput, UnknownPress
from kvbench.engine import evaluate as engine
from kvbench.engine import evaluate_sample
from kvbench.presses import NOT_REGISTERED, PRESSES, build_press, config_press, press_class
from tests.engine.test_engine import MAX_NEW_TOKENS, stepwise_reference, word_soup_sample

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tokenizer(embedded_tokenizer):
    return embedded_tokenizer


@pytest.fixture(scope="module")
def peaked_model(tiny_model, tokenizer, device):
    """tests/engine/test_engine.py's: the tiny model with peaked attention, named after the embedded folder
    (where kvzip and restorekv reload the tokenizer from)."""

    def make(architecture: str):
        model = tiny_model(architecture, len(tokenizer), initializer_range=0.1, attn_implementation="sdpa")
        model.config.name_or_path = str(converted(EMBEDDED))
        return model.to(device)

    return make


BASE_CLASSES = {"BasePress", "ScorerPress"}


def kvpress_class(spec) -> str | None:
    """The kvpress press a registry entry builds: its class, or for a class of ours, the first kvpress press
    it derives from (CAMRatioPress: CAMPress; a fitted press: the class whose loader it replaces), never
    kvpress's base classes."""
    cls = press_class(spec.factory.press_path)
    for candidate in cls.__mro__:
        if candidate.__module__.startswith("kvpress.") and candidate.__name__ not in BASE_CLASSES:
            return candidate.__name__
    return None


def unaccounted(module) -> set[str]:
    """kvpress's exported presses that are neither built by the registry nor listed with a reason."""
    exported = {name for name in dir(module) if name.endswith("Press")}
    registered = {kvpress_class(spec) for spec in PRESSES.values() if spec.factory is not None}
    return exported - registered - set(NOT_REGISTERED)


def test_every_exported_kvpress_press_is_registered_or_listed_with_its_reason():
    assert unaccounted(kvpress) == set()
    exported = {name for name in dir(kvpress) if name.endswith("Press")}
    registered = {kvpress_class(spec) for spec in PRESSES.values() if spec.factory is not None}
    # The list holds only presses kvpress still exports and the registry does not build, each with a reason.
    assert set(NOT_REGISTERED) <= exported and not set(NOT_REGISTERED) & registered
    assert all(len(reason) > 20 for reason in NOT_REGISTERED.values())


def test_kvbench_presses_lists_the_unregistered_ones_with_their_reasons():
    from click.testing import CliRunner

    from kvbench.cli import main

    listing = CliRunner().invoke(main, ["presses"]).output
    assert all(f"{name}: {reason}" in listing for name, reason in NOT_REGISTERED.items())
    assert "restorekv" in listing and "[needs: hub]" in listing


def test_a_press_a_new_kvpress_release_adds_is_caught(monkeypatch):
    monkeypatch.setattr(
        kvpress, "BrandNewPress", type("BrandNewPress", (kvpress.BasePress,), {}), raising=False
    )
    assert unaccounted(kvpress) == {"BrandNewPress"}


@contextlib.contextmanager
def recorded_ids(tokenizer):
    """The ids each `tokenizer.decode` call turns into an answer (engine and pipeline decode once)."""
    calls, decode = [], tokenizer.decode
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            tokenizer,
            "decode",
            lambda ids, *a, **k: calls.append([int(i) for i in ids]) or decode(ids, *a, **k),
        )
        yield calls


def engine_ids(model, tokenizer, sample, config) -> tuple[list[int], dict]:
    with recorded_ids(tokenizer) as calls:
        (result,) = evaluate_sample(model, tokenizer, sample, [config])
    return calls[0], result


def pipeline_ids(model, tokenizer, sample, press) -> list[int]:
    pipeline = KVPressTextGenerationPipeline(model=model, tokenizer=tokenizer, device=model.device)
    with recorded_ids(tokenizer) as calls:
        pipeline(
            sample.context,
            question=sample.question,
            answer_prefix=sample.answer_prefix,
            press=press,
            max_new_tokens=sample.max_new_tokens,
        )
    return calls[0]


# Presses whose layers keep the same number of entries: compared with kvpress's pipeline.
AS_THE_PIPELINE = [
    Config("dms", 0.0, (("sliding_window_size", 32), ("threshold", 0.01))),  # snapkv's scores
    Config(
        "dms", 0.0, (("decoding", True), ("inner", "knorm"), ("sliding_window_size", 32), ("threshold", -3.0))
    ),
    Config("composed", 0.5),  # snapkv + think
    Config("composed", 0.25, (("presses", "knorm+tova"),)),
    Config("cam", 0.5, (("compression_interval", 3),)),
    Config("cam", 0.75, (("compression_interval", 4), ("inner", "tova"))),
]


@pytest.mark.parametrize("architecture", ["llama", "qwen2"])
@pytest.mark.parametrize("config", AS_THE_PIPELINE, ids=str)
def test_presses_that_run_alone_answer_as_the_pipeline(
    monkeypatch, tokenizer, peaked_model, architecture, config
):
    model = peaked_model(architecture)
    sample = word_soup_sample(260)
    # CaM draws its merges: the engine seeds each config's draws; the pipeline's press is seeded the same way.
    monkeypatch.setattr(engine, "seed_press", lambda press, key: adapter.seed_press(press, "same"))
    ids, result = engine_ids(model, tokenizer, sample, config)
    reference = pipeline_ids(model, tokenizer, sample, adapter.seed_press(config_press(config), "same"))
    assert len(reference) == MAX_NEW_TOKENS and ids == reference
    uncompressed, _ = engine_ids(model, tokenizer, sample, Config("none", 0.0))
    assert ids != uncompressed  # the press changed the answer: the comparison means something
    if config.press == "dms":  # head-wise masks count as evicted
        assert result["kv_kept"] < result["kv_total"]


# Presses whose layers keep different numbers of entries (for simlayerkv: one lazy layer of two, at a
# threshold between the two layers' scores of this sample, 0.249 / 0.253 on llama, 0.228 / 0.222 on qwen2).
PER_LAYER = {
    "llama": [
        Config("kvcompose", 0.5),
        Config("simlayerkv", 0.0, (("lazy_threshold", 0.2512), ("n_recent", 64))),
        Config("per_layer_compression", 0.0, (("compression_ratios", "0.3,0.7"),)),
    ],
    "qwen2": [
        Config("kvcompose", 0.25),
        Config("simlayerkv", 0.0, (("lazy_threshold", 0.2251), ("n_recent", 64))),
        Config("per_layer_compression", 0.0, (("compression_ratios", "0.6,0.2"), ("inner", "tova"))),
    ],
}


@pytest.mark.parametrize("architecture", ["llama", "qwen2"])
@pytest.mark.parametrize("index", range(3), ids=["kvcompose", "simlayerkv", "per_layer_compression"])
def test_per_layer_cache_lengths_alone_answer_as_the_stepwise_pipeline(
    tokenizer, peaked_model, architecture, index
):
    model = peaked_model(architecture)
    sample = word_soup_sample(260)
    config = PER_LAYER[architecture][index]
    ids, result = engine_ids(model, tokenizer, sample, config)
    reference, lengths = stepwise_reference(model, tokenizer, sample, config)
    assert len(lengths) > 1  # the layers differ: one mask for all would be wrong
    assert ids == reference
    assert result["kv_kept"] < result["kv_total"]


def test_restorekv_with_local_adapters_answers_as_the_pipeline(
    monkeypatch, tmp_path, tokenizer, peaked_model
):
    """RestoreKV's adapters come from the hub (none for the embedded model): a random LoRA adapter and random
    restore embeddings, saved where kvpress looks for them, stand in for a trained pair."""
    from peft import LoraConfig, get_peft_model

    model = peaked_model("llama")
    folder = tmp_path / "higokri" / f"RestoreKV-{model.config.name_or_path.split('/')[-1]}"
    torch.manual_seed(0)
    adapters = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    get_peft_model(peaked_model("llama"), adapters).save_pretrained(folder)
    save_file(
        {"restore_embeddings": torch.randn(8, 64) * 0.1}, str(folder / "restore_embeddings.safetensors")
    )
    monkeypatch.setattr(restorekv_press, "hf_hub_download", lambda repo, name: str(tmp_path / repo / name))
    monkeypatch.chdir(tmp_path)  # where model.load_adapter finds "higokri/RestoreKV-<model>"
    sample = word_soup_sample(260)
    ids, result = engine_ids(model, tokenizer, sample, Config("restorekv", 0.5))
    assert ids == pipeline_ids(model, tokenizer, sample, build_press("restorekv", 0.5))
    kvzip, _ = engine_ids(model, tokenizer, sample, Config("kvzip", 0.5))
    assert ids != kvzip  # the restore tokens changed the answer
    assert result["kv_kept"] == result["kv_total"] // 2  # the 8 restore tokens fill part of the same budget


@pytest.mark.parametrize(
    "name, ratio, args, error",
    [
        ("dms", 0.5, {"threshold": 0.1}, BadInput),  # set by its threshold, not a ratio
        ("dms", 0.0, {}, BadInput),  # no threshold
        ("dms", 0.0, {"threshold": 0.1, "inner": "adakv"}, UnknownPress),  # inner is no scorer
        ("simlayerkv", 0.0, {"lazy_threshold": 1.5}, BadInput),  # kvpress's assert
        ("per_layer_compression", 0.0, {"compression_ratios": "0.3,1.2"}, BadInput),
        ("per_layer_compression", 0.0, {"compression_ratios": "0.3,x"}, BadInput),
        ("composed", 0.5, {"presses": "snapkv+adakv"}, UnknownPress),
        ("composed", 0.5, {"presses": "knorm+quant"}, UnknownPress),
        ("kvcompose", 0.5, {"structured": False}, BadInput),
        ("cam", 0.5, {"inner": "chunkkv"}, UnknownPress),
    ],
)
def test_bad_requests_for_the_new_presses_are_one_line_errors(name, ratio, args, error):
    with pytest.raises(error) as info:
        build_press(name, ratio, **args)
    assert "\n" not in str(info.value) and str(info.value)
