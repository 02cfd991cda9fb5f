"""The engine must answer exactly as kvpress's pipeline does, config by config, token for token."""

import copy
import logging
import random

import pytest
import torch
from kvpress import DecodingPress, KnormPress, KVPressTextGenerationPipeline, PrefillDecodingPress
from transformers import DynamicCache

from kvbench.bridge import adapter
from kvbench.bridge.models import EMBEDDED, converted, load_model, load_tokenizer
from kvbench.core.config import Config
from kvbench.engine import decoder, evaluate_sample, steps
from kvbench.engine import evaluate as engine
from kvbench.engine.decoder import BatchedDecoder
from kvbench.learned.distillcache.policy import DistillCachePolicy
from kvbench.learned.distillcache.press import save_policy
from kvbench.learned.fitted import METHODS
from kvbench.learned.gate.gates import GateSet
from kvbench.learned.gate.press import save_gates
from kvbench.learned.kvp.agent import KVPAgents
from kvbench.learned.kvp.checkpoint import model_shape, save_agents
from kvbench.presses import PRESSES, config_press, needs_eager
from kvbench.tasks.base import Sample
from kvbench.tasks.prompt import REGIONS, tokenize_sample

MAX_NEW_TOKENS = 10
RATIOS = (0.25, 0.5, 0.75)
# Presses that must share the prefill; a regression in `is_shareable` would silently slow every sweep.
MUST_SHARE = {
    "none",
    "knorm",
    "snapkv",
    "tova",
    "h2o",
    "streaming_llm",
    "expected_attention",
    "random",
    "kvp",
    "distillcache",
}


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


@pytest.fixture(scope="module")
def peaked_model(tiny_model, tokenizer, device):
    """The tiny model with a larger init than the default: peaked attention, so that presses and ratios
    change the answers; named after the embedded folder, where kvzip reloads the tokenizer from."""

    def make(architecture: str):
        model = tiny_model(architecture, len(tokenizer), initializer_range=0.1, attn_implementation="sdpa")
        model.config.name_or_path = str(converted(EMBEDDED))
        return model.to(device)

    return make


def word_soup_sample(n_words: int, **changes) -> Sample:
    rng = random.Random(0)
    words = "red green blue cat dog bird one two three north south east west river hill stone".split()
    fields = dict(
        task="soup",
        id="0",
        context=" ".join(rng.choice(words) for _ in range(n_words)),
        question="Which colour comes first?",
        answer_prefix="Answer:",
        references=["red"],
        max_new_tokens=MAX_NEW_TOKENS,
        metric="none",
    )
    return Sample(**{**fields, **changes})


def save_random_kvp_agents(model, directory) -> str:
    shape = model_shape(model)
    torch.manual_seed(1)
    agents = KVPAgents(shape.num_heads, shape.head_dim, hidden=16)
    torch.nn.init.normal_(agents.w3)
    save_agents(directory, agents, {"model": vars(shape), "heads": list(range(shape.num_heads))})
    return str(directory)


def save_random_distillcache_policy(model, directory) -> str:
    torch.manual_seed(1)
    policy = DistillCachePolicy(hidden=8)
    torch.nn.init.normal_(policy.net[2].weight)
    save_policy(directory, policy, {"model": vars(model_shape(model))})
    return str(directory)


def save_random_gates(model, directory) -> str:
    shape = model_shape(model)
    gates = GateSet(shape.num_layers, shape.num_kv_heads, shape.head_dim)
    with torch.no_grad():
        gates.weight.normal_(generator=torch.Generator().manual_seed(1))
    save_gates(directory, gates, {"model": vars(shape), "training": {}, "validation": {}})
    return str(directory)


def save_fitted_state(model, tokenizer, directory, name: str) -> str:
    """State fitted on two random contexts (kvzap: tiny surrogates, one epoch; fastkvzip: three steps)."""
    from kvbench.learned.fitted import FitConfig, card_of, check_options, method, save_fitted

    tiny = {"kvzap": {"hidden_dim": "8", "epochs": "1", "tokens": "8"}, "fastkvzip": {"steps": "3"}}
    options = check_options(name, tiny.get(name, {}))
    generator = torch.Generator().manual_seed(9)
    contexts = [torch.randint(0, model.config.vocab_size, (1, 24), generator=generator) for _ in range(2)]
    tensors, validation = method(name).fit(model, tokenizer, contexts, options)
    save_fitted(
        directory, name, tensors, card_of(model, FitConfig(options=options), contexts, 0.0, validation)
    )
    return str(directory)


