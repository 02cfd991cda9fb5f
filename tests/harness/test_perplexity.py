"""Live-cache perplexity (kvbench.harness.perplexity): the NLLs it records equal independent computations on
a tiny
random-init Llama in float64, batched configs equal each config alone, and a rerun computes nothing."""

import json
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner
from transformers import DynamicCache

from kvbench.bridge import adapter
from kvbench.cli import main
from kvbench.core.config import Config
from kvbench.harness import perplexity
from kvbench.harness.perplexity import Text, evaluate_text, texts_from_files
from kvbench.presses import build_press
from kvbench.reporting import render_report
from kvbench.store.results import ResultsStore, Row, load_rows

pytestmark = pytest.mark.usefixtures("one_thread")

LENGTH = 61  # not a multiple of the chunk sizes below: the last chunk is short
SPAN = 16
SINKS = 4  # StreamingLLMPress's n_sink


@pytest.fixture(scope="module")
def model(tiny_model):
    """Peaked attention (a larger init), so that which entries a cache keeps changes the NLL."""
    return tiny_model("llama", initializer_range=0.1, attn_implementation="sdpa").double()


@pytest.fixture(scope="module")
def text(model):
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(3, model.config.vocab_size, (LENGTH,), generator=generator)
    return Text("random", "0", tuple(ids.tolist()))


def config(press: str, every: int, **budget) -> Config:
    return Config(
        press, budget.pop("ratio", 0.0), protocol="perplexity", protocol_args=(("every", every),), **budget
    )


def span_means(nll: torch.Tensor) -> list[float]:
    return [float(nll[start : start + SPAN].mean()) for start in range(0, len(nll), SPAN)]


