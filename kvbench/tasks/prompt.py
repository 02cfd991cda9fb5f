"""The prompt format: how a sample becomes the token ids that are prefilled (the context) and fed on top of
the compressed cache (question + answer prefix), split as kvpress's pipeline `preprocess` splits it, with
each context token's region (system, user, assistant, tool, scratchpad) for region-aware presses.

It lives in the tasks layer because task generators size their samples with it (a sample must fit its
length once rendered) and the engine, datagen and MemDecay's calibration all feed prompts made here.

torch is imported by the functions that make tensors, so that the task registry (names, suites, what
`kvbench run` checks first) loads without it.
"""

from __future__ import annotations

import bisect
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvbench.tasks.base import Sample

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)


@dataclass
class Prompt:
    context_ids: torch.Tensor  # (1, n): prefilled and compressed
    question_ids: torch.Tensor  # (1, q): question + answer prefix, fed on top of the compressed cache
    regions: torch.Tensor | None = None  # (n,): index in REGIONS of each context token
    # (q,): the question's region ids: "user" up to the assistant header, "assistant" for the answer prefix
    question_regions: torch.Tensor | None = None
    # A sample with parts (`Sample.parts`): each part's question + answer prefix, fed on top of the context
    # (the first is `question_ids`), and the tokens that close an assistant turn and open the next user
    # turn (the multi-turn protocol: what a chat template puts between an answer and the next question).
    part_question_ids: list[torch.Tensor] | None = None
    turn_close_ids: torch.Tensor | None = None

    def all_regions(self) -> torch.Tensor | None:
        """Region ids of context + question, positions 0..n+q-1: what a region-aware press is told."""
        import torch

        if self.regions is None or self.question_regions is None:
            return self.regions
        return torch.cat([self.regions, self.question_regions])


# Region of each context token, from the chat template's spans (region-aware presses such as MemDecay).
REGIONS = ("system", "user", "assistant", "tool", "scratchpad")


@dataclass
class PromptTexts:
    """The texts a sample is tokenized from (`prompt_texts`)."""

    context: str  # prefilled: the rendered turns up to the end of the context
    special_tokens: bool  # whether the context is tokenized with the tokenizer's own special tokens
    question: str  # question (unless query-aware), the template's end of turn, the answer prefix
    messages: list[dict]  # the turns the context renders
    question_suffix: str  # what the template puts between the question and the answer prefix
    turn_close: str | None  # the template's close of an assistant turn (samples with parts)


def prompt_texts(tokenizer, sample: Sample, *, query_aware: bool = False) -> PromptTexts:
    """Split the prompt's text as the kvpress pipeline's `preprocess` does (`tokenize_sample` says how)."""
    messages = sample.messages or [{"role": "user", "content": sample.context}]
    asked = sample.question if query_aware else ""
    special_tokens = False
    turn_close = None
    if not sample.chat_template:
        context, special_tokens, question_suffix = sample.context + asked, True, ""
    elif tokenizer.chat_template is not None:
        # The text after the context (end of turn, assistant header) goes with the question.
        separator = "#" * (max(len(message["content"]) for message in messages) + 10)
        turns = [{"role": message["role"], "content": message["content"]} for message in messages]
        if sample.messages:
            turns.append({"role": "user", "content": asked + separator})
        else:
            turns[-1]["content"] += asked + separator
        context, question_suffix = render(tokenizer, turns, add_generation_prompt=True).split(separator)
        if sample.parts:
            between = [{"role": "user", "content": "A"}, {"role": "assistant", "content": separator}]
            between.append({"role": "user", "content": separator + "B"})
            turn_close = render(tokenizer, between, add_generation_prompt=False).split(separator)[1]
    else:  # a base model: the pipeline's fallback
        joined = "\n\n".join(message["content"] for message in messages)
        context, question_suffix = (tokenizer.bos_token or "") + joined + asked, "\n"
        turn_close = "\n\n"
    question = (sample.question if not query_aware else "") + question_suffix + sample.answer_prefix
    return PromptTexts(context, special_tokens, question, messages, question_suffix, turn_close)


def tokenizer_limit(tokenizer) -> int:
    """The most context tokens `tokenize_sample` keeps: the tokenizer's model_max_length."""
    return min(tokenizer.model_max_length, int(1e10))


