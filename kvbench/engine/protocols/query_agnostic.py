"""query-agnostic (kvpress's pipeline token for token) and query-aware (the question is prefilled with the
context: the prompt, `Protocol.question_prefilled`, is all that differs): compress once, then ask."""

from kvbench.engine.steps import Run, answer_question, prefill_shared
from kvbench.tasks.base import Sample


def run(model, runs: list[Run], sample: Sample) -> None:
    prefill_shared(model, runs)
    answer_question(model, runs, sample.max_new_tokens)
