"""MemDecay: the press against a plain-loop reference, its state across compressions, the calibration fit,
the press on real prefills through kvpress's machinery, and one-line errors."""

import contextlib
import json
import math
import shutil

import pytest
import torch
from kvpress import DecodingPress
from transformers import DynamicCache

from kvbench.bridge.models import load_model, load_tokenizer, model_name
from kvbench.learned.memdecay.calibration import LifetimeStats, fit_calibration, measure, write_calibration
from kvbench.learned.memdecay.press import CALIBRATION_FILE, MemDecayError, MemDecayPress, select_pages
from kvbench.presses import build_press
from kvbench.presses import queries as queries_module
from kvbench.tasks.base import Sample
from kvbench.tasks.prompt import REGIONS, tokenize_sample

SYSTEM, USER, ASSISTANT, TOOL, SCRATCHPAD = range(5)
CALIBRATION = {
    "threshold": 1.5,
    "regions": {
        "system": {"priority": 1.0, "half_life": 150.0},
        "user": {"priority": 0.7, "half_life": 6.0},
        "assistant": {"priority": 0.5, "half_life": 3.0},
        "tool": {"priority": 0.8, "half_life": 10.0},
        "scratchpad": {"priority": 0.3, "half_life": 1.5},
    },
}


def write_test_calibration(directory, name: str, **changes) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / CALIBRATION_FILE).write_text(json.dumps({"model": name, **CALIBRATION, **changes}))
    return str(directory)


@pytest.fixture
def tiny_llama(tiny_model):
    """The tiny model, named, its layers given the rotary embedding as kvpress's press(model) does."""
    model = tiny_model()
    model.config.kvbench_name = "tiny-test"
    for layer in model.model.layers:
        layer.self_attn.rotary_emb = model.model.rotary_emb
    return model


def make_press(tmp_path, model, **args) -> MemDecayPress:
    press = MemDecayPress(calibration=write_test_calibration(tmp_path / "cal", model_name(model)), **args)
    press.post_init_from_model(model)
    return press


# ---------------------------------------------------------------- the reference: plain loops, float64