def full_context_nll(model, text: Text) -> torch.Tensor:
    """One forward over the whole text: the NLL of each token after the first."""
    ids = torch.tensor([text.ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, :-1]
    return F.cross_entropy(logits, ids[0, 1:], reduction="none")


def sliding_window_nll(model, text: Text, budget: int, every: int) -> torch.Tensor:
    """StreamingLLM's eval_long_ppl, written out: feed `every` tokens, take the NLL of the next ones, then
    keep the first SINKS entries and the most recent ones of every layer, `budget` in all."""
    ids, cache, losses = torch.tensor([text.ids]), DynamicCache(), []
    with torch.no_grad():
        for start in range(0, LENGTH, every):
            chunk = ids[:, start : start + every]
            positions = torch.arange(start, start + chunk.shape[1]).unsqueeze(0)
            logits = model(input_ids=chunk, past_key_values=cache, position_ids=positions).logits[0]
            targets = ids[0, start + 1 : start + chunk.shape[1] + 1]
            losses.append(F.cross_entropy(logits[: len(targets)], targets, reduction="none"))
            for layer in cache.layers:
                if layer.keys.shape[2] > budget:
                    recent = budget - SINKS
                    layer.keys = torch.cat([layer.keys[:, :, :SINKS], layer.keys[:, :, -recent:]], dim=2)
                    layer.values = torch.cat(
                        [layer.values[:, :, :SINKS], layer.values[:, :, -recent:]], dim=2
                    )
    return torch.cat(losses)


def test_a_decoding_press_keeps_the_entries_it_keeps_in_cache_order():
    """kvpress's top-k gathers by score; compressed twice, StreamingLLM then dropped sinks and kept old
    entries. Keys here hold their own position."""
    press = adapter.decoding_press(build_press("streaming_llm", 0.0), 1, 8, buffer_size=1)
    module = SimpleNamespace(head_dim=1, layer_idx=0)
    keys = torch.arange(12.0).view(1, 1, 12, 1)
    kept, _ = press.compress(module, torch.zeros(1, 1, 4), keys, keys, None, {})
    assert kept.flatten().tolist() == [0, 1, 2, 3, 8, 9, 10, 11]
    keys = torch.cat([kept, torch.tensor([12.0, 13.0]).view(1, 1, 2, 1)], dim=2)
    kept, _ = press.compress(module, torch.zeros(1, 1, 4), keys, keys, None, {})
    assert kept.flatten().tolist() == [0, 1, 2, 3, 10, 11, 12, 13]


@pytest.mark.parametrize("every", [1, 7])
def test_without_a_press_the_nll_is_the_full_context_nll(model, text, every):
    (result,) = evaluate_text(model, text, [config("none", every)], every, SPAN)
    reference = full_context_nll(model, text)
    assert result["nll"] == pytest.approx(float(reference.mean()), rel=1e-12)
    assert result["meta"] == {"span": SPAN, "span_nll": pytest.approx(span_means(reference), rel=1e-12)}
    assert result["kv_kept"] == result["kv_total"] == LENGTH * 2 * 2  # tokens x layers x KV heads


@pytest.mark.parametrize("every", [1, 8])
def test_streaming_llm_at_a_budget_is_a_sliding_window_with_sinks(model, text, every):
    budget = 12
    (result,) = evaluate_text(model, text, [config("streaming_llm", every, budget=budget)], every, SPAN)
    reference = sliding_window_nll(model, text, budget, every)
    assert result["nll"] == pytest.approx(float(reference.mean()), rel=1e-12)
    assert result["meta"]["span_nll"] == pytest.approx(span_means(reference), rel=1e-12)
    assert result["kv_kept"] == budget * 2 * 2
    # The window matters: the full cache reads the text otherwise.
    assert abs(result["nll"] - float(full_context_nll(model, text).mean())) > 1e-3


def test_a_batch_of_configs_measures_what_each_config_measures_alone(model, text):
    every = 5
    configs = [
        config("knorm", every, budget=12),
        config("streaming_llm", every, budget=20),
        config("tova", every, ratio=0.5),
        config("h2o", every, budget=12),  # scores with attention weights
        config("none", every),
        config("knorm", every, ratio=0.75),
        config("qevict", every, memory=0.3),  # a codec
    ]
    together = evaluate_text(model, text, configs, every, SPAN)
    for one, measured in zip(configs, together, strict=True):
        (alone,) = evaluate_text(model, text, [one], every, SPAN)
        assert measured["nll"] == pytest.approx(alone["nll"], rel=1e-12), one
        assert measured["meta"]["span_nll"] == pytest.approx(alone["meta"]["span_nll"], rel=1e-12), one
        assert (measured["kv_kept"], measured["kv_bytes"]) == (alone["kv_kept"], alone["kv_bytes"]), one
    kept = [measured["kv_kept"] // 4 for measured in together]  # entries per head and layer, at the end
    assert kept[:6] == [12, 20, LENGTH // 2, 12, LENGTH, int(LENGTH * 0.25)]  # a ratio of the text read
    assert together[6]["kv_bytes"] <= 0.3 * together[6]["kv_bytes_full"]
    assert len({round(measured["nll"], 6) for measured in together}) == len(configs)  # presses differ


def test_local_texts_are_cut_to_the_length_and_short_ones_skipped(tmp_path, embedded_tokenizer):
    long = "The river ran past the mill and on to the sea. " * 40
    (tmp_path / "a.txt").write_text(long)
    (tmp_path / "b.jsonl").write_text(
        json.dumps({"text": "too short"}) + "\n\n" + json.dumps({"text": long.upper()}) + "\n"
    )
    (tmp_path / "notes.md").write_text(long)  # neither .txt nor .jsonl: not read
    with pytest.warns(UserWarning, match="skipped 1 texts shorter than 100 tokens"):
        texts = texts_from_files(embedded_tokenizer, tmp_path, 5, 100)
    assert [(text.source, text.id, len(text.ids)) for text in texts] == [
        (tmp_path.name, "a.txt", 100),
        (tmp_path.name, "b.jsonl:3", 100),
    ]
    assert list(texts[0].ids) == embedded_tokenizer(long).input_ids[:100]


def test_agent_texts_carry_their_regions(embedded_tokenizer):
    (trace,) = perplexity.generated_texts(embedded_tokenizer, "agent", 1, 300, seed=0)
    assert len(trace.ids) == len(trace.regions) == 300
    assert len(set(trace.regions)) > 1  # system prompt, user turn, tool outputs...
    prose = perplexity.generated_texts(embedded_tokenizer, "prose", 2, 300, seed=0)
    assert [len(text.ids) for text in prose] == [300, 300] and prose[0].ids != prose[1].ids


def test_a_rerun_computes_nothing_and_the_report_reads_perplexity_beside_accuracy(
    tmp_path, tiny_llama_dir, monkeypatch
):
    out = tmp_path / "out"
    args = ["perplexity", "--presses", "knorm,streaming_llm", "--budget", "16,32", "--model", tiny_llama_dir]
    args += ["--length", "96", "--texts", "2", "--every", "16", "--span", "32", "--out", str(out)]
    first = CliRunner().invoke(main, args)
    assert first.exit_code == 0, first.output
    rows = load_rows(out)
    assert len(rows) == 2 * 5  # texts x (none + 2 presses x 2 budgets)
    assert set(rows["protocol"]) == {"perplexity"} and rows["score"].isna().all()
    assert rows["nll"].gt(0).all() and rows["budget"].dropna().tolist().count(16) == 4
    assert rows["meta"].map(lambda meta: len(meta["span_nll"])).eq(3).all()  # 95 predictions, spans of 32
    assert rows["config_id"].nunique() == 5

    def no_reading(*args, **kwargs):
        raise AssertionError("a rerun must find every row in the results folder")

    monkeypatch.setattr(perplexity, "evaluate_text", no_reading)
    second = CliRunner().invoke(main, args)
    assert second.exit_code == 0, second.output
    assert (out / "rows.jsonl").read_text().count("\n") == 10
    presses = ("none", "knorm", "streaming_llm")
    printed = [line.split()[:2] for line in second.output.splitlines() if line.startswith(presses)]
    assert sorted(printed) == sorted(
        [["none", "0"]] + [[press, f"budget={b}"] for press in ("knorm", "streaming_llm") for b in (16, 32)]
    )

    with ResultsStore(out) as store:  # an accuracy row beside them
        store.append(Row("c", "m", "knorm", 0.5, "niah", 96, 0, "s0", content_hash="h", score=50.0))
    report = render_report(out, tmp_path / "report")
    text = (report / "README.md").read_text()
    assert "Perplexity" in text and "query-agnostic" in text
    full = math.exp(rows.loc[rows["press"] == "none", "nll"].mean())
    assert f"{full:.2f}" in text
