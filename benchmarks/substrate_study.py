"""The attention-substrate study (issue 29, item 3; docs/studies/attention-substrate.md): train the 2 x 2 x 2
design of tiny byte-level models (kvbench.substrate) for each seed, evaluate live-cache perplexity under
eviction, then write the summary table and the plot.

    nice -n 10 uv run python benchmarks/substrate_study.py --out results/study-substrate
    uv run python benchmarks/substrate_study.py --out results/study-substrate --summarise-only
    # the planned size (4 layers, d = 128, context 256), the design split over two processes, one per core:
    uv run python benchmarks/substrate_study.py --layers 4 --d-model 128 --context 256 --steps 300 \
        --models softmax --out results/study-substrate-4l/softmax
    uv run python benchmarks/substrate_study.py --layers 4 --d-model 128 --context 256 --steps 300 \
        --models sigmoid --out results/study-substrate-4l/sigmoid
    uv run python benchmarks/substrate_study.py --merge results/study-substrate-4l/softmax \
        results/study-substrate-4l/sigmoid --out results/study-substrate-4l

A rerun resumes: models already in <out>/rows.jsonl are skipped.
"""

import argparse
import dataclasses
import json
import sys
from pathlib import Path


def merge_rows(folders: list[Path], out: Path) -> None:
    """The union of the folders' rows (one per model, seed, method and keep; the first folder's wins) into
    `out`, so that the rows already in `out` are kept and merging again changes nothing."""
    rows = {}
    for folder in folders:
        path = folder / "rows.jsonl"
        for line in path.read_text().splitlines() if path.is_file() else []:
            r = json.loads(line)
            rows.setdefault((r["model"], r["seed"], r["method"], r["keep"]), line)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(line + "\n" for line in rows.values()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("results/study-substrate"))
    ap.add_argument("--seeds", default="0,1,2", help="comma-separated integer seeds")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--n-eval", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument(
        "--models",
        default="",
        help="train only the design's models whose name contains this (e.g. softmax, sigmoid-gate)",
    )
    ap.add_argument(
        "--merge",
        nargs="+",
        type=Path,
        default=[],
        help="add these study folders' rows to --out/rows.jsonl (rows already there kept) and summarise",
    )
    ap.add_argument("--summarise-only", action="store_true")
    args = ap.parse_args(argv)
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        print(f"error: --seeds must be comma-separated integers, not {args.seeds!r}", file=sys.stderr)
        return 2
    sizes = (args.steps, args.threads, args.layers, args.d_model, args.heads, args.context)
    if min(sizes) < 1 or args.n_eval < 2:
        print(
            "error: --steps, --threads, --layers, --d-model, --heads and --context must be >= 1, "
            "--n-eval >= 2",
            file=sys.stderr,
        )
        return 2
    if args.context > 4096:
        print("error: --context must be <= 4096 (the held-out text is ~36 kB)", file=sys.stderr)
        return 2
    missing = [str(d) for d in args.merge if not (d / "rows.jsonl").is_file()]
    if missing:
        print(f"error: no rows.jsonl in {', '.join(missing)}", file=sys.stderr)
        return 2
    from kvbench.substrate import study

    size = dict(d_model=args.d_model, n_layer=args.layers, n_head=args.heads, context=args.context)
    try:  # replace() validates the new size as the constructor does
        configs = [dataclasses.replace(c, **size) for c in study.design() if args.models in c.name]
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not configs:
        print(f"error: no model of the design is named like {args.models!r}", file=sys.stderr)
        return 2

    if args.merge:
        merge_rows([*args.merge, args.out], args.out / "rows.jsonl")
    elif not args.summarise_only:
        study.run_study(
            args.out,
            seeds=seeds,
            settings=study.TrainSettings(steps=args.steps),
            n_eval=args.n_eval,
            configs=configs,
            threads=args.threads,
            log=lambda m: print(m, flush=True),
        )
    from kvbench.substrate import summary

    summary.write_summary(args.out / "rows.jsonl", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
