"""The protocols beyond one question on a compressed context, each against an independent reference:
query-aware and compress-once-answer-many against kvpress's pipeline, multi-turn against a plain loop,
absolute budgets against the entries kept."""

import contextlib
import json
import random
from dataclasses import replace

import pytest
import torch
from kvpress import DecodingPress
from kvpress.utils import compute_n_kept

import kvbench
from kvbench.bridge import adapter
from kvbench.bridge.models import EMBEDDED, converted, load_tokenizer
from kvbench.core.config import Config
from kvbench.engine import evaluate_sample, sized_config
from kvbench.engine.steps import budget_entries
from kvbench.presses import config_press
from kvbench.tasks import combine_samples, load_combined_samples
from kvbench.tasks.prompt import tokenize_sample
from tests.engine.test_engine import decoded_token_ids, pipeline_token_ids, word_soup_sample

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


@pytest.fixture(scope="module")
def model(tiny_model, tokenizer):
    """Peaked attention (which entries are kept changes the answers), float64 (rows of a batch and a
    single row round alike: what is kept is under test, not rounding)."""
    model = tiny_model("llama", len(tokenizer), initializer_range=0.1, attn_implementation="sdpa")
    model.config.name_or_path = str(converted(EMBEDDED))
    return model.double()


def engine_ids(monkeypatch, model, tokenizer, sample, configs) -> tuple[list[list[int]], list[dict]]:
    calls = decoded_token_ids(monkeypatch, tokenizer)
    results = evaluate_sample(model, tokenizer, sample, configs)
    monkeypatch.undo()
    return calls, results


def test_query_aware_answers_as_the_pipeline_given_the_question_in_the_context(monkeypatch, tokenizer, model):
    sample = word_soup_sample(120)
    presses = [("none", 0.0), ("knorm", 0.5), ("snapkv", 0.5), ("tova", 0.75), ("h2o", 0.5), ("adakv", 0.5)]
    configs = [Config(press, ratio, protocol="query-aware") for press, ratio in presses]
    ids, _ = engine_ids(monkeypatch, model, tokenizer, sample, configs + [Config("snapkv", 0.5)])
    # kvpress's evaluation under --query_aware: the question appended to the context, none asked after.
    aware = word_soup_sample(120, context=sample.context + sample.question, question="")
    for config, answer in zip(configs, ids, strict=False):
        assert answer == pipeline_token_ids(monkeypatch, model, tokenizer, aware, config), config
    # The question steers snapkv's window: the query-agnostic row of the same press answers otherwise.
    snapkv_aware, snapkv_agnostic = ids[2], ids[-1]
    assert snapkv_aware != snapkv_agnostic


def parts(count: int, **changes) -> list:
    """Samples whose material differs, each with its own question and reference."""
    colours = ["red", "green", "blue", "amber", "violet"]
    return [
        word_soup_sample(
            40 + 10 * k,
            task=f"soup{k}",
            id=str(k),
            context=f"The {colours[k]} box holds {k + 3} stones. "
            + " ".join(
                random.Random(k).choice("cat dog hill stone river".split()) for _ in range(30 + 9 * k)
            ),
            question=f"How many stones does the {colours[k]} box hold?",
            answer_prefix=f"The {colours[k]} box holds",  # each part its own, as the RULER parts have
            references=[str(k + 3)],
            **changes,
        )
        for k in range(count)
    ]


def test_compress_once_answer_many_answers_as_the_pipeline_asked_each_question(monkeypatch, tokenizer, model):
    sample = combine_samples(parts(3), "3q-0")
    presses = [("none", 0.0), ("knorm", 0.5), ("snapkv", 0.5), ("streaming_llm", 0.25), ("tova", 0.75)]
    configs = [
        Config(press, ratio, protocol="multi-question", protocol_args=(("questions", 3),))
        for press, ratio in presses
    ]
    ids, results = engine_ids(monkeypatch, model, tokenizer, sample, configs)
    assert len(results) == len(configs) * 3
    # The pipeline takes one answer prefix for a list of questions; the parts each have their own, so each
    # is asked alone of the whole context (the same compressed context: the presses are deterministic).
    asked = [replace(part, context=sample.context) for part in sample.questions()]
    for index, config in enumerate(configs):
        reference = [pipeline_token_ids(monkeypatch, model, tokenizer, part, config) for part in asked]
        assert ids[3 * index : 3 * index + 3] == reference, config
    # Every question is answered from the same compressed context.
    assert len({result["kv_kept"] for result in results[3:6]}) == 1


