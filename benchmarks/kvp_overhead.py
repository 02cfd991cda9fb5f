"""KVP costs on the embedded model, for each agent architecture: prefill time with `kvp` vs `none`, and
training time for all heads.

    uv run python benchmarks/kvp_overhead.py [--archs compact,apple] [--agents DIR ...]
        [--lengths 1024,4096] [--repeats 5] [--data data/kvp/smollm2-135m] [--steps 10] [--skip-prefill]

Prefill: the model's whole prefill (no LM head) on random tokens, kvp at ratio 0.5 with each architecture's
agents vs no press, fastest of interleaved repeats (all configs measured side by side in one loop); knorm at
0.5 alongside, for the top-k and gather that every scorer press costs; and each architecture's scoring alone
(all 90 heads, on that prefill's cache), which is what kvp adds beyond them. Goal: < 2 % of the prefill.
The agents of an architecture are those of the --agents folder whose card names it, else the shipped
agents if they are of that architecture, else random-init agents of the model's shape (scoring time does not
depend on the weights' values; apple's position table then has 2048 rows).
Training (--data): seconds per step for all heads from stored data, wall and CPU, as the difference between
runs of N and 2N steps divided by N, so the fixed costs (feature statistics, one validation) cancel; plus
one validation pass. Goal: the default step count in < 30 min.
"""

import argparse
import dataclasses
import tempfile
import time
from pathlib import Path

import torch
from transformers import DynamicCache

from kvbench.bridge.models import load_model
from kvbench.learned.kvp.agent import ARCHS, build_agents
from kvbench.learned.kvp.checkpoint import (
    card_arch,
    default_agents_dir,
    load_agents,
    load_card,
    model_shape,
    save_agents,
)
from kvbench.learned.kvp.press import KVPPress
from kvbench.learned.kvp.train import KVPData, TrainConfig, train, validation_reward
from kvbench.presses import build_press


def timed(function, *args) -> tuple[float, float]:
    """(wall, CPU) seconds of one call. On a machine shared with other jobs the CPU time is the steadier
    measure: waiting for a core adds wall time only."""
    wall, cpu = time.perf_counter(), time.process_time()
    function(*args)
    return time.perf_counter() - wall, time.process_time() - cpu


def prefill(model, input_ids, press=None) -> DynamicCache:
    cache = DynamicCache()
    with torch.no_grad():
        if press is None:
            model.model(input_ids=input_ids, past_key_values=cache)
        else:
            with press(model):
                model.model(input_ids=input_ids, past_key_values=cache)
    return cache


@torch.no_grad()
def score_all_layers(agents, cache: DynamicCache) -> None:
    num_kv_heads = cache.layers[0].keys.shape[1]
    for layer in range(len(cache.layers)):
        heads = slice(layer * num_kv_heads, (layer + 1) * num_kv_heads)
        agents(cache.layers[layer].keys, cache.layers[layer].values, heads=heads)


def agents_folders(model, archs: list[str], given: list[str], scratch: Path) -> dict[str, Path]:
    """arch -> a folder of agents of that arch for `model`: given, shipped, or random-init (see above)."""
    folders = {card_arch(load_card(Path(folder))): Path(folder) for folder in given}
    shipped = default_agents_dir(model_shape(model).name)
    if (shipped / "card.json").is_file():
        folders.setdefault(card_arch(load_card(shipped)), shipped)
    shape = model_shape(model)
    for arch in archs:
        if arch not in folders:
            options = {"positions": 2048} if arch == "apple" else {}
            agents = build_agents(arch, shape.num_heads, shape.head_dim, **options)
            card = {"model": dataclasses.asdict(shape), "heads": list(range(shape.num_heads))}
            save_agents(scratch / arch, agents, card)
            folders[arch] = scratch / arch
            print(f"{arch}: random-init agents (timing only)")
        else:
            print(f"{arch}: agents of {folders[arch]}")
    return {arch: folders[arch] for arch in archs}