def registry_configs(model, tmp_path, tokenizer) -> list[Config]:
    """Every press of the registry that runs offline: shareable ones at several ratios, the others at one."""
    # pyramidkv, chunkkv: per-layer cache lengths, which kvpress's pipeline decodes only with flash attention;
    # test_per_layer_cache_lengths_decode_in_the_same_batch checks them against a stepwise reference.
    # memdecay reads the context's regions, which kvpress's pipeline does not give: test_memdecay runs it
    # in the engine under every protocol. kvcompose (per-layer lengths) and the presses set by a knob of
    # their own, not a ratio: tests/presses/test_kvpress_presses.py.
    skipped = {"none", "pyramidkv", "chunkkv", "memdecay", "kvcompose"} | {
        name for name, spec in PRESSES.items() if "hub" in spec.needs or spec.knob
    }
    configs = [Config("none", 0.0)]
    for name in sorted(PRESSES.keys() - skipped):
        args = (("agents", save_random_kvp_agents(model, tmp_path / "kvp")),) if name == "kvp" else ()
        if name == "distillcache":
            args = (("weights", save_random_distillcache_policy(model, tmp_path / "distillcache")),)
        if name == "gate":
            args = (("weights", save_random_gates(model, tmp_path / "gate")),)
        if name in METHODS:
            args = (("weights", save_fitted_state(model, tokenizer, tmp_path / name, name)),)
        shareable = adapter.is_shareable(config_press(Config(name, 0.5, args)))
        # Codecs store every entry in fewer bits: the highest ratios ask for less memory than 2 bits take.
        ratios = RATIOS if shareable else (0.5,)
        configs += [Config(name, r, args) for r in ratios if not (PRESSES[name].codec and r > 0.5)]
    return configs


def decoded_token_ids(monkeypatch, tokenizer) -> list[list[int]]:
    """Record the ids each `tokenizer.decode` call turns into an answer (engine and pipeline decode once)."""
    calls = []
    decode = tokenizer.decode

    def recording_decode(ids, *args, **kwargs):
        calls.append([int(i) for i in ids])
        return decode(ids, *args, **kwargs)

    monkeypatch.setattr(tokenizer, "decode", recording_decode)
    return calls


def pipeline_token_ids(monkeypatch, model, tokenizer, sample: Sample, config: Config) -> list[int]:
    """The reference: kvpress's pipeline, on an eager model for presses that need attention weights."""
    pipeline = KVPressTextGenerationPipeline(model=model, tokenizer=tokenizer, device=model.device)
    calls = decoded_token_ids(monkeypatch, tokenizer)
    eager = needs_eager(config.press, dict(config.press_args))
    with adapter.attention_implementation(model, "eager" if eager else model.config._attn_implementation):
        pipeline(
            sample.context,
            question=sample.question,
            answer_prefix=sample.answer_prefix,
            press=config_press(config),
            max_new_tokens=sample.max_new_tokens,
        )
    monkeypatch.undo()
    (ids,) = calls
    return ids


def engine_token_ids(
    monkeypatch, model, tokenizer, sample, configs, **kwargs
) -> tuple[list[list[int]], list]:
    calls = decoded_token_ids(monkeypatch, tokenizer)
    results = evaluate_sample(model, tokenizer, sample, configs, **kwargs)
    monkeypatch.undo()
    return calls, results


