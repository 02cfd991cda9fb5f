"""The finiteness check of a training shard or checkpoint tensor: `torch.isfinite(t).all()` against
kvbench's `all_finite`, on a tensor the size of one datagen shard's keys (layers x KV heads x tokens x head
dim; default the embedded model's at 512 tokens), in each dtype kvbench stores.

    uv run python benchmarks/finite_check.py [--shape 30,3,512,64] [--repeats 20] [--threads 1]

Milliseconds per check, fastest of interleaved repeats, and the ratio. Both answers are checked equal on the
tensor as it is and with one nan in it.
"""

import argparse
import time

import torch

from kvbench.learned.common.state import all_finite


def milliseconds(check) -> float:
    started = time.perf_counter()
    check()
    return 1000 * (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shape", default="30,3,512,64")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    shape = tuple(int(size) for size in args.shape.split(","))
    print(
        f"shape {shape}, {args.threads} thread(s): ms per check, fastest of {args.repeats} interleaved"
        " repeats"
    )
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        tensor = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(dtype)
        poisoned = tensor.clone()
        poisoned.view(-1)[tensor.numel() // 2] = float("nan")
        for case in (tensor, poisoned):
            assert all_finite(case) == bool(torch.isfinite(case).all())
        checks = {
            "isfinite().all()": lambda tensor=tensor: torch.isfinite(tensor).all(),
            "all_finite": lambda tensor=tensor: all_finite(tensor),
        }
        best = {name: float("inf") for name in checks}
        for _ in range(args.repeats):
            for name, check in checks.items():
                best[name] = min(best[name], milliseconds(check))
        ratio = best["isfinite().all()"] / best["all_finite"]
        print(
            f"  {str(dtype):>15}: " + ", ".join(f"{n} {v:.2f}" for n, v in best.items()) + f"; {ratio:.1f}x"
        )


if __name__ == "__main__":
    main()
