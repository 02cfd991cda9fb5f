"""Time one sweep on Ray with 1 worker x 1 thread and with 2 workers x 1 thread, side by side.

    uv run --extra ray python benchmarks/ray_sweep.py [--samples 4] [--length 512] [--repeats 1]

Embedded model, RULER niah_single_1 and niah_single_2 (`--samples` of each), no compression plus knorm,
snapkv, tova and streaming_llm at ratio 0.5: one unit of work per sample. Each run starts a local Ray
cluster of 2 CPUs, its workers load the model, and the main process writes the rows to a fresh store: the
times are whole sweeps, Ray's start and the model loads included. Prints both times, the speed-up (goal:
1.6x or more) and whether both runs wrote the same rows (timings aside). Needs 2 free cores to mean much.
"""

import argparse
import tempfile
import time
from pathlib import Path

from kvbench.bridge.models import load_model
from kvbench.core.config import Config
from kvbench.harness.ray_sweep import RayExecutor
from kvbench.harness.runner import Plan, run_plan
from kvbench.store.results import ResultsStore

PRESSES = ("knorm", "snapkv", "tova", "streaming_llm")
TASKS = ("niah_single_1", "niah_single_2")
TIMINGS = ("prefill_s", "decode_s")
NOT_COMPARED = (*TIMINGS, "source")  # source: the folder a row was read from, a fresh one per run


def sweep(model, tokenizer, plan: Plan, workers: int, out: Path) -> tuple[float, list[dict]]:
    executor = RayExecutor(workers=workers, cpus=1)
    start = time.perf_counter()
    with ResultsStore(out) as store:
        frame = run_plan(model, tokenizer, plan, store, progress=False, executor=executor)
    seconds = time.perf_counter() - start
    frame = frame.drop(columns=[name for name in NOT_COMPARED if name in frame]).astype(object)
    rows = frame.where(frame.notna(), None).to_dict("records")  # NaN != NaN would make equal rows differ
    return seconds, sorted(rows, key=lambda row: (row["task"], row["sample_id"], row["config_id"]))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--samples", type=int, default=4, help="samples per task")
    parser.add_argument("--length", type=int, default=512, help="tokens per sample")
    parser.add_argument("--repeats", type=int, default=1, help="pairs of runs, alternating")
    args = parser.parse_args()

    model, tokenizer = load_model()  # here only to plan: the samples and the rows' model name
    configs = [Config("none", 0.0), *(Config(press, 0.5) for press in PRESSES)]
    plan = Plan(configs=configs, tasks=list(TASKS), length=args.length, samples=args.samples)
    print(
        f"{len(TASKS) * args.samples} samples x {len(configs)} configs, embedded model, {args.length} tokens"
    )
    times = {1: [], 2: []}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for workers in (1, 2):
                seconds, rows = sweep(model, tokenizer, plan, workers, Path(tmp) / f"{workers}-{repeat}")
                times[workers].append((seconds, rows))
                print(f"{workers} worker(s) x 1 thread: {seconds:.1f} s")
    one, two = (min(seconds for seconds, _ in times[n]) for n in (1, 2))
    same = all(rows == times[1][0][1] for runs in times.values() for _, rows in runs)
    print(f"speed-up of 2 workers: {one / two:.2f}x (fastest of {args.repeats}); rows identical: {same}")
    for _, rows in (run for runs in times.values() for run in runs):
        for mine, first in zip(rows, times[1][0][1], strict=True):
            for name in sorted(set(mine) | set(first)):
                if mine.get(name) != first.get(name):
                    where = f"{mine['task']} {mine['sample_id']} {mine['press']} {name}"
                    print(f"  differs: {where}: {mine.get(name)!r} vs {first.get(name)!r}")


if __name__ == "__main__":
    main()
