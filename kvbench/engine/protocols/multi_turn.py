"""multi-turn: `turns` turns whose questions and answers stay in the cache, compressed back to the budget
after each (SCBench's multi-turn)."""

import torch

from kvbench.bridge.adapter import (
    DynamicCache,
    clock,
    decoding_press,
    layer_holding,
    pad_caches,
    stop_token_ids,
)
from kvbench.engine.decoder import BatchedDecoder
from kvbench.engine.steps import Run, budget_entries, cache_entries, kv_counts, longest_first, prefill_shared
from kvbench.tasks.base import Sample


def run(model, runs: list[Run], sample: Sample) -> None:
    prefill_shared(model, runs)
    answer_turns(model, sample.questions(), runs)


def answer_turns(model, questions: list[Sample], runs: list[Run]) -> None:
    """The multi-turn protocol: each turn's question is answered on top of every run's cache as one batch
    (each row at its own position: earlier answers differ in length); then each run's turn (its question,
    its answer and the template's end of turn) is fed on top of its own cache, and its press, as kvpress's
    DecodingPress at that step, compresses the whole cache back to its budget of every token seen so far
    (`budget_entries`), scoring with that turn's tokens as its queries. A stateful press keeps its state
    across turns. The last turn is not fed back: nothing asks after it.

    A stop token that ends an answer is not fed back: the template's end of turn (`Prompt.turn_close_ids`)
    opens with its own."""
    prompt = runs[0].prompt
    seen = {id(run): prompt.context_ids.shape[1] for run in runs}  # tokens each run's cache has seen
    stop_ids = set(stop_token_ids(model))
    for turn, (question_ids, part) in enumerate(zip(prompt.part_question_ids, questions, strict=True)):
        order = longest_first(runs)
        for run in order:
            counts = kv_counts(model, seen[id(run)], cache_entries(run.cache), run.press)
            run.answers.append(counts)
        cache, padding = pad_caches([run.cache for run in order], question_ids.shape[1] + part.max_new_tokens)
        positions = torch.tensor([seen[id(run)] for run in order], device=model.device)
        start = clock(model)
        tokens = BatchedDecoder(model, cache, padding).decode(question_ids, positions, part.max_new_tokens)
        decode_s = (clock(model) - start) / len(order)
        del cache
        for run, run_tokens in zip(order, tokens, strict=True):
            run.answers[-1].update(tokens=run_tokens, decode_s=decode_s)
        if turn == len(questions) - 1:
            break
        for run, run_tokens in zip(order, tokens, strict=True):
            answer = run_tokens[:-1] if run_tokens and run_tokens[-1] in stop_ids else run_tokens
            fed = torch.cat(
                [question_ids, torch.tensor([answer], dtype=torch.long), prompt.turn_close_ids], 1
            )
            start = clock(model)
            run.cache = close_turn(model, run, fed, seen[id(run)])
            run.answers[-1]["decode_s"] += clock(model) - start
            seen[id(run)] += fed.shape[1]
    for run in runs:
        run.cache = None


def close_turn(model, run: Run, fed: torch.Tensor, position: int) -> DynamicCache:
    """`run`'s cache with `fed` on top, from `position` on, compressed back to the run's budget of every
    token it has seen by its press (kvpress DecodingPress semantics: one step, `fed`'s hidden states as the
    press's queries); uncompressed for `none`."""
    target = budget_entries(run.config, position + fed.shape[1])
    presses = {0: decoding_press(run.press, 1, target)} if run.press is not None else {}
    cache, _ = pad_caches([run.cache], fed.shape[1])
    decoder = BatchedDecoder(model, cache, None, presses, [0] if presses and run.needs_attentions else [])
    decoder.feed(fed, position, logits_to_keep=1)
    held = decoder.real_entries()[:, 0].tolist()
    kept = DynamicCache()
    for layer, real in zip(cache.layers, held, strict=True):  # the real entries are right-aligned
        length = layer.keys.shape[2]
        kept.layers.append(
            layer_holding(layer.keys[:, :, length - real :], layer.values[:, :, length - real :])
        )
    return kept
