"""How far two results folders agree, row by row: the same config on the same sample, e.g. run on CPU and
on a GPU, or before and after a change.

    uv run python benchmarks/compare_rows.py results/reference-cuda results/reference
    uv run python benchmarks/compare_rows.py \
        results/reference-qevict-sampled results/reference-memory --by-budget

--by-budget pairs rows of the same press, budget and protocol whatever their press arguments (one setting
of a press against another: QEvict's sampled queries against every query), per press and budget, with the
mean score difference a - b and its 95 % t interval over the pairs.

Rows pair by (config_id, task, sample_id); a row whose sample text differs (content_hash, where both
rows record it) is not a pair.
Per press: the pairs, the share with the same entries kept, the same answer and the same score, and each
side's mean score. Float rounding differs between devices, so ties in a press's scores may break the other
way and change an answer; `random` draws from the device's own generator and keeps other entries.
"""

import argparse

import pandas as pd

from kvbench.store.results import load_rows

KEY = ["config_id", "task", "sample_id"]
BUDGET_KEY = ["press", "ratio", "memory", "protocol", "task", "sample_id"]


def paired_rows(first: str, second: str, key: list[str] = KEY) -> pd.DataFrame:
    def rows(folder: str) -> pd.DataFrame:
        return load_rows(folder).drop_duplicates(key, keep="last")

    pairs = rows(first).merge(rows(second), on=key, suffixes=("_a", "_b"))
    if "press" in key:
        pairs = pairs.assign(press_a=pairs.press, press_b=pairs.press)
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


def budget_differences(pairs: pd.DataFrame) -> pd.DataFrame:
    """Per (press, memory, ratio): pairs, each side's mean score, a - b and its 95 % t interval."""
    from scipy.stats import t

    def summary(group: pd.DataFrame) -> pd.Series:
        difference = group.score_a - group.score_b
        count, mean = len(difference), difference.mean()
        half = t.ppf(0.975, count - 1) * difference.std() / count**0.5 if count > 1 else float("nan")
        return pd.Series(
            {
                "pairs": count,
                "score_a": group.score_a.mean(),
                "score_b": group.score_b.mean(),
                "a_minus_b": mean,
                "low": mean - half,
                "high": mean + half,
                "same_answer": 100 * group.same_answer.mean(),
            }
        )

    keys = ["press", "memory", "ratio"]
    table = pairs.groupby(keys, dropna=False)[pairs.columns.difference(keys)].apply(summary)
    assert isinstance(table, pd.DataFrame)  # summary returns a Series per group: apply stacks them as rows
    return table


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("a", help="a results folder")
    parser.add_argument("b", help="another results folder")
    parser.add_argument("--by-budget", action="store_true", help="pair whatever the press arguments")
    args = parser.parse_args()
    pairs = paired_rows(args.a, args.b, BUDGET_KEY if args.by_budget else KEY)
    if pairs.empty:
        raise SystemExit("no row of one folder has a pair in the other (same config, task, sample and text)")
    if args.by_budget:
        print(f"a = {args.a}, b = {args.b}: {len(pairs)} pairs, a - b with its 95 % t interval")
        print(budget_differences(pairs).round(1).to_string())
        return
    table = agreement(pairs)
    shares = ["same_kept", "same_answer", "same_score"]
    print(f"a = {args.a}, b = {args.b}: {len(pairs)} pairs")
    print(table.assign(**{c: (100 * table[c]).round(1) for c in shares}).round(1).to_string())
    overall = {c: 100 * pairs[c].mean() for c in shares}
    print("all pairs: " + ", ".join(f"{c.replace('_', ' ')} {v:.1f} %" for c, v in overall.items()))


if __name__ == "__main__":
    main()