def plain_multi_turn_loop(model, tokenizer, sample, config: Config) -> list[list[int]]:
    """The multi-turn protocol written as one conversation's loop on kvpress's own objects: the context
    prefilled under the press; each turn's question fed and its answer decoded greedily on the cache; then
    the cache cropped back to before the question, and the question, the answer (without its stop token)
    and the end of turn fed again under a DecodingPress that compresses it all back to the config's budget
    of every token seen."""
    prompt = tokenize_sample(tokenizer, sample)
    press = config_press(config)
    stop = tokenizer.convert_tokens_to_ids("<|im_end|>")
    cache = adapter.DynamicCache()
    with press(model) if press is not None else contextlib.nullcontext():
        model.model(input_ids=prompt.context_ids, past_key_values=cache)
    seen, answers = prompt.context_ids.shape[1], []
    for turn, (question_ids, part) in enumerate(zip(prompt.part_question_ids, sample.parts, strict=True)):
        held, position, fed, tokens = cache.get_seq_length(), seen, question_ids, []
        for step in range(part.max_new_tokens):
            positions = torch.arange(position, position + fed.shape[1]).unsqueeze(0)
            logits = model(input_ids=fed, past_key_values=cache, position_ids=positions).logits[:, -1]
            position += fed.shape[1]
            tokens.append(int(logits.argmax(-1)))
            if step > 0 and tokens[-1] == stop:  # the pipeline never checks the first token
                break
            fed = torch.tensor([[tokens[-1]]])
        answers.append(tokens)
        if turn == len(sample.parts) - 1:
            break
        cache.crop(held)
        answer = tokens[:-1] if tokens[-1] == stop else tokens
        fed = torch.cat([question_ids, torch.tensor([answer]), prompt.turn_close_ids], 1)
        positions = torch.arange(seen, seen + fed.shape[1]).unsqueeze(0)
        compressing = contextlib.nullcontext()
        if press is not None:
            press.compression_ratio = 0.0  # the DecodingPress sets it
            adapter.keep_cache_order(press)  # as the engine's decoding presses do (kvpress issue #173)
            target = budget_entries(config, seen + fed.shape[1])
            compressing = DecodingPress(base_press=press, compression_interval=1, target_size=target)(model)
        with compressing:
            model(input_ids=fed, past_key_values=cache, position_ids=positions)
        seen += fed.shape[1]
    return answers


def test_multi_turn_answers_as_a_plain_loop_that_keeps_the_cache_across_turns(monkeypatch, tokenizer, model):
    sample = combine_samples(parts(3, max_new_tokens=12), "3q-0")
    presses = [("none", 0.0, ()), ("knorm", 0.5, ()), ("snapkv", 0.5, (("window_size", 4),))]
    presses += [("streaming_llm", 0.25, ()), ("knorm", 0.75, ())]
    configs = [Config(p, r, a, protocol="multi-turn", protocol_args=(("turns", 3),)) for p, r, a in presses]
    ids, results = engine_ids(monkeypatch, model, tokenizer, sample, configs)
    for index, config in enumerate(configs):
        assert ids[3 * index : 3 * index + 3] == plain_multi_turn_loop(model, tokenizer, sample, config), (
            config
        )
    # Turns see more and more tokens; a compressed cache holds its budget of them, the full one all.
    none, knorm = results[:3], results[3:6]
    assert none[0]["context_tokens"] < none[1]["context_tokens"] < none[2]["context_tokens"]
    assert [r["kv_kept"] for r in none] == [r["kv_total"] for r in none]
    for result in knorm:
        layers, heads = model.config.num_hidden_layers, model.config.num_key_value_heads
        assert result["kv_kept"] == compute_n_kept(result["context_tokens"], 0.5) * layers * heads


@pytest.mark.parametrize("length", [7, 100, 129, 1000, 1023, 4097])
def test_a_budget_sizes_the_ratio_to_keep_exactly_its_entries(length):
    for budget in sorted({1, 3, 64, 100, 128, length - 1, length, length + 5}):
        config = sized_config(Config("knorm", 0.0, budget=budget), length)
        assert compute_n_kept(length, config.ratio) == min(budget, length), (length, budget)


