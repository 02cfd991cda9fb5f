"""streaming: the context arrives `chunk` tokens at a time, each run's cache compressed back under its
budget after each chunk, then the question is asked."""

from kvbench.bridge.adapter import clock, empty_batch
from kvbench.engine.decoder import BatchedDecoder
from kvbench.engine.steps import Run, attention_rows, kv_counts, stepwise_presses
from kvbench.tasks.base import Sample


def run(model, runs: list[Run], sample: Sample) -> None:
    run_streaming(model, runs, sample.max_new_tokens)


def run_streaming(model, runs: list[Run], max_new_tokens: int) -> None:
    """The context fed `chunk` tokens at a time to every run as one batch; after each chunk, each run's
    press compresses its cache back under its budget (the entries the query-agnostic protocol would keep of
    the whole context), then the question is asked and answered as one batch.

    The compression follows kvpress's DecodingPress with the chunks as its steps (interval 1, a buffer of
    the last chunk's hidden states). As DecodingPress skips the prefill, the first chunk is compressed
    together with the second: the cache never holds more than its budget plus one chunk.
    """
    prompt = runs[0].prompt
    context_length = prompt.context_ids.shape[1]
    chunk = dict(runs[0].config.protocol_args)["chunk"]
    presses = stepwise_presses(model, runs, prompt, context_length)
    room = context_length + prompt.question_ids.shape[1] + max_new_tokens
    decoder = BatchedDecoder(
        model, empty_batch(model, len(runs), room), None, presses, attention_rows(runs, presses)
    )
    start = clock(model)
    with decoder.attending():
        for position in range(0, context_length, chunk):
            decoder.feed(prompt.context_ids[:, position : position + chunk], position, logits_to_keep=1)
    prefill_s = (clock(model) - start) / len(runs)
    kept = decoder.real_entries().sum(0) * model.config.get_text_config().num_key_value_heads
    for row, run in enumerate(runs):
        counts = kv_counts(model, context_length, (int(kept[row]), None), run.press)
        run.result.update(counts, prefill_s=prefill_s)
    decoder.presses = {}  # the question and the answer are not compressed
    start = clock(model)
    tokens = decoder.decode(prompt.question_ids, context_length, max_new_tokens)
    decode_s = (clock(model) - start) / len(runs)
    for run, run_tokens in zip(runs, tokens, strict=True):
        run.answers.append({"tokens": run_tokens, "decode_s": decode_s})
