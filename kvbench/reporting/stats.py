"""Statistics of a leaderboard: each config's mean and interval, and differences paired by sample
(every press minus the runner-up, or minus a chosen press).
"""

import pandas as pd

Z95 = 1.96  # 95 % confidence half-width = Z95 x standard error


def config_stats(rows: pd.DataFrame, key: str) -> pd.DataFrame:
    """Per (press, `key`) config: the average (mean over tasks of the per-task means, so every task weighs the
    same whatever its samples), its standard error (a mean of independent task means has variance
    sum(var_t / n_t) / tasks^2; NaN unless every task holds 2+ samples), its samples, and the means over its
    samples of the memory fraction, the kept-entry fraction and the bytes kept."""
    cells = rows.groupby(["press", key, "task"])["score"].agg(["mean", "count", "var"])
    task_means = cells["mean"].unstack("task")
    variance = (cells["var"] / cells["count"]).unstack("task")
    stderr = variance.sum(axis=1) ** 0.5 / variance.shape[1]
    configs = rows.groupby(["press", key])
    return pd.DataFrame(
        {
            "average": task_means.mean(axis=1),
            "stderr": stderr.where(variance.notna().all(axis=1)),
            "samples": configs.size(),
            "memory": configs["memory_ratio"].mean(),
            "kept_fraction": configs["kept_fraction"].mean(),
            "kept_bytes": configs["kept_bytes"].mean(),
        }
    )


def paired_difference(cell: pd.DataFrame, press: str, other: str) -> tuple[float, float, int]:
    """`press` minus `other` on the samples both scored in `cell` (the rows of one ratio or budget), paired
    by (task, sample): the mean over tasks of the per-task mean difference, its standard error (as
    `config_stats` computes them; NaN below 2 pairs in a task) and the number of pairs."""
    scores = [
        cell[cell["press"] == name].groupby(["task", "sample_id"])["score"].mean() for name in (press, other)
    ]
    difference = (scores[0] - scores[1]).dropna()
    if difference.empty:
        return float("nan"), float("nan"), 0
    per_task = difference.groupby(level="task").agg(["mean", "count", "var"])
    stderr = (per_task["var"] / per_task["count"]).sum() ** 0.5 / len(per_task)
    return (
        per_task["mean"].mean(),
        stderr if (per_task["count"] >= 2).all() else float("nan"),
        len(difference),
    )


def paired_lead(rows: pd.DataFrame, average: pd.DataFrame, key: str) -> pd.DataFrame:
    """Per column of `average` (a ratio or a memory budget): the best press, the runner-up, and the best's
    lead on the samples both scored (`paired_difference`). Pairing removes what the two presses share (how
    hard a sample is), so a lead can be told apart from noise where the two intervals of the leaderboard
    overlap."""
    leads = []
    for column in average.columns:
        ranked = average[column].dropna().sort_values(ascending=False)
        if len(ranked) < 2:
            continue
        best, runner_up = ranked.index[:2]
        lead, stderr, pairs = paired_difference(rows[rows[key] == column], best, runner_up)
        leads.append(
            {
                key: column,
                "best": best,
                "runner-up": runner_up,
                "lead": lead,
                "stderr": stderr,
                "pairs": pairs,
            }
        )
    return pd.DataFrame(leads, columns=[key, "best", "runner-up", "lead", "stderr", "pairs"])


def paired_versus(rows: pd.DataFrame, average: pd.DataFrame, key: str, baseline: str) -> pd.DataFrame:
    """Every other press's paired difference to `baseline` (`paired_difference`) at each column of
    `average` both were scored at: columns press, `key`, difference, stderr, pairs."""
    found = []
    for column in average.columns:
        if pd.isna(average[column].get(baseline)):
            continue
        cell = rows[rows[key] == column]
        for press in average[column].dropna().index.drop(baseline):
            difference, stderr, pairs = paired_difference(cell, press, baseline)
            found.append(
                {key: column, "press": press, "difference": difference, "stderr": stderr, "pairs": pairs}
            )
    return pd.DataFrame(found, columns=["press", key, "difference", "stderr", "pairs"])