def test_a_budget_keeps_its_entries_per_head_whatever_the_context_length(tokenizer, model):
    layers, heads = model.config.num_hidden_layers, model.config.num_key_value_heads
    for words in (60, 150):
        sample = word_soup_sample(words)
        length = tokenize_sample(tokenizer, sample).context_ids.shape[1]
        configs = [Config(press, 0.0, budget=40) for press in ("knorm", "snapkv", "tova")]
        configs.append(Config("knorm", 0.0, budget=40, protocol="streaming", protocol_args=(("chunk", 32),)))
        for result in evaluate_sample(model, tokenizer, sample, configs):
            assert result["kv_kept"] == 40 * layers * heads
            assert result["kv_total"] == length * layers * heads
            assert result["kv_bytes"] * length == result["kv_bytes_full"] * 40


def longbench_rows(path) -> None:
    """Two documents of qasper, the first asked three questions, the second one."""
    rows = [
        {"input": question, "context": context, "answers": [answer], "length": 50, "dataset": "qasper"}
        | {"language": "en", "all_classes": None, "_id": f"id{index}"}
        for index, (context, question, answer) in enumerate(
            [
                ("The red box holds 3 stones. The blue box holds 5.", "Red box?", "3"),
                ("A river runs north of the hill.", "Which way?", "north"),
                ("The red box holds 3 stones. The blue box holds 5.", "Blue box?", "5"),
                ("The red box holds 3 stones. The blue box holds 5.", "All boxes?", "8"),
            ]
        )
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")


def test_longbench_questions_are_grouped_by_context_one_row_each(tiny_llama_dir, tmp_path):
    longbench_rows(tmp_path / "qasper.jsonl")
    setup = dict(
        tasks=["longbench/qasper"], length=400, data_dir=tmp_path, model=str(tiny_llama_dir), progress=False
    )
    frame = kvbench.run("knorm", 0.5, protocol="multi-question", questions=2, out=tmp_path / "out", **setup)
    assert list(frame["sample_id"]) == ["2q-id0/0", "2q-id0/1", "2q-id1/0"]  # up to 2 questions a context
    assert [refs[0] for refs in frame["references"]] == ["3", "5", "north"]
    assert [meta["question"] for meta in frame["meta"]] == [0, 1, 0]
    # The questions of one context share its compressed cache.
    assert frame["kv_kept"].iloc[0] == frame["kv_kept"].iloc[1] != frame["kv_kept"].iloc[2]
    again = kvbench.run("knorm", 0.5, protocol="multi-question", questions=2, out=tmp_path / "out", **setup)
    assert list(again["prediction"]) == list(frame["prediction"])  # resumed: nothing recomputed, same rows


def test_contexts_rotate_the_tasks_and_each_turn_is_a_row_of_its_own_sample(
    tiny_llama_dir, tokenizer, tmp_path
):
    setup = dict(
        tasks=["niah_single_1", "niah_single_3"],
        length=1600,
        samples=2,
        model=str(tiny_llama_dir),
        progress=False,
    )
    frame = kvbench.run("knorm", 0.5, protocol="multi-turn", turns=3, out=tmp_path / "out", **setup)
    contexts = load_combined_samples(
        ["niah_single_1", "niah_single_3"], length=1600, samples=2, questions=3, seed=0, tokenizer=tokenizer
    )
    parts = [part for context in contexts for part in context.questions()]
    assert [part.task for part in parts] == ["niah_single_1", "niah_single_3"] * 3
    assert list(frame["task"]) == [part.task for part in parts]
    assert list(frame["references"]) == [part.references for part in parts]
    assert list(frame["sample_id"]) == ["3q-0/0", "3q-0/1", "3q-0/2", "3q-1/0", "3q-1/1", "3q-1/2"]
    assert [meta["turn"] for meta in frame["meta"]] == [0, 1, 2, 0, 1, 2]
    for name, turns in frame.groupby(frame["sample_id"].str[:4]):
        # Each turn is asked of a cache that has seen more; knorm holds half of it.
        assert turns["context_tokens"].is_monotonic_increasing and turns["context_tokens"].nunique() == 3, (
            name
        )
        assert (turns["kv_kept"] < turns["kv_total"]).all()


@pytest.mark.parametrize(
    ("chunk", "advice"),
    [(1, "feeds 1 token: give a larger --chunk"), (8, "give --press-arg window_size=N with N below 8, or a")],
)
def test_a_window_longer_than_a_step_gets_advice_that_can_be_followed(tmp_path, chunk, advice):
    """No `window_size` below 1 exists: a 1-token step leaves only a larger step to give."""
    from click.testing import CliRunner

    from kvbench.cli import main

    args = ["run", "--press", "snapkv", "--ratio", "0.5", "--protocol", "streaming", "--chunk", str(chunk)]
    result = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and advice in result.output, result.output
    assert "below 1" not in result.output and not (tmp_path / "o").exists()
