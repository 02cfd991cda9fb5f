"""How much QEvict's recovery acts when a protocol lets it: entries promoted (int4 -> 16-bit) and demoted
(16-bit -> int4) by its later compressions, counted on the sweep's own presses.

    uv run python benchmarks/qevict_retiering.py [--protocol decode-time] [--tasks cwe,niah_multivalue]
        [--samples 2] [--length 1024] [--memory 0.5,0.25] [--interval 8] [--turns 4]

Embedded model. Each sample is answered by the engine (`evaluate_sample`, as `kvbench sweep` does) under the
protocol, QEvict at each memory budget; the presses the engine builds are kept, and their `retiered` counts
read after the answer. Prints, per memory budget, the mean over samples of the entries promoted and demoted
(summed over layers and KV heads) beside the entries the cache holds (kv_kept: after the prefill's
compression; multi-turn: when the last turn is asked), and the score.
Under the query-agnostic protocol both counts are 0 by construction: QEvict compresses once.
"""

import argparse
from unittest.mock import patch

from kvbench.bridge.models import load_model
from kvbench.core.config import Config
from kvbench.engine import evaluate as engine
from kvbench.harness.planning import configs_for_run
from kvbench.presses.qevict import QEvictPress
from kvbench.tasks import load_combined_samples, load_samples, score_sample


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--protocol", default="decode-time", choices=["decode-time", "multi-turn"])
    parser.add_argument("--tasks", default="cwe,niah_multivalue", help="comma-separated task names")
    parser.add_argument("--samples", type=int, default=2, help="samples (contexts) per task")
    parser.add_argument("--length", type=int, default=1024, help="tokens per context")
    parser.add_argument("--memory", default="0.5,0.25", help="comma-separated memory budgets")
    parser.add_argument("--interval", type=int, default=8, help="decode-time: steps between compressions")
    parser.add_argument("--turns", type=int, default=4, help="multi-turn: turns per context")
    args = parser.parse_args()

    model, tokenizer = load_model()
    tasks = args.tasks.split(",")
    if args.protocol == "multi-turn":
        samples = load_combined_samples(
            tasks,
            length=args.length,
            samples=args.samples,
            questions=args.turns,
            seed=0,
            tokenizer=tokenizer,
        )
        options = {"turns": args.turns}
    else:
        samples = [
            s
            for task in tasks
            for s in load_samples(task, length=args.length, samples=args.samples, seed=0, tokenizer=tokenizer)
        ]
        options = {"interval": args.interval}
    configs = [
        config
        for memory in args.memory.split(",")
        for config in configs_for_run("qevict", memory=memory, protocol=args.protocol, **options)
    ]
    built = []
    make = engine.config_press

    def keep_press(config: Config):  # the engine's own presses, to read their counts afterwards
        press = make(config)
        built.append(press)
        return press

    totals = {
        config.memory: {"promoted": 0, "demoted": 0, "kept": 0, "score": 0.0, "rows": 0} for config in configs
    }
    for sample in samples:
        built.clear()
        with patch.object(engine, "config_press", keep_press):
            results = engine.evaluate_sample(model, tokenizer, sample, configs, batch_configs=len(configs))
        asked = sample.questions() if args.protocol == "multi-turn" else [sample]
        per_config = len(asked)
        for index, (config, press) in enumerate(zip(configs, built, strict=True)):
            assert isinstance(press, QEvictPress)
            total = totals[config.memory]
            total["promoted"] += press.retiered["promoted"]
            total["demoted"] += press.retiered["demoted"]
            rows = results[index * per_config : (index + 1) * per_config]
            total["kept"] += rows[-1]["kv_kept"]
            total["score"] += sum(
                score_sample(part, row["prediction"]) for part, row in zip(asked, rows, strict=True)
            )
            total["rows"] += per_config
    print(f"{args.protocol}, {len(samples)} contexts of {args.tasks} at {args.length} tokens")
    print("memory | promoted / context | demoted / context | entries held | score")
    for memory, total in totals.items():
        n, score = len(samples), total["score"] / total["rows"]
        promoted, demoted, kept = (total[key] / n for key in ("promoted", "demoted", "kept"))
        print(f"{memory:g} | {promoted:.0f} | {demoted:.0f} | {kept:.0f} | {score:.1f}")


if __name__ == "__main__":
    main()
