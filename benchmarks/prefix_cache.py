"""TTFT and throughput of each prefix-cache policy against no reuse on one trace, in one run, and the store's
bookkeeping per request against a 1k-token prefill, on the embedded model.

    uv run python benchmarks/prefix_cache.py [--requests 200] [--budget 8] [--chunk-chars 120]
                                             [--answer-tokens 0] [--press knorm --ratio 0.5] [--out FILE.json]

Every policy serves each request in turn (kvbench.serving.replay.run_policies), so the load of a
shared machine falls on all of them alike; ratios are of summed TTFT and of requests per second of prefill.
The bookkeeping is the store's own time per request (lookups, inserts, evictions; tensor work aside), against
the fastest of three 1k-token prefills. Goal: bookkeeping <= 1 % of that prefill. Each reusing policy also
runs with its entries compressed by `--press` at `--ratio` (`--press none`: not); the press's own time is
reported apart (after the first token, as the store's inserts are).
"""

import argparse
import json
import time

import torch

from kvbench.bridge.models import load_model
from kvbench.serving.replay import Compression, Settings, cache_of, run_policies
from kvbench.serving.trace import make_trace


def prefill_1k(model) -> float:
    ids = torch.randint(0, model.config.vocab_size, (1, 1024))
    times = []
    for _ in range(3):
        started = time.perf_counter()
        with torch.no_grad():
            model(input_ids=ids, past_key_values=cache_of([]), use_cache=True, logits_to_keep=1)
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--budget", type=float, default=8.0, help="store budget in MiB")
    parser.add_argument("--chunk-chars", type=int, default=120)
    parser.add_argument("--answer-tokens", type=int, default=0)
    parser.add_argument("--press", default="knorm", help="press of the compressed rows (none: no such rows)")
    parser.add_argument("--ratio", type=float, default=0.5)
    parser.add_argument("--out", default=None, help="also write the numbers as JSON here")
    args = parser.parse_args()
    compression = Compression(args.press, args.ratio) if args.press != "none" else None
    model, tokenizer = load_model()
    trace = make_trace(args.requests, seed=0, chunk_chars=args.chunk_chars)
    settings = Settings(answer_tokens=args.answer_tokens)
    policies, budgets = ["none", "prefix", "chunk", "pegasus"], [int(args.budget * 2**20)]
    rows, summaries, layers = run_policies(model, tokenizer, trace, policies, budgets, settings, compression)
    base = summaries[0]
    one_k = prefill_1k(model)
    print(f"{args.requests} requests, budget {args.budget:g} MiB; 1k-token prefill {one_k * 1e3:.0f} ms")
    print(
        "policy   press       TTFT/none  throughput/none  hit rate  KiB/entry  max logit error  answers same"
        "  bookkeeping/1k prefill  press ms/request"
    )
    result = {"requests": args.requests, "budget_mib": args.budget, "prefill_1k_s": one_k, "policies": {}}
    for s in summaries:
        ttft, rps = s["ttft_total_s"] / base["ttft_total_s"], s["throughput_rps"] / base["throughput_rps"]
        overhead = s["bookkeeping_mean_s"] / one_k
        print(
            f"{s['policy']:<8} {s['press']:<10} {ttft:>9.2f}  {rps:>15.2f}  {s['hit_rate']:>8.2f}"
            f"  {s['bytes_per_entry'] / 1024:>9.1f}  {s['logit_error_max']:>15.3g}  {s['answer_same']:>12.2f}"
            f"  {overhead:>21.4%}  {s['compress_mean_s'] * 1e3:>16.1f}"
        )
        result["policies"][f"{s['policy']}/{s['press']}"] = {
            "ttft_ratio": ttft,
            "throughput_ratio": rps,
            "overhead": overhead,
            **s,
        }
    print("transition entries kept per layer:", [round(x, 3) for x in layers])
    if args.out:
        with open(args.out, "w") as file:
            json.dump(result | {"transition_kept_per_layer": layers}, file, indent=1)


if __name__ == "__main__":
    main()
