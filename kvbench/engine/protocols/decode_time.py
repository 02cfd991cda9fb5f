"""decode-time: as query-agnostic, and each run's cache is compressed again every `interval` decoding
steps back to the size the prefill left (kvpress's PrefillDecodingPress with a DecodingPress), all runs
decoded as one batch."""

from kvbench.bridge.adapter import decoding_press
from kvbench.engine.steps import Run, answer_question, budget_entries, prefill_shared
from kvbench.tasks.base import Sample


def run(model, runs: list[Run], sample: Sample) -> None:
    prefill_shared(model, runs)
    context_length = runs[0].prompt.context_ids.shape[1]
    answer_question(model, runs, sample.max_new_tokens, lambda run: decode_time_press(run, context_length))


def decode_time_press(run: Run, context_length: int):
    """The run's own press (its state from the prefill goes on) as a DecodingPress compressing every
    `interval` steps back to the budget; None for the uncompressed run."""
    if run.press is None:
        return None
    interval = dict(run.config.protocol_args)["interval"]
    return decoding_press(run.press, interval, budget_entries(run.config, context_length))
