"""What a model costs on this machine, per dtype: one prefill of a random N-token input and one greedy
decoding step over a cache of M tokens for 1 and for 16 rows, best of R runs each, measured side by side in
one process; what sizes a study can afford (docs/studies/two-models.md).

    uv run python benchmarks/model_costs.py --model qwen2.5-coder-1.5b --dtypes float32,bfloat16
    uv run python benchmarks/model_costs.py --model smollm2-135m --dtypes float32,bfloat16

Prints the CPU kernel torch dispatches to (its capability, e.g. AVX512_BF16) and the attention kernel
(sdpa), then a table of seconds.
"""

import argparse
import time

import torch

from kvbench.bridge.models import load_model


def bf16_flags() -> str:
    """The CPU's bfloat16 instructions (Linux), which decide what bfloat16 buys: oneDNN runs its matmuls on
    AMX tiles where the CPU has them."""
    try:
        flags = set(open("/proc/cpuinfo").read().split())
    except OSError:
        return "unknown"
    return ", ".join(sorted(flags & {"avx512_bf16", "amx_bf16", "amx_tile"})) or "none"


def best_of(runs: int, step) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return min(times)


@torch.inference_mode()
def costs(model, length: int, cache: int, rows: int, runs: int) -> dict:
    vocab = model.config.vocab_size
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab, (1, length), generator=generator)
    prefill = best_of(runs, lambda: model(prompt))
    timings = {"prefill": prefill}
    for batch in (1, rows):
        context = torch.randint(0, vocab, (batch, cache), generator=generator)
        past = model(context, use_cache=True).past_key_values
        token = torch.randint(0, vocab, (batch, 1), generator=generator)

        def step(past=past, token=token):
            model(token, past_key_values=past, use_cache=True)
            for layer in past.layers:  # drop the entry just appended: every step sees the same cache
                layer.keys, layer.values = layer.keys[:, :, :cache], layer.values[:, :, :cache]

        timings[f"decode x{batch}"] = best_of(runs, step)
    return timings


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--length", type=int, default=1024, help="prefill tokens")
    parser.add_argument("--cache", type=int, default=256, help="cache tokens under a decoding step")
    parser.add_argument("--rows", type=int, default=16, help="the batched decoding step's rows")
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU kernels: "
        f"{torch.backends.cpu.get_cpu_capability()}, bfloat16 instructions: {bf16_flags()}, "
        f"oneDNN: {torch.backends.mkldnn.is_available()}, attention: sdpa"
    )
    print(f"| {args.model} | prefill {args.length} (s) | decode step x1 (s) | decode step x{args.rows} (s) |")
    print("|---|---|---|---|")
    for dtype in args.dtypes.split(","):
        model, _ = load_model(args.model, dtype=dtype, attn_implementation="sdpa")
        timings = costs(model, args.length, args.cache, args.rows, args.runs)
        print(
            f"| {dtype} | {timings['prefill']:.2f} | {timings['decode x1']:.3f} | "
            f"{timings[f'decode x{args.rows}']:.3f} |",
            flush=True,
        )
        del model


if __name__ == "__main__":
    main()