def benchmark_prefill(model, folders: dict[str, Path], lengths: list[int], repeats: int) -> None:
    presses = {
        f"kvp-{arch}": KVPPress(compression_ratio=0.5, agents=str(folder)) for arch, folder in folders.items()
    }
    for press in presses.values():
        press.post_init_from_model(model)  # load the agents outside the timings
    presses["knorm"] = build_press("knorm", 0.5)
    # Other processes on a shared machine only ever add time: the fastest of the repeats is the cleanest.
    print(f"prefill seconds, fastest of {repeats} interleaved repeats; overhead vs no press")
    scorers = [name for name in presses if name != "knorm"]
    header = f"{'tokens':>7} {'clock':>5} {'none s':>8} " + " ".join(f"{name:>18}" for name in presses)
    print(header + " " + " ".join(f"{'scoring ' + name[4:]:>20}" for name in scorers))
    for length in lengths:
        input_ids = torch.randint(100, model.config.vocab_size, (1, length))
        prefill(model, input_ids)  # warm-up
        times = {name: [] for name in ["none", *presses]}
        for _ in range(repeats):
            times["none"].append(timed(prefill, model, input_ids))
            for name, press in presses.items():
                times[name].append(timed(prefill, model, input_ids, press))
        cache = prefill(model, input_ids)
        scoring = {
            f"scoring {name}": [timed(score_all_layers, presses[name].loaded, cache) for _ in range(repeats)]
            for name in scorers
        }
        for clock, index in (("wall", 0), ("CPU", 1)):
            fastest = {name: min(t[index] for t in runs) for name, runs in {**times, **scoring}.items()}
            none = fastest["none"]
            cells = [f"{fastest[n]:8.3f} {100 * (fastest[n] / none - 1):+7.1f}%" for n in presses]
            scoring_cells = [f"{fastest[n]:9.4f} {100 * fastest[n] / none:8.2f}%" for n in scoring]
            print(
                f"{length:7d} {clock:>5} {none:8.3f} "
                + " ".join(f"{cell:>18}" for cell in cells)
                + " "
                + " ".join(f"{cell:>20}" for cell in scoring_cells)
            )


def benchmark_training(data_dir: str, archs: list[str], steps: int, scratch: Path) -> None:
    data = KVPData(data_dir)
    print(f"training all heads, {len(data.train)} train prompts, {torch.get_num_threads()} thread(s)")
    for arch in archs:
        costs = []
        for n in (steps, 2 * steps):
            config = TrainConfig(steps=n, warmup=1, eval_every=n, arch=arch)
            wall, cpu = time.perf_counter(), time.process_time()
            train(data_dir, scratch / f"trained-{arch}", config, log=lambda line: None)
            costs.append((time.perf_counter() - wall, time.process_time() - cpu))
        wall, cpu = ((costs[1][i] - costs[0][i]) / steps for i in (0, 1))
        agents, _ = load_agents(scratch / f"trained-{arch}")
        val = [data.load(shard, list(range(data.shape.num_heads))) for shard in data.val]
        started = time.process_time()
        validation_reward(agents, val)
        validation = time.process_time() - started
        default_steps = TrainConfig().steps
        print(
            f"{arch:>8}: {wall:.3f} s/step wall, {cpu:.3f} s/step CPU -> {default_steps} steps in "
            f"{cpu * default_steps / 60:.1f} min CPU; "
            f"a validation pass ({len(val)} prompts) {validation:.1f} s CPU"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--archs", default=",".join(ARCHS))
    parser.add_argument("--agents", action="append", default=[], help="agents folder (repeatable)")
    parser.add_argument("--lengths", default="1024,4096")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--data", help="datagen folder; times training when given")
    parser.add_argument("--steps", type=int, default=10, help="N of the N and 2N-step training runs")
    parser.add_argument("--skip-prefill", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    archs = args.archs.split(",")
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        if not args.skip_prefill:
            model, _ = load_model()
            folders = agents_folders(model, archs, args.agents, scratch)
            benchmark_prefill(model, folders, [int(n) for n in args.lengths.split(",")], args.repeats)
        if args.data:
            benchmark_training(args.data, archs, args.steps, scratch)


if __name__ == "__main__":
    main()
