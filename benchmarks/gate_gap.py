"""The soft-to-hard gap of the gate press (and of KVP), beside post-hoc evictors, under live-cache perplexity.

    uv run python benchmarks/gate_gap.py --out results/gate-gap [--texts 2] [--length 512] [--keep 0.5]

On held-out text (the Python reference prose, `--source prose`, seeds 0..; the shipped gates trained on the
standard library's source): perplexity

- ungated (the full cache);
- **soft**: teacher-forced once over the whole text with the gates soft (log g_j on every later query's
  logits, gates.soft_gates), no entry removed: what training optimises;
- **hard**: `kvbench perplexity` at ratio 1 - keep (the live-cache protocol, cache compressed back to its
  budget every `--every` tokens) for gate, kvp, h2o, keydiff, streaming_llm, tova and knorm.

KVP has no soft form of its own (its agents rank; they are not trained through attention). Its soft
counterpart here, our choice: g_j = sigmoid((s_j - t) / sd), with s the agents' score of entry j over the
whole text, t the head's (1 - keep) quantile of s and sd its standard deviation, per layer and KV head: the
entries KVP would keep have g > 1/2, and the mean gate is near the keep fraction. Writes
OUT/soft.json (soft and ungated NLL per text) and the hard rows to OUT/rows.jsonl; prints the table.
"""

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

HARD_PRESSES = "gate,kvp,h2o,keydiff,streaming_llm,tova,knorm"


class KVPSoftGates:
    """KVP's agents' scores as soft gates (see the module docstring)."""

    def __init__(self, agents, keep: float):
        self.agents, self.keep, self.means = agents, keep, []

    def log_gates(self, layer, keys, values):
        heads = keys.shape[1]
        scores = self.agents(keys, values, heads=slice(layer * heads, (layer + 1) * heads)).float()
        threshold = scores.quantile(1 - self.keep, dim=-1, keepdim=True)
        spread = scores.std(dim=-1, keepdim=True).clamp_min(1e-6)
        log_g = F.logsigmoid((scores - threshold) / spread)
        self.means.append(float(log_g.exp().mean()))
        return log_g.to(keys.dtype)


def soft_rows(keep: float, texts: int, length: int, seed: int) -> dict:
    from kvbench.bridge.models import load_model, load_tokenizer
    from kvbench.harness.perplexity import generated_texts
    from kvbench.learned.common import model_shape, shipped_state_dir
    from kvbench.learned.gate.press import load_gates
    from kvbench.learned.gate.train import GateTap, soft_nll
    from kvbench.learned.kvp.press import cached_agents

    model, _ = load_model()
    shape = model_shape(model)
    gates, card, digest = load_gates(shipped_state_dir("gate", shape.name), shape)
    from kvbench.learned.kvp.checkpoint import CARD_FILE, default_agents_dir

    directory = default_agents_dir(shape.name)
    modified = (directory / CARD_FILE).stat().st_mtime_ns
    agents, _, _ = cached_agents(directory.resolve(), modified, model.device)
    rows = []
    for text in generated_texts(load_tokenizer(), "prose", texts, length, seed):
        ids = torch.tensor([text.ids])
        tap, kvp = GateTap(gates), KVPSoftGates(agents, keep)
        rows.append(
            {
                "text": text.id,
                "none": soft_nll(model, None, ids),
                "gate": soft_nll(model, tap, ids),
                "gate_mean": float(torch.stack(tap.seen).mean()),
                "kvp": soft_nll(model, kvp, ids),
                "kvp_mean": sum(kvp.means) / len(kvp.means),
            }
        )
        print(rows[-1], flush=True)
    return {"gates": digest, "gates_keep": card["training"]["keep"], "keep": keep, "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--keep", type=float, default=0.5)
    parser.add_argument("--texts", type=int, default=2)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--every", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--presses", default=HARD_PRESSES)
    parser.add_argument("--skip-hard", action="store_true")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    soft_path = args.out / "soft.json"
    if not soft_path.is_file():
        soft = soft_rows(args.keep, args.texts, args.length, args.seed)
        soft_path.write_text(json.dumps(soft, indent=1) + "\n")
    soft = json.loads(soft_path.read_text())
    if not args.skip_hard:
        command = ["kvbench", "perplexity", "--presses", args.presses, "--ratios", str(1 - args.keep)]
        command += ["--source", "prose", "--texts", str(args.texts), "--length", str(args.length)]
        command += ["--every", str(args.every), "--seed", str(args.seed), "--out", str(args.out)]
        print(" ".join(command), flush=True)
        subprocess.run(command, check=True)
    from kvbench.store.results import load_rows

    frame = load_rows([args.out / "rows.jsonl"])
    frame = frame[frame["length"] == args.length]
    hard = frame.groupby("press")["nll"].mean()
    per_text = frame.pivot_table(index="press", columns="sample_id", values="nll")
    rows = soft["rows"]
    mean = {name: sum(row[name] for row in rows) / len(rows) for name in ("none", "gate", "kvp")}

    def texts(name: str) -> str:
        """Per text (soft.json's order): hard perplexity, and soft after a slash where the press has one."""
        cells = [f"{math.exp(per_text.loc[name, row['text']]):.1f}" for row in rows]
        if name in mean and name != "none":
            cells = [f"{cell}/{math.exp(row[name]):.1f}" for cell, row in zip(cells, rows, strict=True)]
        return " ".join(cells)

    print(f"| press | soft ppl | hard ppl (ratio {1 - args.keep:g}) | hard / soft | per text: hard[/soft] |")
    print("|---|---|---|---|---|")
    print(f"| none | {math.exp(mean['none']):.2f} | {math.exp(hard['none']):.2f} | | {texts('none')} |")
    for name in args.presses.split(","):
        soft_ppl = f"{math.exp(mean[name]):.2f}" if name in mean else "-"
        ratio = f"{math.exp(hard[name] - mean[name]):.3f}" if name in mean else ""
        print(f"| {name} | {soft_ppl} | {math.exp(hard[name]):.2f} | {ratio} | {texts(name)} |")
    sys.stdout.flush()
    plot(args.out / "gap.png", mean, hard, args.presses.split(","), 1 - args.keep)


def plot(path: Path, soft: dict, hard, presses: list[str], ratio: float) -> None:
    """Bars: perplexity per press, hard (live cache at the ratio) beside soft where the press has one."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 3.5))
    places = range(len(presses))
    axes.bar(
        [p - 0.2 for p in places], [math.exp(hard[n]) for n in presses], 0.4, label=f"hard, ratio {ratio:g}"
    )
    axes.bar(
        [p + 0.2 for p, n in zip(places, presses, strict=True) if n in soft],
        [math.exp(soft[n]) for n in presses if n in soft],
        0.4,
        label="soft gates",
    )
    axes.axhline(math.exp(hard["none"]), color="black", linewidth=1, label="full cache")
    axes.set_xticks(list(places), presses)
    axes.set_ylabel("perplexity (held-out prose)")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
