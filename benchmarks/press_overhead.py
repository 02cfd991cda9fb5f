"""Prefill cost of the memory-budget presses on the embedded model, each against no press.

    uv run python benchmarks/press_overhead.py [--presses qevict,varrate,...] [--memory 0.25]
                                               [--lengths 1024,4096] [--repeats 3]

A press may carry press arguments after a colon, to time two settings of one press side by side:
`--presses knorm,qevict,qevict:scored_queries=all` (arguments separated by `;`).

The model's whole prefill (no LM head) on random tokens under each press (kvpress's hook, as the pipeline
runs it) at the memory budget (evictors at ratio 1 - memory), against the same prefill without a press,
knorm alongside (the top-k and gather every scorer costs). Fastest of interleaved repeats: other processes
on a shared machine only ever add time. Goal: <= 10 % for each press.
"""

import argparse
import time

import torch
from transformers import DynamicCache

from kvbench.bridge.models import load_model
from kvbench.presses import PRESSES, build_press, parse_press_args

DEFAULT_PRESSES = "knorm,quant,lowrank,varrate,qevict,andpro,memdecay"


def prefill(model, input_ids, press=None) -> float:
    started = time.perf_counter()
    with torch.no_grad():
        if press is None:
            model.model(input_ids=input_ids, past_key_values=DynamicCache())
        else:
            with press(model):
                model.model(input_ids=input_ids, past_key_values=DynamicCache())
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--presses", default=DEFAULT_PRESSES)
    parser.add_argument("--memory", type=float, default=0.25)
    parser.add_argument("--lengths", default="1024,4096")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    model, _ = load_model()
    names = [name for name in args.presses.split(",") if name.partition(":")[0] in PRESSES]
    presses = {}
    for name in names:
        press, _, pairs = name.partition(":")
        press_args = parse_press_args([pair for pair in pairs.split(";") if pair])
        if PRESSES[press].codec:
            presses[name] = build_press(press, 0.0, memory=args.memory, **press_args)
        else:
            presses[name] = build_press(press, round(1 - args.memory, 10), **press_args)
    print(f"prefill seconds (fastest of {args.repeats} interleaved repeats), memory {args.memory}")
    print(f"{'tokens':>7} {'none':>8} " + " ".join(f"{name:>24}" for name in names))
    for length in [int(n) for n in args.lengths.split(",")]:
        input_ids = torch.randint(100, model.config.vocab_size, (1, length))
        prefill(model, input_ids)  # warm-up
        times = {name: [] for name in ["none", *names]}
        for _ in range(args.repeats):
            times["none"].append(prefill(model, input_ids))
            for name in names:
                times[name].append(prefill(model, input_ids, presses[name]))
        none = min(times["none"])
        cells = [f"{min(times[n]):7.3f} {100 * (min(times[n]) / none - 1):+6.1f}%" for n in names]
        print(f"{length:7d} {none:8.3f} " + " ".join(f"{cell:>24}" for cell in cells))


if __name__ == "__main__":
    main()
