"""DistillCache costs on the embedded model: prefill with `distillcache` vs no press, training per step.

    uv run python benchmarks/distillcache.py [--data data/distillcache/smollm2-135m] [--lengths 1024,4096]

Prefill: the model's whole prefill (no LM head) on random tokens, distillcache at ratio 0.5 vs no press,
fastest of interleaved repeats (other processes on a shared machine only ever add time); knorm and snapkv at
0.5 alongside (the top-k and gather every scorer costs; snapkv's window queries, which distillcache also
recomputes). Goal: <= 5 % over no press.
Training: seconds per REINFORCE step (one prompt, `ratios_per_step` ratios x K keep-sets through the frozen
model), from the data store; the card's `seconds_per_step` is the same number for the shipped run.
"""

import argparse
import time

import torch
from transformers import DynamicCache

from kvbench.bridge.models import load_model
from kvbench.learned.distillcache.policy import DistillCachePolicy
from kvbench.learned.distillcache.train import DistillData, TrainConfig, feature_statistics, train_step
from kvbench.presses import build_press


def timed(function, *args) -> float:
    started = time.perf_counter()
    function(*args)
    return time.perf_counter() - started


@torch.no_grad()
def prefill(model, input_ids, press=None) -> DynamicCache:
    cache = DynamicCache()
    if press is None:
        model.model(input_ids=input_ids, past_key_values=cache)
    else:
        with press(model):
            model.model(input_ids=input_ids, past_key_values=cache)
    return cache


def benchmark_prefill(model, lengths: list[int], repeats: int) -> None:
    presses = {name: build_press(name, 0.5) for name in ("distillcache", "knorm", "snapkv")}
    presses["distillcache"].post_init_from_model(model)  # load the policy outside the timings
    print("seconds, fastest of interleaved repeats; overhead vs no press")
    print(f"{'tokens':>7} {'none s':>8}" + "".join(f" {name + ' s':>15} {'overhead':>9}" for name in presses))
    for length in lengths:
        input_ids = torch.randint(100, model.config.vocab_size, (1, length))
        prefill(model, input_ids)  # warm-up
        times = {name: [] for name in ["none", *presses]}
        for _ in range(repeats):
            times["none"].append(timed(prefill, model, input_ids))
            for name, press in presses.items():
                times[name].append(timed(prefill, model, input_ids, press))
        none = min(times["none"])
        row = f"{length:7d} {none:8.3f}"
        for name in presses:
            fastest = min(times[name])
            row += f" {fastest:15.3f} {100 * (fastest / none - 1):8.1f}%"
        print(row)


def benchmark_training(model, data_dir: str, steps: int) -> None:
    data = DistillData(data_dir)
    config = TrainConfig()
    policy = DistillCachePolicy(config.hidden)
    mean, std = feature_statistics(data)
    policy.feature_mean.copy_(mean)
    policy.feature_std.copy_(std)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=config.lr)
    generator = torch.Generator().manual_seed(0)
    model.requires_grad_(False)
    seconds = []
    for step in range(steps):
        prompt = data.load(data.train[step % len(data.train)])
        ratios = config.ratios[: config.ratios_per_step]
        seconds.append(timed(train_step, model, policy, optimizer, prompt, ratios, config, generator))
    print(
        f"training: {min(seconds):.2f} s/step fastest, {sum(seconds) / steps:.2f} mean over {steps} steps "
        f"({config.ratios_per_step} ratios x {config.samples} keep-sets) -> {TrainConfig().steps} steps in "
        f"{sum(seconds) / steps * TrainConfig().steps / 60:.1f} min"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lengths", default="1024,4096")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--data", help="datagen folder; times training steps when given")
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    model, _ = load_model()
    benchmark_prefill(model, [int(n) for n in args.lengths.split(",")], args.repeats)
    if args.data:
        benchmark_training(model, args.data, args.steps)


if __name__ == "__main__":
    main()