def input_token_count(tokenizer, sample: Sample) -> int:
    """The tokens of `tokenize_sample(tokenizer, sample)`'s context and question together, without its
    regions and tensors: what sizing a sample to its length needs."""
    texts = prompt_texts(tokenizer, sample)
    context = tokenizer(texts.context, add_special_tokens=texts.special_tokens)["input_ids"]
    question = tokenizer(texts.question, add_special_tokens=False)["input_ids"]
    return min(len(context), tokenizer_limit(tokenizer)) + len(question)


def tokenize_sample(tokenizer, sample: Sample, *, query_aware: bool = False) -> Prompt:
    """Split the prompt as the kvpress pipeline's `preprocess` does, and give each context token its region.

    A sample that turns the chat template off (LongBench's trec, triviaqa, ...) is the task's raw prompt,
    tokenized as the task's official code does: the tokenizer's own special tokens, nothing appended. A
    sample made of chat turns (`messages`) is rendered with the template, the question in a last user turn.
    `query_aware`: the question is part of the context (kvpress's evaluation appends it to the context), and
    what is fed on top of the compressed cache is the end of the user's turn and the answer prefix.
    """
    import torch

    texts = prompt_texts(tokenizer, sample, query_aware=query_aware)
    context, question = texts.context, texts.question
    encoded = tokenizer(context, add_special_tokens=texts.special_tokens, return_offsets_mapping=True)
    context_ids = torch.tensor([encoded["input_ids"]])
    regions = token_regions(context, texts.messages, [start for start, _ in encoded["offset_mapping"]])
    encoded = tokenizer(question, add_special_tokens=False, return_offsets_mapping=True)
    question_ids = torch.tensor([encoded["input_ids"]])
    # The assistant header belongs to the user's turn (as in token_regions); the answer prefix is the
    # assistant's own words.
    prefix_start = len(question) - len(sample.answer_prefix)
    user, assistant = REGIONS.index("user"), REGIONS.index("assistant")
    question_regions = torch.tensor(
        [
            assistant if start >= prefix_start and sample.answer_prefix else user
            for start, _ in encoded["offset_mapping"]
        ],
        dtype=torch.long,
    )
    max_length = tokenizer_limit(tokenizer)
    if context_ids.shape[1] > max_length:
        logger.warning("context truncated from %d to %d tokens", context_ids.shape[1], max_length)
        context_ids, regions = context_ids[:, :max_length], regions[:max_length]
    prompt = Prompt(context_ids, question_ids, regions, question_regions)
    if sample.parts:
        suffix = texts.question_suffix
        prompt.part_question_ids = [
            encode(tokenizer, part.question + suffix + part.answer_prefix) for part in sample.parts
        ]
        prompt.turn_close_ids = encode(tokenizer, texts.turn_close) if texts.turn_close is not None else None
    return prompt


def render(tokenizer, turns: list[dict], *, add_generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(
        turns, add_generation_prompt=add_generation_prompt, tokenize=False, enable_thinking=False
    )


def encode(tokenizer, text: str) -> torch.Tensor:
    import torch

    return torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])


def token_regions(context: str, messages: list[dict], token_starts: list[int]) -> torch.Tensor:
    """The region id of each token: that of the message whose span holds the token's first character.

    A message's span runs from its content to the next message's content, so the template's header of a
    turn belongs to the previous one; text before the first message (a default system prompt) is "system".
    """
    import torch

    starts, regions, cursor = [], [], 0
    for message in messages:
        found = context.find(message["content"], cursor)
        if found < 0:  # not rendered verbatim (a template that rewrites turns): the region runs on
            continue
        starts.append(found)
        regions.append(REGIONS.index(message.get("region", message["role"])))
        cursor = found + len(message["content"])
    ids = [
        regions[index] if (index := bisect.bisect_right(starts, start) - 1) >= 0 else 0
        for start in token_starts
    ]
    return torch.tensor(ids, dtype=torch.long)


def transcript(messages: list[dict]) -> str:
    """The plain text shown for a chat sample (`Sample.context`; the engine renders `messages` with the chat
    template)."""
    return "\n\n".join(f"[{m.get('region', m['role'])}]\n{m['content']}" for m in messages)
