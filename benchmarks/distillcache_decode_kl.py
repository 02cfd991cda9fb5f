"""DistillCache policies side by side on the per-step trainer's own validation: mean KL(p_full || p_evict) per
continuation step on a data store's validation prompts, under the decode-time replay (compressed every
`--interval` steps; kvbench/learned/distillcache/per_step.py), with knorm, snapkv and random beside them.

    uv run python benchmarks/distillcache_decode_kl.py --data data/dc-ruler5 \
        presses/distillcache/smollm2-135m agents/dc-per-step

The shipped policy was chosen on the prefill-only validation, the per-step one on this replay: this puts
both on the replay, the development number of docs/studies/distillcache-per-step.md.
"""

import argparse
import sys
from pathlib import Path

from kvbench.bridge.models import load_model
from kvbench.core.errors import KvbenchError
from kvbench.core.validation import parse_float, parse_int
from kvbench.learned.distillcache.press import load_policy
from kvbench.learned.distillcache.train import DistillData, decoding_references, mean_kl, validate_decoding


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("policies", nargs="+", help="policy folders")
    parser.add_argument("--data", required=True, help="datagen folder (its validation prompts)")
    parser.add_argument("--interval", default="8")
    parser.add_argument("--ratios", default="0.5,0.75,0.9")
    args = parser.parse_args()
    try:  # bad input is one line and exit 2, before the model loads
        interval = parse_int(args.interval, "--interval", 1)
        ratios = [
            parse_float(r, "a ratio", 0, 1, low_open=True, high_open=True) for r in args.ratios.split(",")
        ]
        data = DistillData(Path(args.data))
        policies = {folder: load_policy(Path(folder), data.shape)[0] for folder in args.policies}
    except KvbenchError as error:
        print(f"distillcache_decode_kl: {error}", file=sys.stderr)
        sys.exit(2)
    model = load_model(data.shape.name)[0]
    scorers = decoding_references(seed=0)
    for folder, policy in policies.items():
        scorers[folder] = lambda features, layer, policy=policy: policy(features, layer)
    table = validate_decoding(model, data, scorers, ratios, interval)
    print(f"{len(data.val)} validation prompts, compressed every {interval} steps")
    print("| scorer | " + " | ".join(f"ratio {r}" for r in ratios) + " | mean |")
    print("|---|" + "---|" * (len(ratios) + 1))
    for name, kls in table.items():
        print(f"| {name} | " + " | ".join(f"{kls[str(r)]:.3f}" for r in ratios) + f" | {mean_kl(kls):.3f} |")


if __name__ == "__main__":
    main()
