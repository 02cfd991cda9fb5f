"""A model folder's tokenizer read by transformers against kvbench's `read_tokenizer`, which parses a folder
once per process and deep-copies it for each caller.

    uv run python benchmarks/tokenizer_load.py [--model smollm2-135m] [--repeats 5]

Seconds per load, fastest of interleaved repeats (other processes on a shared machine only ever add time),
after one read that fills kvbench's cache; and the ratio. Both give the same ids and the same chat
template, checked here before timing.
"""

import argparse
import time

from transformers import AutoTokenizer

from kvbench.bridge.models import read_tokenizer, resolve


def seconds(load) -> float:
    started = time.perf_counter()
    load()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    folder = resolve(args.model)
    theirs, ours = AutoTokenizer.from_pretrained(folder), read_tokenizer(folder)
    text = "The quick brown fox jumps over the lazy dog. " * 40
    assert theirs(text)["input_ids"] == ours(text)["input_ids"]
    assert theirs.chat_template == ours.chat_template
    loads = {
        "transformers": lambda: AutoTokenizer.from_pretrained(folder),
        "kvbench": lambda: read_tokenizer(folder),
    }
    best = {name: float("inf") for name in loads}
    for _ in range(args.repeats):
        for name, load in loads.items():
            best[name] = min(best[name], seconds(load))
    print(f"{args.model}: seconds per load, fastest of {args.repeats} interleaved repeats")
    for name, value in best.items():
        print(f"  {name:>12} {value:.3f}")
    print(f"  transformers / kvbench: {best['transformers'] / best['kvbench']:.1f}x")


if __name__ == "__main__":
    main()
