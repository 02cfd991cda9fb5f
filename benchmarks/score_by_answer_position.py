"""Where in the context a press loses the answer: mean score by the answer's position in the context.

    uv run python benchmarks/score_by_answer_position.py results/reference-confirm \
        [--presses kvp,streaming_llm] [--ratios 0.75,0.9] [--bins 5]

For every row of the chosen presses (named as the leaderboard names them: `kvp` is kvp with its default
arguments, `kvp(agents=DIR)` kvp with those agents) and ratios, the sample is generated again
from the row's task, length and seed (samples are deterministic), and the answer's position is where its
reference first appears in the context, as a fraction of the context's characters. Scores are averaged per
press, ratio and position bin (0 = the context's start), with the number of samples in each. For generated
tasks only (each reference appears verbatim in its context); the default model's tokenizer sizes them.
"""

import argparse
import itertools

import pandas as pd

from kvbench.bridge.models import load_tokenizer
from kvbench.reporting.read import config_label, split_press_labels
from kvbench.store.results import load_rows
from kvbench.tasks import load_samples


def answer_positions(rows: pd.DataFrame) -> pd.Series:
    """(task, length, seed, sample_id) -> where the reference starts in the context, in [0, 1)."""
    tokenizer, positions = load_tokenizer(), {}
    for task, length, seed in rows[["task", "length", "seed"]].drop_duplicates().itertuples(index=False):
        ids = rows.sample_id[(rows.task == task) & (rows.length == length) & (rows.seed == seed)]
        count = 1 + max(int(sample_id.rsplit("-", 1)[1]) for sample_id in ids)
        for sample in load_samples(task, length=length, samples=count, seed=seed, tokenizer=tokenizer):
            positions[(task, length, seed, sample.id)] = sample.context.find(sample.references[0]) / len(
                sample.context
            )
    return pd.Series(positions, name="position")


def score_by_position(rows: pd.DataFrame, bins: int) -> pd.DataFrame:
    positions = answer_positions(rows)
    keys = list(zip(rows.task, rows.length, rows.seed, rows.sample_id, strict=True))
    rows = rows.assign(position=[positions[key] for key in keys])
    edges = [k / bins for k in range(bins + 1)]
    labels = [f"{low:.1f}-{high:.1f}" for low, high in itertools.pairwise(edges)]
    rows = rows.assign(where=pd.cut(rows.position, edges, labels=labels, include_lowest=True))
    table = rows.groupby(["press", "ratio", "where"], observed=True).score.agg(["mean", "size"])
    cells = table["mean"].round(1).astype(str) + " (n=" + table["size"].astype(str) + ")"
    return cells.unstack("where")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("results")
    parser.add_argument("--presses", default="kvp,streaming_llm")
    parser.add_argument("--ratios", default="0.75,0.9")
    parser.add_argument("--bins", type=int, default=5)
    args = parser.parse_args()
    rows = load_rows(args.results).drop_duplicates(["config_id", "task", "sample_id"], keep="last")
    labels = [
        config_label(press, press_args) for press, press_args in zip(rows.press, rows.press_args, strict=True)
    ]
    rows = rows.assign(press=labels)
    rows = rows[
        rows.press.isin(split_press_labels(args.presses))
        & rows.ratio.isin([float(r) for r in args.ratios.split(",")])
    ]
    with pd.option_context("display.width", 200, "display.max_columns", None):
        print(score_by_position(rows, args.bins))


if __name__ == "__main__":
    main()
