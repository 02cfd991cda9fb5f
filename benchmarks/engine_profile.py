"""Where a sweep's time goes, phase by phase, and the speed-up over kvpress's per-config pipeline that those
phases allow: the profile behind `benchmarks/sweep_vs_naive.py`'s ratio.

    uv run python benchmarks/engine_profile.py [--length 2048] [--threads 1] [--repeats 3]

One RULER context (niah_single_2) on the embedded model, the 8 presses x 4 ratios of sweep_vs_naive. Each
phase is timed alone (one thread by default: a second thread on a 2-core machine shared with other work
measures the neighbours): the prefills and the stacking the fastest of `--repeats`, the question once per
row count, a step the mean of 5 after 5 untimed ones:

- the prefill of the context, plain, and as the engine runs it (attention weights for h2o, then every
  config's compression in the layer hooks);
- stacking the 32 compressed caches into one padded batch;
- the question fed on top of the 32 rows, and one greedy step at 32, 16, 8 and 1 rows, split by the
  profiler into the linear layers (aten::mm) and the attention (SDPA), beside the bytes of KV the step reads.

The bound then sets a config's share of the engine (the shared prefill, the question and a step, each over
32) beside what the pipeline spends per config (a prefill, the question at one row and a step at one row),
for answers of n tokens: the speed-up no scheduling of this work can beat while the arithmetic stays the
pipeline's (float32, the same caches).
"""

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile
from transformers import DynamicCache

from kvbench.bridge.adapter import compress_for_each, language_model, pad_caches
from kvbench.bridge.models import load_model
from kvbench.core.config import Config
from kvbench.engine.decoder import BatchedDecoder
from kvbench.engine.steps import Run, longest_first
from kvbench.presses import config_press, needs_eager
from kvbench.tasks import load_samples
from kvbench.tasks.prompt import tokenize_sample

PRESSES = ("knorm", "snapkv", "tova", "h2o", "streaming_llm", "expected_attention", "random", "keydiff")
RATIOS = (0.25, 0.5, 0.75, 0.9)
STEPS = 5


def fastest(repeats: int, work) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return min(times)


def compressed_runs(model, prompt) -> tuple[list[Run], float]:
    """Every config's compressed cache of the context, as the engine's shared prefill makes them; and the
    time of that prefill."""
    configs = [Config(press, ratio) for press in PRESSES for ratio in RATIOS]
    runs = [Run(c, config_press(c), needs_eager(c.press, {}), prompt) for c in configs]
    started = time.perf_counter()
    with compress_for_each(model, runs):
        language_model(model)(input_ids=prompt.context_ids, past_key_values=DynamicCache())
    return longest_first(runs), time.perf_counter() - started


def step_profile(model, runs: list[Run], prompt, rows: int) -> dict:
    """The question fed on `rows` rows (the longest caches), then STEPS greedy steps: seconds per step and
    the linear and attention shares of it."""
    chosen = runs[:rows]
    cache, padding = pad_caches([run.cache for run in chosen], prompt.question_ids.shape[1] + 2 * STEPS + 1)
    decoder = BatchedDecoder(model, cache, padding)
    position = prompt.context_ids.shape[1]
    with decoder.attending():
        started = time.perf_counter()
        next_ids = decoder.feed(prompt.question_ids, position, logits_to_keep=1).argmax(-1)
        question_s = time.perf_counter() - started
        position += prompt.question_ids.shape[1]
        for step in range(STEPS):  # warm
            next_ids = decoder.feed(next_ids.unsqueeze(1), position + step).argmax(-1)
        started = time.perf_counter()
        with profile(activities=[ProfilerActivity.CPU]) as profiler:
            for step in range(STEPS, 2 * STEPS):
                next_ids = decoder.feed(next_ids.unsqueeze(1), position + step).argmax(-1)
        step_s = (time.perf_counter() - started) / STEPS
    self_s = {event.key: event.self_cpu_time_total / 1e6 / STEPS for event in profiler.key_averages()}
    total = sum(self_s.values())
    linear = self_s.get("aten::mm", 0.0) / total
    attention = sum(s for key, s in self_s.items() if "scaled_dot_product" in key) / total
    entries = sum(int(layer.keys.shape[2]) for run in chosen for layer in run.cache.layers)
    kv_bytes = 2 * entries * cache.layers[0].keys.shape[1] * cache.layers[0].keys.shape[3] * 4
    return {
        "question_s": question_s,
        "step_s": step_s,
        "linear": linear,
        "attention": attention,
        "kv_gb": kv_bytes / 1e9,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--length", type=int, default=2048, help="tokens of the context")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, tokenizer = load_model()
    sample = load_samples("niah_single_2", length=args.length, samples=1, seed=0, tokenizer=tokenizer)[0]
    prompt = tokenize_sample(tokenizer, sample, query_aware=False)
    print(
        f"{prompt.context_ids.shape[1]} context tokens, {args.threads} thread(s), "
        f"{torch.backends.cpu.get_cpu_capability()}"
    )

    with torch.no_grad():
        plain_s = fastest(
            args.repeats,
            lambda: language_model(model)(input_ids=prompt.context_ids, past_key_values=DynamicCache()),
        )
        runs, shared_s = compressed_runs(model, prompt)
        for _ in range(args.repeats - 1):
            runs, again = compressed_runs(model, prompt)
            shared_s = min(shared_s, again)
        compress_s = sum(run.compress_s for run in runs)  # of the last prefill's runs
        caches = [run.cache for run in runs]
        pad_s = fastest(args.repeats, lambda: pad_caches(caches, prompt.question_ids.shape[1] + 128))
        steps = {rows: step_profile(model, runs, prompt, rows) for rows in (32, 16, 8, 1)}

    print("\n| phase | s | share of a config |\n|---|---|---|")
    print(f"| prefill, plain | {plain_s:.2f} | {plain_s / 32:.3f} |")
    print(f"| prefill as the engine runs it (32 configs) | {shared_s:.2f} | {shared_s / 32:.3f} |")
    print(f"| of which the presses' compression | {compress_s:.2f} | |")
    print(f"| of which h2o's attention weights and hooks | {shared_s - plain_s - compress_s:.2f} | |")
    print(f"| stacking 32 caches | {pad_s:.2f} | {pad_s / 32:.3f} |")
    print(
        "\n| rows | question s | step s | step s per row | linear share | attention share | KV read GB/step |"
    )
    print("|---|---|---|---|---|---|---|")
    for rows, measured in steps.items():
        print(
            f"| {rows} | {measured['question_s']:.2f} | {measured['step_s']:.3f} | "
            f"{measured['step_s'] / rows:.4f} | {measured['linear']:.0%} | {measured['attention']:.0%} | "
            f"{measured['kv_gb']:.2f} |"
        )
    one, batch = steps[1], steps[32]
    print("\nbound on the speed-up (pipeline per config / engine per config), answers of n tokens:")
    for n in (1, 30, 64, 128):
        pipeline = plain_s + one["question_s"] + (n - 1) * one["step_s"]
        engine = (shared_s + pad_s + batch["question_s"] + (n - 1) * batch["step_s"]) / 32
        print(
            f"  n={n:4d}: pipeline {pipeline:6.2f} s, engine {engine:6.3f} s a config: "
            f"{pipeline / engine:5.1f}x"
        )


if __name__ == "__main__":
    main()