@torch.no_grad()
def reference_attention(module, hidden, keys, position):
    """att[h][t][j]: attention of query t (of the n hidden states, at positions ending at `position`) on
    entry j, averaged over the query heads of KV head h, written out from the definitions."""
    config = module.config
    heads, kv_heads, dim = config.num_attention_heads, config.num_key_value_heads, module.head_dim
    groups = heads // kv_heads
    weight = module.q_proj.weight.double()
    inv_freq = module.rotary_emb.inv_freq.double()
    n, length = hidden.shape[1], keys.shape[2]
    out = [[[0.0] * length for _ in range(n)] for _ in range(kv_heads)]
    for t in range(n):
        q = weight @ hidden[0, t].double()
        angle = (position - n + 1 + t) * inv_freq
        own = length - n + t
        for head in range(heads):
            x = q[head * dim : (head + 1) * dim]
            half = dim // 2
            rotated = torch.cat(
                [
                    x[:half] * torch.cos(angle) - x[half:] * torch.sin(angle),
                    x[half:] * torch.cos(angle) + x[:half] * torch.sin(angle),
                ]
            )
            logits = [
                float(rotated @ keys[0, head // groups, j].double()) / math.sqrt(dim) for j in range(own + 1)
            ]
            top = max(logits)
            total = sum(math.exp(v - top) for v in logits)
            for j, v in enumerate(logits):
                out[head // groups][t][j] += math.exp(v - top) / total / groups
    return out


def reference_call(
    module, hidden, keys, old, n_kept, known_regions, decoding, position, beta, pin, page, sampled=None
):
    """One compression as MemDecay's docstring defines it: (kept indices per head, new state per head).
    `sampled`: {query t: the queries it stands for}, the scored sample (default: every query, once)."""
    length, kv_heads = keys.shape[2], keys.shape[1]
    kept_before = len(old[0]) if old else 0
    added = length - kept_before
    n = min(hidden.shape[1], added)
    att = reference_attention(module, hidden[:, -n:], keys, position)
    regions = CALIBRATION["regions"]
    threshold = CALIBRATION["threshold"]
    kept, states = [], []
    for h in range(kv_heads):
        entries = [
            {"region": e["region"], "last": -1 - e["age"], "acc": e["acc"]} for e in (old[h] if old else [])
        ]
        for i in range(added):
            p = position - added + 1 + i
            region = known_regions[p] if p < len(known_regions) else (ASSISTANT if decoding else USER)
            entries.append({"region": region, "last": i, "acc": 0.0})
        for t, stands_for in (sampled or dict.fromkeys(range(n), 1)).items():
            step, seen = added - n + t, length - n + t + 1
            for j in range(seen):
                entries[j]["acc"] += stands_for * att[h][t][j]
                if att[h][t][j] > threshold / seen:
                    entries[j]["last"] = max(entries[j]["last"], step)
        for e in entries:
            e["age"] = added - 1 - e.pop("last")
        mean = sum(e["acc"] for e in entries) / length
        scores = []
        for e in entries:
            spec = regions[REGIONS[e["region"]]]
            if REGIONS[e["region"]] in pin:
                scores.append(math.inf)
            else:
                scores.append(
                    spec["priority"] * 2 ** (-e["age"] / spec["half_life"]) + beta * e["acc"] / mean
                )
        pages = {}
        for j, s in enumerate(scores):
            pages.setdefault(j // page, []).append(s)
        page_score = {p: sum(s) / len(s) for p, s in pages.items()}
        order = sorted(
            range(length),
            key=lambda j: (scores[j] != math.inf, -page_score[j // page], j // page, -scores[j], j),
        )
        keep = sorted(order[:n_kept])
        kept.append(keep)
        states.append([entries[j] for j in keep])
    return kept, states


def call_press(press, module, hidden, keys, position, decoding):
    forward = hidden[:, -1:] if decoding else hidden
    kwargs = {
        "hidden_states": forward,
        "position_ids": torch.arange(position - forward.shape[1] + 1, position + 1).unsqueeze(0),
        "cache_position": torch.arange(position - forward.shape[1] + 1, position + 1),
    }
    values = torch.randn_like(keys)
    new_keys, new_values = press.compress(module, hidden, keys, values, None, kwargs)
    return new_keys, new_values, values


def assert_matches(press, module, kept, states, keys, values, new_keys, new_values):
    index = torch.tensor(kept).unsqueeze(0).unsqueeze(-1)
    torch.testing.assert_close(new_keys, keys.gather(2, index.expand(-1, -1, -1, keys.shape[3])))
    torch.testing.assert_close(new_values, values.gather(2, index.expand(-1, -1, -1, values.shape[3])))
    state = press.layer_state[module.layer_idx]
    assert state.region[0].tolist() == [[e["region"] for e in head] for head in states]
    assert state.age[0].tolist() == [[float(e["age"]) for e in head] for head in states]
    expected = torch.tensor([[e["acc"] for e in head] for head in states], dtype=torch.float32)
    torch.testing.assert_close(state.attention[0], expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("pin", ["", "system", "system,tool"])
def test_press_matches_the_reference_over_two_successive_compressions(tmp_path, pin, tiny_llama):
    """Decay score, age reset by the threshold, pages and pinning, on a prefill then a decode-time call: the
    state (region, age, accumulated attention) follows the kept entries into the second call."""
    model = tiny_llama
    module = model.model.layers[1].self_attn
    press = make_press(tmp_path, model, compression_ratio=0.5, pin=pin, page_size=4, beta=1.0)
    known = [SYSTEM] * 6 + [USER] * 9 + [TOOL] * 12 + [SCRATCHPAD] * 7 + [ASSISTANT] * 6
    press.use_regions(torch.tensor(known))
    torch.manual_seed(1)
    hidden, keys = 30 * torch.randn(1, 40, 64), 3 * torch.randn(1, 2, 40, 16)  # peaked attention
    new_keys, new_values, values = call_press(press, module, hidden, keys, 39, decoding=False)
    kept, states = reference_call(module, hidden, keys, None, 20, known, False, 39, 1.0, pin, 4)
    assert_matches(press, module, kept, states, keys, values, new_keys, new_values)
    if pin:
        pinned = [i for i, r in enumerate(known) if REGIONS[r] in pin.split(",")]
        assert all(set(pinned) <= set(head) for head in kept)
    if pin != "system,tool":  # (system and tool pages overflow the budget: both heads keep the earliest)
        assert kept[0] != kept[1]  # heads keep different entries: the state is per head

    # Decode-time: 9 tokens generated since (positions 40..48), their hidden states buffered.
    keys = torch.cat([new_keys, 3 * torch.randn(1, 2, 9, 16)], dim=2)
    hidden = 30 * torch.randn(1, 9, 64)
    press.compression_ratio = 1 - 21 / 29
    new_keys, new_values, values = call_press(press, module, hidden, keys, 48, decoding=True)
    kept, states = reference_call(module, hidden, keys, states, 21, known, True, 48, 1.0, pin, 4)
    assert_matches(press, module, kept, states, keys, values, new_keys, new_values)
    assert new_keys.shape[2] == 21


def test_attention_in_small_query_chunks_matches_the_reference(tmp_path, tiny_llama, monkeypatch):
    """Chunked, the attention leaves out the entries no query of a chunk sees and masks only the chunk's own
    diagonal block: with chunks of 7 queries (the 40-token prefill in 6, the 9 decoded tokens in 2) the
    ages are the reference's and the accumulated attention equal to float tolerance."""
    monkeypatch.setattr(queries_module, "QUERY_CHUNK", 7)
    model = tiny_llama
    module = model.model.layers[0].self_attn
    press = make_press(tmp_path, model, compression_ratio=0.5, page_size=4, beta=1.0)
    known = [SYSTEM] * 6 + [USER] * 20 + [TOOL] * 14
    press.use_regions(torch.tensor(known))
    torch.manual_seed(2)
    hidden, keys = 30 * torch.randn(1, 40, 64), 3 * torch.randn(1, 2, 40, 16)
    new_keys, new_values, values = call_press(press, module, hidden, keys, 39, decoding=False)
    kept, states = reference_call(module, hidden, keys, None, 20, known, False, 39, 1.0, "", 4)
    assert_matches(press, module, kept, states, keys, values, new_keys, new_values)
    keys = torch.cat([new_keys, 3 * torch.randn(1, 2, 9, 16)], dim=2)
    hidden = 30 * torch.randn(1, 9, 64)
    press.compression_ratio = 1 - 21 / 29
    new_keys, new_values, values = call_press(press, module, hidden, keys, 48, decoding=True)
    kept, states = reference_call(module, hidden, keys, states, 21, known, True, 48, 1.0, "", 4)
    assert_matches(press, module, kept, states, keys, values, new_keys, new_values)


def test_a_sample_of_queries_scores_as_the_reference_does_with_that_sample(tmp_path, tiny_llama, monkeypatch):
    """scored_queries=8 on a 40-token prefill: the 4 last queries and one per stratum of the 36 earlier ones
    (the stratum's last, weighted by its size), in chunks of 3: ages and accumulated attention are the
    reference's over that sample, and the accumulated attention is not the exact one."""
    monkeypatch.setattr(queries_module, "QUERY_CHUNK", 3)
    module = tiny_llama.model.layers[0].self_attn
    press = make_press(tmp_path, tiny_llama, compression_ratio=0.5, page_size=4, beta=1.0, scored_queries=8)
    known = [SYSTEM] * 6 + [USER] * 20 + [TOOL] * 14
    press.use_regions(torch.tensor(known))
    torch.manual_seed(3)
    hidden, keys = 30 * torch.randn(1, 40, 64), 3 * torch.randn(1, 2, 40, 16)
    new_keys, new_values, values = call_press(press, module, hidden, keys, 39, decoding=False)
    index, stands_for = queries_module.query_sample(40, 8)
    sampled = dict(zip(index.tolist(), stands_for.tolist(), strict=True))
    assert len(sampled) == 8 and sum(sampled.values()) == 40
    kept, states = reference_call(module, hidden, keys, None, 20, known, False, 39, 1.0, "", 4, sampled)
    assert_matches(press, module, kept, states, keys, values, new_keys, new_values)
    every = [
        reference_call(module, hidden, keys, None, 40, known, False, 39, 1.0, "", 4, s)[1]
        for s in (sampled, None)
    ]
    assert [e["acc"] for e in every[0][0]] != pytest.approx([e["acc"] for e in every[1][0]], rel=1e-2)


def test_scored_queries_must_be_all_or_at_least_two(tmp_path, tiny_llama):
    for bad in (1, 0, -3, "some", 2.5, True):
        with pytest.raises(MemDecayError, match="scored_queries"):
            make_press(tmp_path, tiny_llama, compression_ratio=0.5, scored_queries=bad)


def test_new_entries_fed_whole_are_user_and_decoded_ones_assistant(tmp_path, tiny_llama):
    model = tiny_llama
    module = model.model.layers[0].self_attn
    press = make_press(tmp_path, model, compression_ratio=0.0)
    press.use_regions(torch.tensor([SYSTEM] * 10))
    keys = torch.randn(1, 2, 10, 16)
    call_press(press, module, torch.randn(1, 10, 64), keys, 9, decoding=False)
    keys = torch.cat([keys, torch.randn(1, 2, 5, 16)], dim=2)
    call_press(press, module, torch.randn(1, 5, 64), keys, 14, decoding=False)  # a question / a chunk
    keys = torch.cat([keys, torch.randn(1, 2, 3, 16)], dim=2)
    call_press(press, module, torch.randn(1, 3, 64), keys, 17, decoding=True)
    assert press.layer_state[0].region[0, 0].tolist() == [SYSTEM] * 10 + [USER] * 5 + [ASSISTANT] * 3
    assert press.layer_state[0].age[0, 0, -1] == 0  # the token just processed


def test_pages_keep_together_and_the_budget_is_exact():
    scores = torch.tensor([[[1.0, 1.0, 0.0, 0.0, 5.0, 0.0, 0.0, 0.0, 2.0, 2.0, 2.0]]])
    # page means (size 4): 0.5, 1.25, 2.0 (last page of 3): page 2 first, then page 1's best entry.
    assert select_pages(scores, 4, page_size=4).tolist() == [[[4, 8, 9, 10]]]
    assert select_pages(scores, 6, page_size=4).tolist() == [[[4, 5, 6, 8, 9, 10]]]  # ties: earlier entry
    # Pinned entries (+inf) go first, then the rest of their page even when it scores 0.
    scores[0, 0, 1] = float("inf")
    assert select_pages(scores, 5, page_size=4).tolist() == [[[0, 1, 2, 3, 8]]]
    scores[0, 0, 9] = float("inf")
    assert select_pages(scores, 3, page_size=4).tolist() == [[[0, 1, 9]]]  # both pinned, then page 0's best
    assert select_pages(scores, 1, page_size=4).tolist() == [[[1]]]  # pinned overflow: the earliest, exactly
    # Batch and heads rank independently.
    other = torch.tensor([0.0, 0.0, 0.0, 0.0, 3.0, 3.0, 3.0, 3.0, 1.0, 1.0, 1.0])
    two = torch.stack([scores[0, 0], other]).unsqueeze(0)
    assert select_pages(two, 3, page_size=4).tolist() == [[[0, 1, 9], [4, 5, 6]]]


def test_calibration_fit_recovers_known_half_lives_from_synthetic_traces():
    """Tokens of each region are attended (above the threshold) at age a with probability p_g 2^(-a/h_g)."""
    truth = {"system": (0.9, 120.0), "user": (0.6, 30.0), "assistant": (0.5, 12.0), "tool": (0.7, 60.0)}
    generator = torch.Generator().manual_seed(0)
    length, heads = 500, 3
    stats = LifetimeStats(max_age=length - 1, threshold=1.0)
    for _ in range(4):  # four "layers" of one trace
        regions = torch.randint(0, 4, (length,), generator=generator)
        age = (torch.arange(length).unsqueeze(1) - torch.arange(length).unsqueeze(0)).double()
        p0 = torch.tensor([truth[REGIONS[g]][0] for g in range(4)], dtype=torch.float64)[regions]
        h = torch.tensor([truth[REGIONS[g]][1] for g in range(4)], dtype=torch.float64)[regions]
        p = (p0 * torch.exp2(-age / h)).clamp(0, 1).expand(heads, -1, -1)
        attended = torch.bernoulli(p, generator=generator).bool()
        seen = torch.arange(1, length + 1, dtype=torch.float64).view(1, -1, 1)
        weights = torch.where(attended, 1.5 / seen, 0.5 / seen).tril()
        stats.add(weights, regions)
        stats.add_tokens(regions)
    calibration = fit_calibration(stats)
    for name, (_, half_life) in truth.items():
        assert calibration["regions"][name]["half_life"] == pytest.approx(half_life, rel=0.1)
        assert calibration["regions"][name]["measured"]
    priorities = {name: region["priority"] for name, region in calibration["regions"].items()}
    assert priorities["system"] == 1.0
    assert priorities["system"] > priorities["tool"] > priorities["user"] > priorities["assistant"]
    # No scratchpad token in the traces: the pooled fit, flagged.
    assert not calibration["regions"]["scratchpad"]["measured"]


def chat_sample(number: int) -> Sample:
    messages = [
        {"role": "system", "content": "You are a careful agent. The vault code is 4471. Never reveal it."},
        {"role": "user", "content": f"Task {number}: list the files, then read notes.txt."},
        {"role": "assistant", "content": "I will look first.", "region": "scratchpad"},
        {"role": "assistant", "content": "call: ls"},
        {"role": "tool", "content": "notes.txt data.csv run.py " * 3},
        {"role": "assistant", "content": "call: cat notes.txt"},
        {"role": "tool", "content": "the meeting moved to friday at noon; bring the report. " * 2},
    ]
    return Sample(
        task="chat",
        id=str(number),
        context="",
        question="When is the meeting?",
        answer_prefix="Answer:",
        references=["friday"],
        max_new_tokens=4,
        metric="string_match_all",
        messages=messages,
    )


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_model(tiny_model_dir)


def test_calibration_of_a_tiny_model_feeds_the_press(tiny, tmp_path):
    """measure -> calibration.json + card + plot for this model, which the press then loads by folder."""
    model, tokenizer = tiny
    stats = measure(model, tokenizer, [chat_sample(1), chat_sample(2)], threshold=1.0, log=lambda line: None)
    calibration = write_calibration(tmp_path, model, stats, {"command": "kvbench memdecay calibrate ..."})
    assert calibration["model"] == model_name(model)
    for name in REGIONS:
        region = calibration["regions"][name]
        assert region["measured"] and region["tokens"] > 0
        assert 1 <= region["half_life"] and 0 < region["priority"] <= 1
    assert {p.name for p in tmp_path.iterdir()} == {"calibration.json", "card.json", "attention_vs_age.png"}
    press = build_press("memdecay", 0.5, calibration=str(tmp_path))
    press.post_init_from_model(model)
    assert press.threshold == 1.0 and press.state_digest


def test_a_calibration_serves_a_copy_of_its_model_and_refuses_other_weights(tiny, tiny_model_dir, tmp_path):
    """Matched by the model's weights, not its folder's name: a copy of the folder is the model it was made
    for (also before the model loads: the name alone no longer refuses it); the same shape with other
    weights is another model, whatever its name."""
    model, tokenizer = tiny
    stats = measure(model, tokenizer, [chat_sample(1)], threshold=1.0, log=lambda line: None)
    write_calibration(tmp_path / "cal", model, stats, {"command": "kvbench memdecay calibrate ..."})
    copy = shutil.copytree(tiny_model_dir, tmp_path / "copy")
    twin, _ = load_model(str(copy))
    assert model_name(twin) != model_name(model)
    press = build_press("memdecay", 0.5, calibration=str(tmp_path / "cal"))
    press.check_for_model(model_name(twin))
    press.post_init_from_model(twin)
    assert press.threshold == 1.0
    changed, _ = load_model(str(copy))
    with torch.no_grad():
        next(changed.parameters()).add_(0.5)
    other = build_press("memdecay", 0.5, calibration=str(tmp_path / "cal"))
    with pytest.raises(MemDecayError, match=r"was made for .* \(weights [0-9a-f]+\), not for .* \(weights"):
        other.post_init_from_model(changed)


def prefill(model, input_ids, press) -> DynamicCache:
    cache = DynamicCache()
    with torch.no_grad(), press(model) if press else contextlib.nullcontext():
        model.model(input_ids=input_ids, past_key_values=cache)
    return cache


def test_press_compresses_a_real_prefill_within_budget_and_keeps_pinned_regions(tiny, tmp_path):
    model, _ = tiny
    calibration = write_test_calibration(tmp_path, model_name(model))
    press = build_press("memdecay", 0.3, calibration=calibration, pin="system")
    regions = torch.tensor([SYSTEM] * 11 + [USER] * 20 + [TOOL] * 25 + [ASSISTANT] * 14)
    press.use_regions(regions)
    input_ids = torch.randint(0, 1000, (1, 70), generator=torch.Generator().manual_seed(0))
    full = prefill(model, input_ids, None)
    cache = prefill(model, input_ids, press)
    for layer, full_layer in zip(cache.layers, full.layers, strict=True):
        assert layer.keys.shape[2] == int(70 * 0.7)
        for head in range(layer.keys.shape[1]):
            # Every system entry is still there, in order, at the start of the cache.
            torch.testing.assert_close(layer.keys[0, head, :11], full_layer.keys[0, head, :11])


def test_press_under_kvpress_decoding_press_holds_the_target_size(tiny, tmp_path):
    model, _ = tiny
    press = MemDecayPress(calibration=write_test_calibration(tmp_path, model_name(model)))
    decoding = DecodingPress(base_press=press, compression_interval=4, target_size=30)
    press.use_regions(torch.tensor([SYSTEM] * 10 + [USER] * 30))
    cache = DynamicCache()
    with torch.no_grad(), decoding(model):
        model(input_ids=torch.randint(0, 1000, (1, 40)), past_key_values=cache)
        for step in range(8):
            position = torch.tensor([[40 + step]])
            model(input_ids=torch.tensor([[step + 5]]), past_key_values=cache, position_ids=position)
    lengths = {layer.keys.shape[2] for layer in cache.layers}
    assert lengths == {30}
    for state in press.layer_state.values():
        assert state.region.shape[2] == 30
        assert (state.region[0, :, -4:] == ASSISTANT).all()  # the last decoded tokens


def test_bad_inputs_are_one_line_errors(tmp_path, tiny_llama):
    with pytest.raises(
        ValueError, match="unknown region 'memory' in pin; valid regions: system, user"
    ) as error:
        build_press("memdecay", 0.5, pin="system,memory")
    assert "\n" not in str(error.value)
    model = tiny_llama
    press = MemDecayPress(compression_ratio=0.5, calibration=str(tmp_path / "none"))
    with pytest.raises(MemDecayError, match="kvbench memdecay calibrate --model tiny-test") as error:
        press.post_init_from_model(model)
    assert "\n" not in str(error.value)
    press = MemDecayPress(compression_ratio=0.5, calibration=write_test_calibration(tmp_path, "smollm2-135m"))
    with pytest.raises(MemDecayError, match="made for smollm2-135m, not for tiny-test") as error:
        press.post_init_from_model(model)
    assert "\n" not in str(error.value)


def test_calibrate_command_refuses_samples_without_chat_turns(tiny_model_dir, tmp_path):
    from click.testing import CliRunner

    from kvbench.cli import main

    result = CliRunner().invoke(
        main,
        ["memdecay", "calibrate", "--model", tiny_model_dir, "--task", "niah_single_1", "--length", "512"]
        + ["--samples", "1", "--out", str(tmp_path / "out")],
    )
    assert result.exit_code == 2
    assert "has no chat turns" in result.output
    assert not (tmp_path / "out").exists()


def test_embedded_tokenizer_regions_cover_the_calibration_sample():
    """The calibration reads samples as the engine renders them: every turn's region shows up."""
    from kvbench.learned.memdecay.calibration import sample_tokens

    ids, regions = sample_tokens(load_tokenizer(), chat_sample(0))
    assert len(ids) == len(regions)
    assert set(regions.tolist()) == set(range(len(REGIONS)))
    question = tokenize_sample(load_tokenizer(), chat_sample(0)).question_ids.shape[1]
    prefix = len(load_tokenizer().encode(" Answer:", add_special_tokens=False))
    assert USER in regions[-question:].tolist()  # the question's last user turn
    assert regions[-prefix:].tolist() == [ASSISTANT] * prefix  # the answer prefix: the assistant's words


@pytest.mark.parametrize(
    "protocol", [("query-agnostic", ()), ("decode-time", (("interval", 2),)), ("streaming", (("chunk", 48),))]
)
def test_engine_runs_the_press_under_every_protocol_within_budget(tiny, tmp_path, protocol):
    """The engine gives the press the sample's regions and compresses with it under each protocol."""
    from kvbench.core.config import Config
    from kvbench.engine import evaluate_sample

    model, tokenizer = tiny
    calibration = write_test_calibration(tmp_path, model_name(model))
    config = Config("memdecay", 0.5, (("calibration", calibration), ("pin", "system")), None, None, *protocol)
    (result,) = evaluate_sample(model, tokenizer, chat_sample(3), [config])
    assert isinstance(result["prediction"], str)
    layers_heads = result["kv_total"] // result["context_tokens"]
    assert result["kv_kept"] == int(result["context_tokens"] * 0.5) * layers_heads


def test_decode_time_tells_the_question_apart_from_the_generation(tiny, tmp_path):
    """Under decode-time compression kvpress buffers the question with the decoded tokens; the press still
    sees the question as "user" and the answer prefix as "assistant", from the engine's region ids."""
    from kvbench.core.config import Config
    from kvbench.engine import evaluate_sample

    model, tokenizer = tiny
    calibration = write_test_calibration(tmp_path, model_name(model))
    config = Config(
        "memdecay", 0.5, (("calibration", calibration),), None, None, "decode-time", (("interval", 2),)
    )
    added = []
    original = MemDecayPress.new_regions

    def spy(self, positions, decoding):
        regions = original(self, positions, decoding)
        added.append((positions.tolist(), regions.tolist()))
        return regions

    prompt = tokenize_sample(tokenizer, chat_sample(3))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(MemDecayPress, "new_regions", spy)
        evaluate_sample(model, tokenizer, chat_sample(3), [config])
    context, question = prompt.context_ids.shape[1], prompt.question_ids.shape[1]
    seen = {
        position: region
        for positions, regions in added
        for position, region in zip(positions, regions, strict=True)
    }
    expected = prompt.all_regions().tolist()
    assert [seen[p] for p in range(context, context + question)] == expected[context:]
    assert expected[-1] == ASSISTANT and USER in expected[context:]
    assert {seen[p] for p in seen if p >= context + question} == {ASSISTANT}  # generated tokens
