"""multi-question: compress once, answer `questions` questions from that cache, each answer removed
before the next (kvpress's pipeline given a list of questions; SCBench's multi-request)."""

from kvbench.bridge.adapter import clock, pad_caches
from kvbench.engine.decoder import BatchedDecoder
from kvbench.engine.steps import Run, longest_first, prefill_shared
from kvbench.tasks.base import Sample


def run(model, runs: list[Run], sample: Sample) -> None:
    prefill_shared(model, runs)
    answer_questions(model, sample.questions(), runs)


def answer_questions(model, questions: list[Sample], runs: list[Run]) -> None:
    """Compress once, answer many (kvpress's pipeline given a list of questions): each question fed on top
    of every run's compressed cache and answered as one batch, from a copy, so that no answer stays in the
    cache of the next question."""
    prompt = runs[0].prompt
    context_length = prompt.context_ids.shape[1]
    runs = longest_first(runs)
    for question_ids, part in zip(prompt.part_question_ids, questions, strict=True):
        cache, padding = pad_caches([run.cache for run in runs], question_ids.shape[1] + part.max_new_tokens)
        start = clock(model)
        tokens = BatchedDecoder(model, cache, padding).decode(
            question_ids, context_length, part.max_new_tokens
        )
        decode_s = (clock(model) - start) / len(runs)
        for run, run_tokens in zip(runs, tokens, strict=True):
            run.answers.append({"tokens": run_tokens, "decode_s": decode_s})
    for run in runs:
        run.cache = None
