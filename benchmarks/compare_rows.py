"""How far two results folders agree, row by row: the same config on the same sample, e.g. run on CPU and
on a GPU, or before and after a change.

    uv run python benchmarks/compare_rows.py results/reference-cuda results/reference

Rows pair by (config_id, task, sample_id); a row whose sample text differs (content_hash, where both
rows record it) is not a pair.
Per press: the pairs, the share with the same entries kept, the same answer and the same score, and each
side's mean score. Float rounding differs between devices, so ties in a press's scores may break the other
way and change an answer; `random` draws from the device's own generator and keeps other entries.
"""

import argparse

import pandas as pd

from kvbench.results import load_rows

KEY = ["config_id", "task", "sample_id"]


def paired_rows(first: str, second: str) -> pd.DataFrame:
    def rows(folder: str) -> pd.DataFrame:
        return load_rows(folder).drop_duplicates(KEY, keep="last")

    pairs = rows(first).merge(rows(second), on=KEY, suffixes=("_a", "_b"))
    # Rows written before kvbench recorded content_hash pair on their ids alone.
    unknown = pairs.content_hash_a.isna() | pairs.content_hash_b.isna()
    pairs = pairs[unknown | (pairs.content_hash_a == pairs.content_hash_b)]
    return pairs.assign(
        same_kept=pairs.kv_kept_a == pairs.kv_kept_b,
        same_answer=pairs.prediction_a == pairs.prediction_b,
        same_score=pairs.score_a == pairs.score_b,
    )


def agreement(pairs: pd.DataFrame) -> pd.DataFrame:
    table = pairs.groupby("press_a").agg(
        pairs=("same_kept", "size"),
        same_kept=("same_kept", "mean"),
        same_answer=("same_answer", "mean"),
        same_score=("same_score", "mean"),
        score_a=("score_a", "mean"),
        score_b=("score_b", "mean"),
    )
    table.index.name = "press"
    return table


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("a", help="a results folder")
    parser.add_argument("b", help="another results folder")
    args = parser.parse_args()
    pairs = paired_rows(args.a, args.b)
    if pairs.empty:
        raise SystemExit("no row of one folder has a pair in the other (same config, task, sample and text)")
    table = agreement(pairs)
    shares = ["same_kept", "same_answer", "same_score"]
    print(f"a = {args.a}, b = {args.b}: {len(pairs)} pairs")
    print(table.assign(**{c: (100 * table[c]).round(1) for c in shares}).round(1).to_string())
    overall = {c: 100 * pairs[c].mean() for c in shares}
    print("all pairs: " + ", ".join(f"{c.replace('_', ' ')} {v:.1f} %" for c, v in overall.items()))


if __name__ == "__main__":
    main()
