"""The attention-substrate study (issue 29, item 3; docs/studies/attention-substrate.md): train the 2 x 2 x 2
design of tiny byte-level models (benchmarks.substrate) for each seed, evaluate live-cache perplexity
under eviction, then write the summary table and the plot.

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
import sys
from pathlib import Path


def merge_rows(folders: list[Path], out: Path) -> None:
    """The union of the folders' rows (one per model, seed, method and keep; the first folder's wins) into
    `out`, so that the rows already in `out` are kept and merging again changes nothing. Every file is
    checked against the rows' schema before anything is written, and `out` is replaced whole
    (`write_whole`): a full disk or a kill leaves it as it was."""
    import json

    from benchmarks.substrate.summary import load

    rows = {}
    for path in [folder / "rows.jsonl" for folder in folders]:
        for row in load(path) if path.is_file() else []:
            rows.setdefault((row["model"], row["seed"], row["method"], row["keep"]), row)
    text = "".join(json.dumps(row) + "\n" for row in rows.values())  # as run_study writes them
    write_whole(out, text.encode())


def write_whole(path: Path, data: bytes) -> None:
    """Replace `path` by `data`: written to a temporary file beside it, fsync'd, and renamed over it, so
    `path` holds either its old bytes or all the new ones, never part of them. ResultsWriteError (one
    line) when it cannot be written; no temporary file is left behind."""
    import os
    import tempfile

    from kvbench.core.errors import ResultsWriteError

    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
        tmp = Path(name)
        with open(fd, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.chmod(tmp, 0o644)  # mkstemp's file is private; the rows are not
        os.replace(tmp, path)
    except OSError as error:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        raise ResultsWriteError(f"cannot write {path}: {error.strerror}; it is as it was") from None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("results/study-substrate"))
    ap.add_argument("--seeds", default="0,1,2", help="comma-separated integer seeds")
    ap.add_argument("--steps", default="200")
    ap.add_argument("--n-eval", default="32")
    ap.add_argument("--threads", default="1")
    ap.add_argument("--layers", default="2")
    ap.add_argument("--d-model", default="64")
    ap.add_argument("--heads", default="4")
    ap.add_argument("--context", default="128")
    ap.add_argument(
        "--models",
        default="",
        help="train only the design's models named with these parts (e.g. softmax, sigmoid-gate, nope)",
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
    from kvbench.core.errors import KvbenchError
    from kvbench.core.validation import parse_int

    try:  # every number through the validation layer, before any work
        seeds = [parse_int(seed, "a seed", 0) for seed in args.seeds.split(",")]
        steps, threads = parse_int(args.steps, "--steps", 1), parse_int(args.threads, "--threads", 1)
        n_eval = parse_int(args.n_eval, "--n-eval", 2)
        size = dict(
            n_layer=parse_int(args.layers, "--layers", 1),
            d_model=parse_int(args.d_model, "--d-model", 1),
            n_head=parse_int(args.heads, "--heads", 1),
            context=parse_int(args.context, "--context", 2, 4096),  # the held-out text is ~36 kB
        )
    except KvbenchError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.out.exists() and not args.out.is_dir():
        print(f"error: --out {args.out} is a file, not a folder", file=sys.stderr)
        return 2
    if args.summarise_only and not (args.out / "rows.jsonl").is_file():
        print(f"error: no rows.jsonl in {args.out} to summarise", file=sys.stderr)
        return 2
    missing = [str(d) for d in args.merge if not (d / "rows.jsonl").is_file()]
    if missing:
        print(f"error: no rows.jsonl in {', '.join(missing)}", file=sys.stderr)
        return 2
    from benchmarks.substrate import study

    wanted = set(args.models.split("-")) - {""}  # "gate" is not "nogate": names match part by part
    try:  # replace() validates the new size as the constructor does
        configs = [dataclasses.replace(c, **size) for c in study.design() if wanted <= set(c.name.split("-"))]
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not configs:
        print(f"error: no model of the design is named like {args.models!r}", file=sys.stderr)
        return 2

    from benchmarks.substrate import summary

    try:
        if args.merge:
            merge_rows([*args.merge, args.out], args.out / "rows.jsonl")
        elif not args.summarise_only:
            study.run_study(
                args.out,
                seeds=seeds,
                settings=study.TrainSettings(steps=steps),
                n_eval=n_eval,
                configs=configs,
                threads=threads,
                log=lambda m: print(m, flush=True),
            )
        summary.write_summary(args.out / "rows.jsonl", args.out)
    except KvbenchError as error:  # a damaged rows file or a full disk: one line, nothing written over it
        print(f"error: {error}", file=sys.stderr)
        return error.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