@pytest.mark.parametrize("architecture", ["llama", "qwen2"])
def test_every_registry_press_answers_as_the_kvpress_pipeline(
    monkeypatch, tokenizer, tmp_path, architecture, peaked_model
):
    model = peaked_model(architecture)
    sample = word_soup_sample(260)
    configs = registry_configs(model, tmp_path, tokenizer)
    shared = {c.press for c in configs if adapter.is_shareable(config_press(c))}
    assert MUST_SHARE <= shared

    # Chunks of 7 configs: several prefills, batches mixing presses and ratios, caches of different lengths.
    engine_ids, results = engine_token_ids(monkeypatch, model, tokenizer, sample, configs, batch_configs=7)

    for config, ids, result in zip(configs, engine_ids, results, strict=True):
        reference = pipeline_token_ids(monkeypatch, model, tokenizer, sample, config)
        assert len(reference) == MAX_NEW_TOKENS  # no early stop: every token is compared
        assert ids == reference, config
        assert result["prediction"] == tokenizer.decode(reference, skip_special_tokens=True)
    # The comparison means something only if compression changes the answers.
    assert len({tuple(ids) for ids in engine_ids}) >= len(configs) // 3


def stepwise_reference(model, tokenizer, sample: Sample, config: Config) -> tuple[list[int], set[int]]:
    """The pipeline's flow with the question fed one token at a time, and the cache's per-layer lengths.

    With one query at a time no mask is needed, so per-layer cache lengths work on CPU, where kvpress's
    pipeline fails (it builds the question's mask from the first layer's length).
    """
    prompt = tokenize_sample(tokenizer, sample)
    cache = DynamicCache()
    with torch.no_grad():
        with config_press(config)(model):
            model.model(input_ids=prompt.context_ids.to(model.device), past_key_values=cache)
        lengths = {layer.keys.shape[2] for layer in cache.layers}
        position = prompt.context_ids.shape[1]
        ids = [*prompt.question_ids[0].tolist()]
        for step in range(prompt.question_ids.shape[1] + sample.max_new_tokens - 1):
            logits = model(
                input_ids=torch.tensor([[ids[step]]], device=model.device),
                past_key_values=cache,
                position_ids=torch.tensor([[position]], device=model.device),
            ).logits
            position += 1
            if step >= prompt.question_ids.shape[1] - 1:
                ids.append(int(logits[0, -1].argmax()))
    return ids[prompt.question_ids.shape[1] :], lengths


def test_per_layer_cache_lengths_decode_in_the_same_batch(monkeypatch, tokenizer, peaked_model):
    model = peaked_model("llama")
    sample = word_soup_sample(200)
    configs = [Config("pyramidkv", 0.5), Config("knorm", 0.5), Config("chunkkv", 0.75), Config("tova", 0.25)]
    engine_ids, _ = engine_token_ids(monkeypatch, model, tokenizer, sample, configs)
    references = [stepwise_reference(model, tokenizer, sample, config) for config in configs]
    # pyramidkv's layers always differ in length. chunkkv's differ only when some layers keep the short last
    # chunk, which rides on float rounding: they did on CPU and did not on an H200.
    assert [len(lengths) > 1 for _, lengths in references] in (
        [True, False, True, False],
        [True, False, False, False],
    )
    # The stepwise reference itself equals the pipeline where the pipeline runs.
    assert references[1][0] == pipeline_token_ids(monkeypatch, model, tokenizer, sample, configs[1])
    assert engine_ids == [ids for ids, _ in references]


def test_presses_that_cannot_share_run_alone_and_still_match(monkeypatch, tokenizer, caplog, peaked_model):
    model = peaked_model("llama")
    sample = word_soup_sample(120)
    adakv = (("inner", "knorm"),)
    configs = [
        Config("adakv", 0.5, adakv),
        Config("knorm", 0.5),
        Config("none", 0.0),
        Config("adakv", 0.75, adakv),
    ]
    assert [adapter.is_shareable(config_press(c)) for c in configs] == [False, True, True, False]
    engine._logged_fallbacks.clear()
    with caplog.at_level(logging.INFO, logger="kvbench.engine"):
        engine_ids, results = engine_token_ids(monkeypatch, model, tokenizer, sample, configs)
    assert len([r for r in caplog.records if "AdaKVPress" in r.message]) == 1
    # Head-wise masks must not outlive their run.
    assert all(getattr(layer.self_attn, "masked_key_indices", None) is None for layer in model.model.layers)
    for config, ids in zip(configs, engine_ids, strict=True):
        assert ids == pipeline_token_ids(monkeypatch, model, tokenizer, sample, config)
    # AdaKV masks entries instead of removing them: they count as evicted, in entries and in bytes.
    assert results[0]["kv_kept"] == results[1]["kv_kept"] < results[2]["kv_kept"]
    assert results[0]["kv_bytes"] == results[1]["kv_bytes"] < results[2]["kv_bytes"]


