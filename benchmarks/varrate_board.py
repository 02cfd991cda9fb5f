"""VarRate's variants on the memory board (issue 28, item 3): each variant's score paired by sample with the
committed press it varies, at memory 0.5, mean difference and its 95 % t interval.

    uv run python benchmarks/varrate_board.py            # reads results/reference-memory

The rows come from the sweeps on docs/studies/varrate.md.
"""

import argparse
import json

import pandas as pd
from scipy.stats import t

from kvbench.store.results import load_rows

AGNOSTIC, AWARE = "query-agnostic", "query-aware"
# (label, (press, press_args, protocol) of the variant, the same of what it is set against)
PAIRS = [
    ("lowrank, pre-rope", ("lowrank", {"basis": "pre-rope"}, AGNOSTIC), ("lowrank", {}, AGNOSTIC)),
    ("varrate, pre-rope", ("varrate", {"basis": "pre-rope"}, AGNOSTIC), ("varrate", {}, AGNOSTIC)),
    ("varrate, min_rank=16", ("varrate", {"min_rank": 16}, AGNOSTIC), ("varrate", {}, AGNOSTIC)),
    ("varrate, share=head", ("varrate", {"share": "head"}, AGNOSTIC), ("varrate", {}, AGNOSTIC)),
    ("varrate, query-aware", ("varrate", {}, AWARE), ("varrate", {}, AGNOSTIC)),
    ("lowrank, query-aware", ("lowrank", {}, AWARE), ("lowrank", {}, AGNOSTIC)),
    (
        "varrate pre-rope vs lowrank pre-rope",
        ("varrate", {"basis": "pre-rope"}, AGNOSTIC),
        ("lowrank", {"basis": "pre-rope"}, AGNOSTIC),
    ),
]


def scores(rows: pd.DataFrame, press: str, args: dict, protocol: str) -> pd.Series:
    """One config's scores indexed by (task, sample_id)."""
    wanted = json.dumps(args, sort_keys=True)
    chosen = rows[(rows.press == press) & (rows.protocol == protocol) & (rows.args == wanted)]
    return chosen.drop_duplicates(["task", "sample_id"], keep="last").set_index(["task", "sample_id"]).score


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?", default="results/reference-memory")
    parser.add_argument("--memory", type=float, default=0.5)
    options = parser.parse_args()
    rows = load_rows(options.folder)
    rows = rows[rows.memory == options.memory]
    rows = rows.assign(
        args=rows.press_args.map(lambda a: json.dumps(a if isinstance(a, dict) else {}, sort_keys=True))
    )
    print("| variant | against | pairs | variant | against | difference [95 % t] |")
    print("|---|---|---|---|---|---|")
    for label, variant, against in PAIRS:
        a, b = scores(rows, *variant).align(scores(rows, *against), join="inner")
        if len(a) < 2:
            print(f"| {label} | | {len(a)} | | | not enough pairs |")
            continue
        d = a - b
        half = t.ppf(0.975, len(d) - 1) * d.std() / len(d) ** 0.5
        other = f"{against[0]}{', pre-rope' if against[1] else ''}, {against[2]}"
        print(
            f"| {label} | {other} | {len(d)} | {a.mean():.1f} | {b.mean():.1f} "
            f"| {d.mean():+.1f} [{d.mean() - half:+.1f}, {d.mean() + half:+.1f}] |"
        )


if __name__ == "__main__":
    main()
