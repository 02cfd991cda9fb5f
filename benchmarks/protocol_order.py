"""Whether the presses keep their order from one protocol to another (docs/studies/decode-heavy.md's rule).

    uv run python benchmarks/protocol_order.py results/reference-decode-heavy
    uv run python benchmarks/protocol_order.py RESULTS --protocols decode-time,query-agnostic

Per ratio and protocol: each press's mean score, and the pairs shown apart (a mean difference with an exact
sign-flip p <= 0.05 over the paired samples, `kvbench.reporting.stats.sign_flip_p`). A pair *swaps* when it
is shown apart one way under the first protocol and the other way under the second. Kendall's tau between
the two orders of means describes them; it is not a test. Then what the first protocol costs each press
against the second (paired, same samples).
"""

import argparse
import itertools
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import kendalltau

from kvbench.core.errors import KvbenchError
from kvbench.reporting.stats import sign_flip_p
from kvbench.store.results import load_rows

ALPHA = 0.05


def scores_by_sample(rows: pd.DataFrame) -> pd.DataFrame:
    """(ratio, protocol, press) x sample: the score of each sample under each setting."""
    return rows.pivot_table(
        index=["ratio", "protocol", "press"], columns=["task", "sample_id"], values="score", aggfunc="mean"
    )


def shown_apart(first: pd.Series, second: pd.Series) -> tuple[float, float]:
    """(mean of first - second over the samples both scored, its sign-flip p)."""
    difference = (first - second).dropna().to_numpy()
    return float(difference.mean()), sign_flip_p(difference, np.full(len(difference), 1 / len(difference)))


def order_table(table: pd.DataFrame, ratio: float, protocols: list[str]) -> tuple[list[str], list[str]]:
    """Lines: the means per press under each protocol, the pairs shown apart, the swaps, Kendall's tau."""
    lines, swaps = [], []
    presses = sorted(set.intersection(*(set(table.loc[(ratio, p)].index) for p in protocols)) - {"none"})
    means = {p: table.loc[(ratio, p)].mean(axis=1).reindex(presses) for p in protocols}
    lines.append(
        f"ratio {ratio}: "
        + "; ".join(
            f"{p}: "
            + ", ".join(
                f"{press} {means[p][press]:.1f}" for press in means[p].sort_values(ascending=False).index
            )
            for p in protocols
        )
    )
    apart = {}
    for protocol in protocols:
        for a, b in itertools.combinations(presses, 2):
            mean, p = shown_apart(table.loc[(ratio, protocol, a)], table.loc[(ratio, protocol, b)])
            if p <= ALPHA:
                apart[(protocol, a, b)] = np.sign(mean)
                winner, loser = (a, b) if mean > 0 else (b, a)
                lines.append(f"  {protocol}: {winner} above {loser} by {abs(mean):.1f} (p = {p:.3f})")
    for a, b in itertools.combinations(presses, 2):
        signs = [apart.get((protocol, a, b)) for protocol in protocols]
        if None not in signs and signs[0] != signs[1]:
            swaps.append(f"ratio {ratio}: {a} / {b}")
    tau = kendalltau(means[protocols[0]], means[protocols[1]]).statistic
    lines.append(f"  Kendall's tau of the two orders: {tau:+.2f}; swaps shown: {len(swaps)}")
    return lines, swaps


def protocol_cost(table: pd.DataFrame, protocols: list[str]) -> list[str]:
    """Per press and ratio: the first protocol's score minus the second's on the same samples."""
    lines = []
    for ratio in sorted(set(table.index.get_level_values("ratio"))):
        for press in sorted(
            set.intersection(*(set(table.loc[(ratio, p)].index) for p in protocols)) - {"none"}
        ):
            mean, p = shown_apart(
                table.loc[(ratio, protocols[0], press)], table.loc[(ratio, protocols[1], press)]
            )
            lines.append(
                f"  ratio {ratio} {press}: {protocols[0]} - {protocols[1]} = {mean:+.1f} (p = {p:.3f})"
            )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("results")
    parser.add_argument("--protocols", default="decode-time,query-agnostic")
    args = parser.parse_args()
    protocols = args.protocols.split(",")
    if len(protocols) != 2 or len(set(protocols)) != 2:
        parser.error(
            f"--protocols takes two protocols, e.g. decode-time,query-agnostic, got {args.protocols!r}"
        )
    if not Path(args.results).is_dir():
        parser.error(f"{args.results} is not a results folder")
    try:
        rows = load_rows(args.results)
    except KvbenchError as error:
        parser.error(str(error))
    missing = [protocol for protocol in protocols if protocol not in set(rows.get("protocol", ()))]
    if missing:
        parser.error(f"{args.results} holds no rows of {', '.join(missing)}")
    rows = rows[rows["protocol"].isin(protocols)]
    none = rows[rows["press"] == "none"].groupby("protocol")["score"].agg(["mean", "count"])
    print("uncompressed:", ", ".join(f"{p} {r['mean']:.1f} (n={r['count']})" for p, r in none.iterrows()))
    table = scores_by_sample(rows[rows["press"] != "none"])
    all_swaps = []
    for ratio in sorted(set(table.index.get_level_values("ratio"))):
        lines, swaps = order_table(table, ratio, protocols)
        print("\n".join(lines))
        all_swaps += swaps
    print("swaps shown:", ", ".join(all_swaps) or "none")
    print(f"cost of {protocols[0]} against {protocols[1]}")
    print("\n".join(protocol_cost(table, protocols)))


if __name__ == "__main__":
    main()