def test_each_stream_stops_at_its_own_stop_token(monkeypatch, tokenizer, peaked_model):
    model = peaked_model("llama")
    sample = word_soup_sample(120)
    # The longest cache stops first: the other streams go on over a batch compacted around them.
    configs = [Config("knorm", 0.25), Config("knorm", 0.5), Config("tova", 0.5), Config("tova", 0.75)]
    free_run, _ = engine_token_ids(monkeypatch, model, tokenizer, sample, configs)
    # The first stream's second token becomes a stop token: it stops there, others at their own pace.
    model.generation_config.eos_token_id = [2, free_run[0][1]]
    engine_ids, _ = engine_token_ids(monkeypatch, model, tokenizer, sample, configs)
    assert len(engine_ids[0]) == 2 and MAX_NEW_TOKENS in {len(ids) for ids in engine_ids}
    for config, ids in zip(configs, engine_ids, strict=True):
        assert ids == pipeline_token_ids(monkeypatch, model, tokenizer, sample, config), config


def test_a_scorer_at_several_ratios_scores_each_layer_once(monkeypatch, tokenizer, peaked_model):
    model = peaked_model("llama")
    calls = []
    score = KnormPress.score
    monkeypatch.setattr(KnormPress, "score", lambda self, *args: calls.append(self) or score(self, *args))
    configs = [Config("knorm", 0.25), Config("knorm", 0.5), Config("knorm", 0.75), Config("random", 0.5)]
    evaluate_sample(model, tokenizer, word_soup_sample(120), configs)
    assert len(calls) == model.config.num_hidden_layers


def test_compaction_keeps_groups_together_and_moves_as_few_rows_as_it_can():
    groups = [0, 0, 0, 1, 1, 1, 2, 2]
    running = [True, False, True, True, True, True, False, True]
    order = decoder.compaction_order(groups, running)
    # Every running row once; the groups in their order and contiguous.
    assert sorted(order) == [row for row, run in enumerate(running) if run]
    assert [groups[row] for row in order] == [0, 0, 1, 1, 1, 2]
    # Only the slots left empty in a group's range are refilled: rows 0, 3 and 4 stay where they are.
    assert [slot for slot, row in enumerate(order) if slot != row] == [1, 2, 5]
    assert decoder.compaction_order([0] * 4, [True, False, True, True]) == [0, 3, 2]


def test_a_batched_step_of_9_to_15_rows_goes_through_the_linear_layers_as_16(
    monkeypatch, tokenizer, tiny_model
):
    monkeypatch.setattr(adapter, "pads_rows", lambda model: True)  # whatever CPU runs the test
    model = tiny_model("qwen2", len(tokenizer))  # its q/k/v projections have biases
    projection = model.model.layers[0].self_attn.q_proj
    one, few, many = torch.randn(1, 1, 64), torch.randn(13, 1, 64), torch.randn(4, 8, 64)
    calls = []
    linear = torch.nn.functional.linear
    monkeypatch.setattr(adapter.F, "linear", lambda x, *args: calls.append(x.shape[0]) or linear(x, *args))
    with adapter.padded_linears(model):
        with adapter.padded_linears(model):
            pass  # an inner block leaves the outer one's layers patched
        outputs = [projection(x) for x in (one, few, many)]
    assert calls == [1, 16, 4]
    assert not any("forward" in vars(module) for module in model.modules())
    expected = [linear(x, projection.weight, projection.bias) for x in (one, few, many)]
    assert torch.equal(outputs[0], expected[0])  # a config alone computes exactly as the pipeline
    torch.testing.assert_close(outputs[1], expected[1])
    assert torch.equal(outputs[2], expected[2])


