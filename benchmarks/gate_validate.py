"""Gates' validation KL, soft and rounded, on the texts `kvbench gate train` validates on.

    uv run python benchmarks/gate_validate.py presses/gate/smollm2-135m /work/agents/gate-binarise

For each gates folder (made for the embedded model): the KL(p_full || p_gated) per position with the gates
soft, with them rounded (each head's top keep fraction of the text's entries at 1, the rest removed), the
mean gate and the softness 4 g (1 - g), on `--val-texts` texts of the card's source and length at the
validation seeds. The shipped gates' card predates the rounded KL; this measures it for any folder alike.
"""

import argparse
import sys
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--val-texts", default="4")
    args = parser.parse_args()
    from kvbench.bridge.models import EMBEDDED
    from kvbench.core.errors import KvbenchError
    from kvbench.core.validation import parse_int
    from kvbench.learned.common import check_made_for, read_card
    from kvbench.learned.gate.press import GatePress, load_gates

    try:  # bad input is one line and exit 2, before the model loads
        count = parse_int(args.val_texts, "--val-texts", 1)
        hint = GatePress.hint(EMBEDDED)
        for folder in args.folders:
            check_made_for(read_card(folder, GatePress.method, hint), EMBEDDED, folder, "gate weights", hint)
    except KvbenchError as error:
        print(f"gate_validate: {error}", file=sys.stderr)
        sys.exit(2)

    from kvbench.bridge.models import load_model, load_tokenizer
    from kvbench.cli.gate import token_ids
    from kvbench.learned.common import model_shape
    from kvbench.learned.gate.train import VAL_SEED, validate

    model, _ = load_model()
    shape, tokenizer = model_shape(model), load_tokenizer()
    print("| gates | keep | texts | soft KL | rounded KL | mean gate | softness |")
    print("|---|---|---|---|---|---|---|")
    for folder in args.folders:
        gates, card, digest = load_gates(folder, shape)
        keep, training = card["training"]["keep"], card["training"]
        texts = token_ids(tokenizer, training["source"], count, training["length"], VAL_SEED)
        result = validate(model, gates, texts, keep)
        print(
            f"| {folder} ({digest[:12]}) | {keep} | {count} x {training['length']} {training['source']} | "
            f"{result['kl']:.4f} | {result['rounded_kl']:.4f} | {result['mean_gate']:.3f} | "
            f"{result['softness']:.3f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
