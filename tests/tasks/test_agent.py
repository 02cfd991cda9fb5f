import json
import re

import pytest

from kvbench.tasks import METRICS, agent, family_of, load_samples, load_suite, ruler, score_sample
from kvbench.tasks.base import Sample
from kvbench.tasks.prompt import REGIONS, tokenize_sample, transcript

TASKS = list(agent.TASKS)


@pytest.fixture
def tokenizer(embedded_tokenizer):
    return embedded_tokenizer


def input_tokens(sample: Sample, tokenizer) -> int:
    """What the engine feeds (rendered turns, question turn, answer prefix) plus the generated tokens."""
    prompt = tokenize_sample(tokenizer, sample)
    return prompt.context_ids.shape[1] + prompt.question_ids.shape[1] + sample.max_new_tokens


def tool_rows(sample: Sample) -> int:
    return sum(len(m["content"].splitlines()) for m in sample.messages or [] if m["role"] == "tool")


# ---- generation ----


@pytest.mark.parametrize("task", TASKS)
def test_generation_is_deterministic_and_seeded(task, tokenizer):
    first = agent.make_samples(task, 1024, 2, 7, tokenizer, None)
    assert first == agent.make_samples(task, 1024, 2, 7, tokenizer, None)
    assert [s.id for s in first] == ["7-0", "7-1"]
    assert first[0].messages != first[1].messages
    assert first[0].messages != agent.make_samples(task, 1024, 1, 8, tokenizer, None)[0].messages
    assert all(s.task == task and s.meta["length"] == 1024 for s in first)
    assert first == load_samples(task, length=1024, samples=2, seed=7, tokenizer=tokenizer)


@pytest.mark.parametrize("task", TASKS)
def test_the_answer_is_in_the_context_once_in_the_intended_turn(task, tokenizer):
    for sample in agent.make_samples(task, 1024, 6, 0, tokenizer, None):
        (answer,) = sample.references
        holding = [i for i, m in enumerate(sample.messages) if answer.lower() in m["content"].lower()]
        assert holding == [sample.meta["answer_turn"]]
        turn = sample.messages[holding[0]]
        assert turn["content"].lower().count(answer.lower()) == 1
        assert answer.lower() not in (sample.question + sample.answer_prefix).lower()
        tool_turns = [i for i, m in enumerate(sample.messages) if m["role"] == "tool"]
        if task == "agent_system_fact":
            assert holding == [0] and turn["role"] == "system"
        elif task == "agent_early_tool_value":
            assert holding == tool_turns[:1]
        elif task == "agent_tool_value":
            assert turn["role"] == "tool" and holding[0] in tool_turns[1:]
        else:
            assert turn["role"] == "assistant" and turn["region"] == "scratchpad"
        if task != "agent_system_fact":  # the question's key points at the answer's line, and only there
            line = next(line for line in turn["content"].splitlines() if answer in line)
            (key,) = [
                w for w in re.findall(r"[\w-]+", sample.question) if re.search(r"[-_]", w) and w in line
            ]
            assert sum(m["content"].count(key) for m in sample.messages or []) == 1


@pytest.mark.parametrize("task", TASKS)
def test_the_engine_gives_the_answer_tokens_the_intended_region(task, tokenizer):
    sample = agent.make_samples(task, 1024, 1, 0, tokenizer, None)[0]
    prompt = tokenize_sample(tokenizer, sample)
    ids = prompt.context_ids[0].tolist()
    answer = tokenizer.encode(sample.references[0], add_special_tokens=False)[1:]  # the first may merge
    start = next(i for i in range(len(ids)) if ids[i : i + len(answer)] == answer)
    expected = {"agent_system_fact": "system", "agent_scratchpad": "scratchpad"}.get(task, "tool")
    assert {REGIONS[r] for r in prompt.regions[start : start + len(answer)].tolist()} == {expected}


@pytest.mark.parametrize("task", TASKS)
def test_input_fills_the_requested_length_and_grows_with_it(task, tokenizer):
    rows = {}
    for length in (1024, 2048):
        samples = agent.make_samples(task, length, 3, 0, tokenizer, None)
        for sample in samples:
            # One more row (~25 tokens) would not fit; a row that opens a round brings its call and notes.
            assert length - 160 <= input_tokens(sample, tokenizer) <= length
        rows[length] = min(tool_rows(s) for s in samples)
    assert rows[2048] > 1.5 * rows[1024]


def test_4k_traces_fit(tokenizer):
    for sample in agent.make_samples("agent_early_tool_value", 4096, 2, 0, tokenizer, None):
        assert 4096 - 160 <= input_tokens(sample, tokenizer) <= 4096


@pytest.mark.parametrize("task", TASKS)
def test_turns_are_a_well_formed_agent_trace(task, tokenizer):
    scratchpads = 0
    for sample in agent.make_samples(task, 2048, 3, 0, tokenizer, None):
        messages = sample.messages or []
        assert [m["role"] for m in messages[:2]] == ["system", "user"]
        assert all(m["role"] in ("system", "user", "assistant", "tool") and m["content"] for m in messages)
        assert all(set(m) <= {"role", "content", "region"} for m in messages)
        for i, m in enumerate(messages[2:], start=2):
            if "region" in m:
                assert m["role"] == "assistant" and m["region"] == "scratchpad"
                scratchpads += 1
            elif m["role"] == "assistant":  # a tool call, answered by the next turn
                call = json.loads(m["content"])
                assert call["tool"] in agent.TOOLS and messages[i + 1]["role"] == "tool"
            else:
                assert m["role"] == "tool" and "tool" in json.loads(messages[i - 1]["content"])
        assert messages[-1]["role"] == "tool"
        assert sample.context == transcript(messages)
    assert scratchpads > 0


def test_lengths_below_the_minimum_and_unknown_tasks_are_rejected(tokenizer):
    with pytest.raises(ValueError, match="at least 1024"):
        agent.make_samples("agent_tool_value", 512, 1, 0, tokenizer, None)
    with pytest.raises(ValueError, match="unknown agent task"):
        agent.make_samples("agent", 1024, 1, 0, tokenizer, None)


# ---- metric: RULER's ----


def test_metric_is_rulers_string_match(tokenizer):
    sample = agent.make_samples("agent_tool_value", 1024, 1, 0, tokenizer, None)[0]
    (answer,) = sample.references
    assert METRICS[sample.metric] is ruler.string_match_all
    cases = {
        f" {answer}.": 100,
        f"{sample.answer_prefix} {answer.lower()}": 100,
        "I could not find it.": 0,
        answer[:-1]: 0,  # a partial value is wrong
    }
    for prediction, score in cases.items():
        assert score_sample(sample, prediction) == score == ruler.string_match_all(prediction, sample)


# ---- registry and suite ----


def test_the_suite_holds_every_agent_task_at_a_valid_length():
    suite = load_suite("agent-trace")
    assert suite.tasks == TASKS and suite.samples > 0 and suite.description
    assert all(suite.length >= agent.min_length(task) for task in suite.tasks)
    assert all(family_of(task) is agent for task in suite.tasks)