def test_a_row_replaced_after_compression_is_right_aligned_over_zeros():
    keys = torch.randn(2, 1, 6, 4)
    layer = adapter.BufferedLayer(torch.zeros(2, 1, 8, 4), torch.zeros(2, 1, 8, 4), 0)
    layer.update(keys, -keys)
    layer.replace_row(1, keys[1:, :, 2:], -keys[1:, :, 2:], held=6)
    layer.replace_row(1, keys[1:, :, 4:], -keys[1:, :, 4:], held=4)  # zeroes only what it frees
    assert torch.equal(layer.keys[0], keys[0]) and torch.equal(layer.values[0], -keys[0])
    assert torch.equal(layer.keys[1, :, 4:], keys[1, :, 4:]) and not layer.keys[1, :, :4].any()
    assert torch.equal(layer.values[1, :, 4:], -keys[1, :, 4:]) and not layer.values[1, :, :4].any()


def test_a_tokenizer_without_chat_template_gets_the_pipelines_bos_fallback(
    monkeypatch, tokenizer, peaked_model
):
    model = peaked_model("llama")
    plain = copy.deepcopy(tokenizer)
    plain.chat_template = (
        None  # a base model: the pipeline puts BOS before the context, "\n" after the question
    )
    sample = word_soup_sample(100)
    configs = [Config("knorm", 0.5), Config("snapkv", 0.25)]
    engine_ids, _ = engine_token_ids(monkeypatch, model, plain, sample, configs)
    for config, ids in zip(configs, engine_ids, strict=True):
        assert ids == pipeline_token_ids(monkeypatch, model, plain, sample, config)


def test_a_raw_prompt_sample_is_tokenized_as_its_official_code(tokenizer):
    sample = word_soup_sample(
        50, chat_template=False, question="\nWhich colour comes first?", answer_prefix="Type:"
    )
    prompt = tokenize_sample(tokenizer, sample)
    # Official LongBench tokenizes the raw prompt with the tokenizer's defaults: no template, no suffix.
    expected = tokenizer(sample.context + sample.question + "Type:").input_ids
    assert prompt.context_ids[0].tolist() + prompt.question_ids[0].tolist() == expected
    assert tokenizer.decode(prompt.question_ids[0]).endswith("Type:")


@pytest.mark.parametrize("architecture", ["llama", "qwen2"])
def test_attention_weights_are_those_of_the_eager_attention(tokenizer, architecture, peaked_model):
    model = peaked_model(architecture)
    model.set_attn_implementation("eager")
    compared = []

    def compare(module, args, kwargs, output):
        keys = kwargs["past_key_values"].layers[module.layer_idx].keys
        torch.testing.assert_close(
            adapter.attention_weights(module, kwargs["hidden_states"], kwargs["position_embeddings"], keys),
            output[1],
            rtol=0,
            atol=1e-7,
        )
        compared.append(module.layer_idx)

    handles = [
        layer.self_attn.register_forward_hook(compare, with_kwargs=True) for layer in model.model.layers
    ]
    with torch.no_grad():
        model.model(
            input_ids=torch.randint(0, 1000, (1, 50), device=model.device), past_key_values=DynamicCache()
        )
    for handle in handles:
        handle.remove()
    assert compared == [0, 1]


def test_kv_accounting_counts_entries_and_bytes_kept(tokenizer, peaked_model):
    model = peaked_model("llama")
    sample = word_soup_sample(80)
    none, knorm = evaluate_sample(model, tokenizer, sample, [Config("none", 0.0), Config("knorm", 0.3)])
    n = tokenize_sample(tokenizer, sample).context_ids.shape[1]
    layers, kv_heads, head_dim = 2, 2, 16
    assert none["context_tokens"] == knorm["context_tokens"] == n
    assert none["kv_total"] == knorm["kv_total"] == none["kv_kept"] == layers * kv_heads * n
    assert knorm["kv_kept"] == layers * kv_heads * int(n * 0.7)
    # Counted as a 16-bit cache stores keys and values, though the model computes in fp32.
    assert knorm["kv_bytes"] == knorm["kv_kept"] * head_dim * 2 * 2
    assert (
        none["kv_bytes"] == none["kv_bytes_full"] == knorm["kv_bytes_full"] == none["kv_total"] * head_dim * 4
    )
    assert all(r["prefill_s"] > 0 and r["decode_s"] > 0 for r in (none, knorm))


