"""The attention-substrate study (issue 29, item 3; docs/studies/attention-substrate.md): train the 2 x 2 x 2
design of tiny byte-level models (kvbench.substrate) for each seed, evaluate live-cache perplexity under
eviction, then write the summary table and the plot.

    nice -n 10 uv run python benchmarks/substrate_study.py --out results/study-substrate
    uv run python benchmarks/substrate_study.py --out results/study-substrate --summarise-only

A rerun resumes: models already in <out>/rows.jsonl are skipped.
"""

import argparse
import sys
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("results/study-substrate"))
    ap.add_argument("--seeds", default="0,1,2", help="comma-separated integer seeds")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--n-eval", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--summarise-only", action="store_true")
    args = ap.parse_args(argv)
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        print(f"error: --seeds must be comma-separated integers, not {args.seeds!r}", file=sys.stderr)
        return 2
    if args.steps < 1 or args.n_eval < 2 or args.threads < 1:
        print("error: --steps and --threads must be >= 1, --n-eval >= 2", file=sys.stderr)
        return 2
    from kvbench.substrate import study

    if not args.summarise_only:
        study.run_study(
            args.out,
            seeds=seeds,
            settings=study.TrainSettings(steps=args.steps),
            n_eval=args.n_eval,
            threads=args.threads,
            log=lambda m: print(m, flush=True),
        )
    from kvbench.substrate import summary

    summary.write_summary(args.out / "rows.jsonl", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
