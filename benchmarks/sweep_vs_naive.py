"""Time the engine against a naive loop calling kvpress's pipeline once per (press, ratio), same samples.

    uv run python benchmarks/sweep_vs_naive.py [--samples 1] [--length 2048] [--threads 1]

Embedded model, RULER samples (niah_single_2 and vt, `--samples` of each), 8 presses x 4 ratios, all in
one engine batch. Prints both times, the speed-up and the fraction of identical answers. The naive loop runs
h2o on the eager attention (it needs attention weights); the engine computes them in its shared prefill.
"""

import argparse
import time

import torch
from kvpress import KVPressTextGenerationPipeline

from kvbench.bridge.adapter import attention_implementation
from kvbench.bridge.models import load_model
from kvbench.core.config import Config
from kvbench.engine import evaluate_sample
from kvbench.presses import config_press, needs_eager
from kvbench.tasks import load_samples

PRESSES = ("knorm", "snapkv", "tova", "h2o", "streaming_llm", "expected_attention", "random", "keydiff")
RATIOS = (0.25, 0.5, 0.75, 0.9)
TASKS = ("niah_single_2", "vt")


def naive_answers(model, tokenizer, sample, configs: list[Config]) -> list[str]:
    pipeline = KVPressTextGenerationPipeline(model=model, tokenizer=tokenizer, device=model.device)
    answers = []
    for config in configs:
        eager = needs_eager(config.press, dict(config.press_args))
        with attention_implementation(model, "eager" if eager else model.config._attn_implementation):
            output = pipeline(
                sample.context,
                question=sample.question,
                answer_prefix=sample.answer_prefix,
                press=config_press(config),
                max_new_tokens=sample.max_new_tokens,
            )
        answers.append(output["answer"])
    return answers


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--samples", type=int, default=1, help="samples per task")
    parser.add_argument("--length", type=int, default=2048, help="tokens per sample")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch CPU threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    model, tokenizer = load_model()
    samples = [
        sample
        for task in TASKS
        for sample in load_samples(
            task, length=args.length, samples=args.samples, seed=0, tokenizer=tokenizer
        )
    ]
    configs = [Config(press, ratio) for press in PRESSES for ratio in RATIOS]
    print(f"{len(samples)} samples x {len(configs)} configs, {args.threads} thread(s)")

    # CPU time too: on a machine shared with other work, wall time says more about the neighbours.
    wall, cpu = time.perf_counter(), time.process_time()
    engine = [evaluate_sample(model, tokenizer, s, configs, batch_configs=len(configs)) for s in samples]
    engine_s, engine_cpu = time.perf_counter() - wall, time.process_time() - cpu
    print(f"engine: {engine_s:.1f} s wall, {engine_cpu:.1f} s CPU")

    wall, cpu = time.perf_counter(), time.process_time()
    naive = [naive_answers(model, tokenizer, s, configs) for s in samples]
    naive_s, naive_cpu = time.perf_counter() - wall, time.process_time() - cpu
    print(f"naive:  {naive_s:.1f} s wall, {naive_cpu:.1f} s CPU")

    differing = [
        (sample, config, result["prediction"], answer)
        for sample, results, answers in zip(samples, engine, naive, strict=True)
        for config, result, answer in zip(configs, results, answers, strict=True)
        if result["prediction"] != answer
    ]
    total = len(samples) * len(configs)
    print(f"speed-up: {naive_s / engine_s:.1f}x wall, {naive_cpu / engine_cpu:.1f}x CPU")
    print(f"identical answers: {total - len(differing)}/{total}")
    for sample, config, prediction, answer in differing:
        print(
            f"  {sample.task}/{sample.id} {config.press}@{config.ratio}: {prediction!r} vs naive {answer!r}"
        )


if __name__ == "__main__":
    main()