def test_first_line_keeps_the_first_non_empty_line(tokenizer):
    ids = tokenizer.encode("\n\nParis is the capital.\nIt is in France.", add_special_tokens=False)
    first_line = word_soup_sample(1, first_line=True)
    assert engine.decode_prediction(tokenizer, ids, first_line) == "Paris is the capital."
    assert engine.decode_prediction(tokenizer, ids, word_soup_sample(1)).endswith("in France.")


@pytest.mark.slow
def test_embedded_model_matches_the_pipeline(monkeypatch, device):
    model, tokenizer = load_model(device=device)
    needle = "The secret code of the blue door is 4711."
    filler = "The grass is green. The sky is blue. The sun is warm. " * 10
    sample = word_soup_sample(
        0,
        context=filler + needle + " " + filler,
        question="What is the secret code of the blue door?",
        answer_prefix="The secret code is",
        max_new_tokens=8,
    )
    configs = [Config(press, ratio) for press in ("knorm", "snapkv") for ratio in (0.25, 0.75)]
    engine_ids, results = engine_token_ids(monkeypatch, model, tokenizer, sample, configs)
    assert 250 < results[0]["context_tokens"] < 400
    for config, ids in zip(configs, engine_ids, strict=True):
        assert ids == pipeline_token_ids(monkeypatch, model, tokenizer, sample, config), config


