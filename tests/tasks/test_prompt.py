"""The prompt format's count of input tokens (`input_token_count`, what sample sizing uses) against the
prompt the engine feeds (`tokenize_sample`)."""

import copy

import pytest

from kvbench.bridge.models import TokenizerFiles
from kvbench.tasks import load_samples
from kvbench.tasks.base import Sample
from kvbench.tasks.prompt import input_token_count, tokenize_sample


def fed_tokens(tokenizer, sample: Sample) -> int:
    prompt = tokenize_sample(tokenizer, sample)
    return prompt.context_ids.shape[1] + prompt.question_ids.shape[1]


def samples_of_every_shape(tokenizer) -> list[Sample]:
    """A chat sample, one of chat turns, a raw prompt and one with parts, as the task families make them."""
    needle, agent = (
        load_samples(task, length=length, samples=1, seed=0, tokenizer=tokenizer)[0]
        for task, length in (("niah_single_1", 512), ("agent_system_fact", 1024))
    )
    raw = Sample(
        "raw", "0", "Passage: the code word is kiwi.\n", "Code word?", "Answer:", ["kiwi"], 8, "exact_match"
    )
    raw.chat_template = False
    with_parts = copy.copy(needle)
    with_parts.parts = [needle, agent]
    return [needle, agent, raw, with_parts]


@pytest.mark.parametrize("reader", ["transformers", "files"])
def test_the_count_is_the_length_of_the_prompt_the_engine_feeds(embedded_tokenizer, reader):
    tokenizer = embedded_tokenizer if reader == "transformers" else TokenizerFiles.open("smollm2-135m")
    for sample in samples_of_every_shape(tokenizer):
        assert input_token_count(tokenizer, sample) == fed_tokens(tokenizer, sample) > 10


def test_the_count_follows_a_base_models_fallback_and_the_context_limit(embedded_tokenizer):
    base = copy.deepcopy(embedded_tokenizer)
    base.chat_template = None
    for sample in samples_of_every_shape(base):
        assert input_token_count(base, sample) == fed_tokens(base, sample)
    short = copy.deepcopy(embedded_tokenizer)
    short.model_max_length = 64  # every context is cut to 64 tokens, as the engine cuts it
    sample = samples_of_every_shape(embedded_tokenizer)[0]
    question = tokenize_sample(short, sample).question_ids.shape[1]
    assert input_token_count(short, sample) == fed_tokens(short, sample) == 64 + question
