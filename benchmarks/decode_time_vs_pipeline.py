"""Time decode-time compression in the engine's batch against kvpress's pipeline run once per config.

    uv run python benchmarks/decode_time_vs_pipeline.py [--samples 1] [--length 1024] [--tokens 128]

Embedded model, RULER niah_single_2 samples, 4 presses x 3 ratios under the decode-time protocol (the
prefill compressed at the ratio, then every `--interval` decoding steps back to that size), plus no
compression, all in one engine batch. The reference is kvpress's own pipeline with the equivalent
PrefillDecodingPress(press at the ratio, DecodingPress(press, interval, size)), one config at a time, its
decoding press keeping the entries it keeps in cache order as the engine's do (kvpress issue #173,
`kvbench.bridge.adapter.keep_cache_order`, as the engine's parity tests set up the pipeline: without it
kvpress's StreamingLLM drops its sinks from the second compression on, and its answers differ by that bug).
Both decode exactly `--tokens` tokens: stop tokens are switched off on both sides, so that the decoding,
where decode-time compression acts, is what is timed. Prints both times, the speed-up and the fraction of
identical answers. Goal (issue 32): >= 8x with 100 % identical answers.
"""

import argparse
import os
import time

import torch
from kvpress import DecodingPress, KVPressTextGenerationPipeline, PrefillDecodingPress

from kvbench.bridge.adapter import keep_cache_order
from kvbench.bridge.models import load_model
from kvbench.core.config import Config
from kvbench.engine import evaluate_sample
from kvbench.engine.steps import budget_entries
from kvbench.presses import config_press
from kvbench.tasks import load_samples
from kvbench.tasks.prompt import tokenize_sample

PRESSES = ("knorm", "tova", "streaming_llm", "keydiff")
RATIOS = (0.5, 0.75, 0.9)


def pipeline_answers(model, tokenizer, sample, configs: list[Config], interval: int) -> list[str]:
    pipeline = KVPressTextGenerationPipeline(model=model, tokenizer=tokenizer, device=model.device)
    context_length = tokenize_sample(tokenizer, sample).context_ids.shape[1]
    answers = []
    for config in configs:
        press = config_press(config)
        if press is not None:
            base = config_press(Config(config.press, 0.0))
            keep_cache_order(base)
            decoding = DecodingPress(
                base_press=base,
                compression_interval=interval,
                target_size=budget_entries(config, context_length),
            )
            press = PrefillDecodingPress(prefilling_press=press, decoding_press=decoding)
        output = pipeline(
            sample.context,
            question=sample.question,
            answer_prefix=sample.answer_prefix,
            press=press,
            max_new_tokens=sample.max_new_tokens,
        )
        answers.append(output["answer"])
    return answers


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--samples", type=int, default=1, help="samples of niah_single_2")
    parser.add_argument("--length", type=int, default=1024, help="tokens per sample")
    parser.add_argument("--tokens", type=int, default=128, help="tokens decoded per answer")
    parser.add_argument("--interval", type=int, default=16, help="decoding steps between compressions")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (1: both sides alike on a shared machine)"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    model, tokenizer = load_model()
    model.generation_config.eos_token_id = []  # decode every token on both sides
    samples = load_samples(
        "niah_single_2", length=args.length, samples=args.samples, seed=0, tokenizer=tokenizer
    )
    for sample in samples:
        sample.max_new_tokens = args.tokens
    protocol = {"protocol": "decode-time", "protocol_args": (("interval", args.interval),)}
    configs = [Config("none", 0.0)] + [Config(p, r, **protocol) for p in PRESSES for r in RATIOS]
    print(f"{len(samples)} samples x {len(configs)} configs, {args.tokens} tokens, {args.threads} thread(s)")

    wall, cpu = time.perf_counter(), time.process_time()
    engine = [evaluate_sample(model, tokenizer, s, configs, batch_configs=len(configs)) for s in samples]
    engine_s, engine_cpu = time.perf_counter() - wall, time.process_time() - cpu
    print(f"engine:   {engine_s:.1f} s wall, {engine_cpu:.1f} s CPU")

    wall, cpu = time.perf_counter(), time.process_time()
    reference = [pipeline_answers(model, tokenizer, s, configs, args.interval) for s in samples]
    pipeline_s, pipeline_cpu = time.perf_counter() - wall, time.process_time() - cpu
    print(f"pipeline: {pipeline_s:.1f} s wall, {pipeline_cpu:.1f} s CPU")

    differing = [
        (config, result["prediction"], answer)
        for results, answers in zip(engine, reference, strict=True)
        for config, result, answer in zip(configs, results, answers, strict=True)
        if result["prediction"] != answer
    ]
    total = len(samples) * len(configs)
    print(f"speed-up: {pipeline_s / engine_s:.1f}x wall, {pipeline_cpu / engine_cpu:.1f}x CPU")
    print(f"identical answers: {total - len(differing)}/{total}")
    for config, prediction, answer in differing:
        # From the first differing character: 128-token answers often share a long beginning.
        at = len(os.path.commonprefix([prediction, answer]))
        print(
            f"  {config.press}@{config.ratio}, from character {at}: {prediction[at : at + 50]!r} "
            f"vs pipeline {answer[at : at + 50]!r}"
        )


if __name__ == "__main__":
    main()