def test_chat_turns_are_rendered_with_the_template_and_each_token_has_its_region(tokenizer):
    messages = [
        {"role": "system", "content": "The deploy region is eu-west-3."},
        {"role": "user", "content": "Find the failing job."},
        {"role": "assistant", "content": "call search(jobs)"},
        {"role": "tool", "content": "job 17 failed at step compile"},
        {"role": "assistant", "content": "Job 17 is the one to look at.", "region": "scratchpad"},
    ]
    question = "Which job failed?"
    sample = Sample("t", "0", "", question, "Answer:", ["17"], 5, "string_match_all", messages=messages)
    prompt = tokenize_sample(tokenizer, sample)
    rendered = tokenizer.apply_chat_template(
        [*messages, {"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
    )
    full = torch.cat([prompt.context_ids, prompt.question_ids], dim=1)[0].tolist()
    assert full == tokenizer.encode(rendered + "Answer:", add_special_tokens=False)
    assert prompt.regions.shape == (prompt.context_ids.shape[1],)
    # Each message's content is tokenized within its own region.
    for message in messages:
        region = REGIONS.index(message.get("region", message["role"]))
        ids = tokenizer.encode(message["content"], add_special_tokens=False)
        context = prompt.context_ids[0].tolist()
        start = next(i for i in range(len(context)) if context[i : i + len(ids)] == ids)
        assert set(prompt.regions[start : start + len(ids)].tolist()) == {region}, message
    assert prompt.regions[-1] == REGIONS.index("scratchpad")  # the last turn runs to the question


def test_a_plain_context_is_user_after_the_templates_system_prompt(tokenizer):
    sample = word_soup_sample(40)
    prompt = tokenize_sample(tokenizer, sample)
    regions = prompt.regions.tolist()
    assert regions[0] == REGIONS.index("system")
    assert regions[-1] == REGIONS.index("user")
    assert regions == sorted(regions)  # one system span, then the user's


DECODE_STEPS = 24


def decode_time_reference(monkeypatch, model, tokenizer, sample, config: Config) -> list[int]:
    """kvpress's pipeline with the equivalent PrefillDecodingPress: the press at the ratio on the prefill,
    and a DecodingPress of the same press back to the prefill's size every `interval` steps."""
    prefill = config_press(config)
    target = int(tokenize_sample(tokenizer, sample).context_ids.shape[1] * (1 - config.ratio))
    interval = dict(config.protocol_args)["interval"]
    base = config_press(Config(config.press, 0.0))
    adapter.keep_cache_order(base)  # as the engine's decoding presses do (kvpress issue #173)
    decoding = DecodingPress(base_press=base, compression_interval=interval, target_size=target)
    pipeline = KVPressTextGenerationPipeline(model=model, tokenizer=tokenizer, device=model.device)
    calls = decoded_token_ids(monkeypatch, tokenizer)
    eager = needs_eager(config.press)
    with adapter.attention_implementation(model, "eager" if eager else model.config._attn_implementation):
        pipeline(
            sample.context,
            question=sample.question,
            answer_prefix=sample.answer_prefix,
            press=PrefillDecodingPress(prefilling_press=prefill, decoding_press=decoding),
            max_new_tokens=sample.max_new_tokens,
        )
    monkeypatch.undo()
    (ids,) = calls
    return ids


@pytest.mark.parametrize("architecture", ["llama", "qwen2"])
def test_decode_time_compression_in_the_batch_answers_as_kvpress_decoding_press(
    monkeypatch, tokenizer, architecture, peaked_model
):
    # float64: in float32 the batch's rows and kvpress's single row round differently on some CPUs (an
    # AMD EPYC flipped a near-tie in knorm's top-k at step 19); what is kept is under test, not rounding.
    model = peaked_model(architecture).double()
    sample = word_soup_sample(150, max_new_tokens=DECODE_STEPS)
    configs = [Config("none", 0.0)] + [
        Config(press, ratio, protocol="decode-time", protocol_args=(("interval", interval),))
        for press, ratio, interval in [
            ("knorm", 0.5, 3),
            ("knorm", 0.5, 7),
            ("tova", 0.75, 4),
            ("streaming_llm", 0.5, 5),
            ("h2o", 0.5, 3),  # scores with the attention weights of the decoding steps
            ("keydiff", 0.25, 2),
        ]
    ]
    # Query-agnostic configs of the same presses share the batch; their answers must differ.
    configs += [Config("knorm", 0.5), Config("tova", 0.75)]
    engine_ids, results = engine_token_ids(monkeypatch, model, tokenizer, sample, configs)
    assert engine_ids[0] == pipeline_token_ids(monkeypatch, model, tokenizer, sample, configs[0])
    for config, ids in zip(configs[1:-2], engine_ids[1:-2], strict=True):
        reference = decode_time_reference(monkeypatch, model, tokenizer, sample, config)
        assert len(reference) == DECODE_STEPS
        assert ids == reference, config
    assert engine_ids[1] != engine_ids[-2] or engine_ids[3] != engine_ids[-1]
    assert all(result["kv_kept"] < results[0]["kv_kept"] for result in results[1:])


@pytest.mark.parametrize("codec", ["qevict", "quant"])
def test_a_codec_compresses_while_decoding_as_alone_on_a_plain_cache(
    monkeypatch, tokenizer, peaked_model, codec
):
    """A codec during decoding (QEvict re-tiers, quant quantises the new tokens): in the engine's batch,
    each row answers as the press does alone under kvpress's hooks on a plain cache: the prefill, then the
    same instance (QEvict's tiers and scores go on) every 8 decoding steps on the growing cache."""
    model = peaked_model("llama")
    sample = word_soup_sample(150, max_new_tokens=DECODE_STEPS)
    decode_time = {"protocol": "decode-time", "protocol_args": (("interval", 8),)}
    # (0.3: 2-bit codes of this tiny model's 16-dim heads need 0.28 of its 16-bit cache)
    configs = [Config(codec, 0.0, memory=m, **decode_time) for m in (0.5, 0.3)] + [Config("knorm", 0.5)]
    _, results = engine_token_ids(monkeypatch, model, tokenizer, sample, configs)
    prompt = tokenize_sample(tokenizer, sample)
    n = prompt.context_ids.shape[1]
    answers = []
    for config, result in zip(configs[:2], results, strict=False):
        press, cache = config_press(config), DynamicCache()
        decoding = adapter.decoding_press(press, 8, steps.budget_entries(config, n))
        with torch.no_grad():
            with press(model):
                model.model(input_ids=prompt.context_ids.to(model.device), past_key_values=cache)
            # kvpress's __call__ would reset the press's state first; hook it as it is instead.
            with adapter.attention_hooks(model, decoding.forward_hook):
                decoder = BatchedDecoder(model, cache, attention=None)
                (tokens,) = decoder.decode(prompt.question_ids.to(model.device), n, sample.max_new_tokens)
        assert result["prediction"] == tokenizer.decode(tokens, skip_special_tokens=True), config
        answers.append(tokens)
    assert answers[0] != answers[1]
    assert results[1]["kv_bytes"] <= 0.3 * results[1]["kv_bytes_full"] < results[0]["kv_bytes"]


def streaming_reference(model, tokenizer, sample, config: Config) -> tuple[list[int], int]:
    """One config alone: the context fed chunk by chunk under kvpress's own DecodingPress (a step per
    chunk, back to the budget), then the question and greedy decoding on that cache, no press."""
    prompt = tokenize_sample(tokenizer, sample)
    n = prompt.context_ids.shape[1]
    chunk = dict(config.protocol_args)["chunk"]
    cache = DynamicCache()
    base = config_press(config)
    base.post_init_from_model(model)
    press = adapter.decoding_press(base, 1, steps.budget_entries(config, n), buffer_size=1)
    with torch.no_grad():
        with press(model):
            for start in range(0, n, chunk):
                ids = prompt.context_ids[:, start : start + chunk].to(model.device)
                positions = torch.arange(start, start + ids.shape[1], device=model.device).unsqueeze(0)
                model(input_ids=ids, past_key_values=cache, position_ids=positions)
        held = cache.get_seq_length()
        ids = prompt.question_ids.to(model.device)
        position, tokens = n, []
        for _ in range(sample.max_new_tokens):
            positions = torch.arange(position, position + ids.shape[1], device=model.device).unsqueeze(0)
            logits = model(input_ids=ids, past_key_values=cache, position_ids=positions).logits
            position += ids.shape[1]
            tokens.append(int(logits[0, -1].argmax()))
            ids = torch.tensor([[tokens[-1]]], device=model.device)
    return tokens, held


def test_streaming_feeds_chunks_as_one_batch_and_answers_as_each_config_alone(
    monkeypatch, tokenizer, peaked_model
):
    model = peaked_model("llama")
    sample = word_soup_sample(200)
    streaming = (("chunk", 64),)
    configs = [
        Config(press, ratio, protocol="streaming", protocol_args=streaming)
        for press, ratio in [("knorm", 0.5), ("knorm", 0.75), ("tova", 0.5), ("streaming_llm", 0.75)]
    ]
    # QEvict re-tiers its windows after every chunk within a memory budget.
    qevict = Config("qevict", 0.0, memory=0.3, protocol="streaming", protocol_args=streaming)
    configs += [qevict, Config("none", 0.0, protocol="streaming", protocol_args=streaming)]
    engine_ids, results = engine_token_ids(monkeypatch, model, tokenizer, sample, configs)
    n = tokenize_sample(tokenizer, sample).context_ids.shape[1]
    assert n > 3 * 64  # several chunks, several compressions
    for config, ids, result in zip(configs[:-1], engine_ids[:-1], results[:-1], strict=True):
        reference, held = streaming_reference(model, tokenizer, sample, config)
        assert ids == reference, config
        assert result["kv_kept"] == held * 2 * 2
        if config.press != "qevict":
            assert held == int(n * (1 - config.ratio))
    assert results[-2]["kv_bytes"] <= 0.3 * results[-2]["kv_bytes_full"]
    # Without a press, streaming is a chunked prefill: the same answer as the whole context at once.
    assert engine_ids[-1] == pipeline_token_ids(monkeypatch, model, tokenizer, sample, Config("none", 0.0))
    # Streaming compresses before the model has read the rest: answers differ from query-agnostic ones.
    agnostic, _ = engine_token_ids(monkeypatch, model, tokenizer, sample, [Config("knorm", 0.75)])
    assert agnostic[0] != engine_ids[1]
