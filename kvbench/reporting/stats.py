"""Statistics of a leaderboard: each config's mean and 95 % interval, and differences paired by sample (every
press minus the runner-up, or minus a chosen press).

The choices, each made for small samples (a sweep of 2 samples a task is common):

- A config's average is the mean over tasks of its per-task means, so every task weighs the same whatever
  its samples. Its interval is Student's t with Welch-Satterthwaite degrees of freedom: the tasks are
  independent strata, each of variance var_t / n_t, and the degrees of freedom follow from how the
  variance splits among them (n - 1 for a single task). At n = 2 the t quantile is 12.7, not 1.96: a
  normal approximation there claims ten times the confidence the samples hold. Undefined (no interval)
  where a task holds fewer than 2 samples.
- Where every score of a config is 0 or 100 (a pass/fail task), Wilson's score interval of the pass rate
  instead, on the Kish effective sample size tasks^2 / sum(1 / n_t) (the pooled count when every task
  holds as many samples): t is zero-width at 0 % or 100 % however few the samples, Wilson is not, and it
  holds at 1 sample a task.
- A paired difference (two presses on the same samples) is a t interval as above, on the per-sample
  differences, and a sign-flip permutation test of it (`sign_flip_p`): under "no difference" each unit's
  difference is as likely negative as positive, so the p-value is the share of sign assignments whose
  difference (weighted as the estimate weighs the units) is at least as far from 0. Exact (all 2^n
  assignments) up to 16 units, a seeded Monte-Carlo of 10,000 beyond. A difference is called significant
  (`significant`) only where p < 0.05 and its interval, where it has one, excludes 0, for the t interval alone
  overstates small samples: 4 pairs all +50 give t's [+50, +50], yet 2 of the 2^4 = 16 sign assignments
  are as extreme, p = 0.125.
- A t interval of zero width (every unit alike in every task) is no interval: NaN, the value shown alone.
- Every interval is clipped to the range its value can take: [0, 100] for a score, [-100, 100] for a
  difference.
- The independent units are the samples, except under the protocols that ask one context several questions
  (multi-question, multi-turn): those questions share one compressed cache, so their scores are averaged
  per context first and the contexts are the units (`read.context_units`). Pairs are still counted by
  question.
"""

import math

import numpy as np
import pandas as pd

CONFIDENCE = 0.95
ALPHA = 1 - CONFIDENCE
EXACT_UNITS = 16  # up to this many units the sign-flip test enumerates all 2^n assignments
RESAMPLES = 10_000  # beyond, a Monte-Carlo of this many assignments, seeded
SEED = 0
SCORE_RANGE = (0.0, 100.0)
PASS_FAIL_SCORES = (0.0, 100.0)
DIFFERENCE_RANGE = (-100.0, 100.0)


def clipped(low: float, high: float, bounds: tuple[float, float]) -> tuple[float, float]:
    return max(low, bounds[0]), min(high, bounds[1])


def t_interval(per_task: pd.DataFrame, bounds: tuple[float, float]) -> tuple[float, float]:
    """The 95 % t interval of the mean of per-task means; `per_task` has columns mean, count and var (over
    units). NaN, NaN below 2 units in a task, and where every unit is alike (zero width)."""
    from scipy.stats import t

    if per_task.empty or (per_task["count"] < 2).any():
        return float("nan"), float("nan")
    estimate = per_task["mean"].mean()
    variances = per_task["var"] / per_task["count"]
    total = variances.sum()
    if total == 0:  # every unit alike in every task: a zero-width interval is no evidence, so none
        return float("nan"), float("nan")
    freedom = total**2 / (variances**2 / (per_task["count"] - 1)).sum()
    half_width = t.ppf((1 + CONFIDENCE) / 2, freedom) * math.sqrt(total) / len(per_task)
    return clipped(estimate - half_width, estimate + half_width, bounds)


def wilson_interval(average: float, counts: pd.Series) -> tuple[float, float]:
    """The 95 % Wilson interval of a pass rate `average` (0-100), the mean of per-task rates over tasks of
    `counts` samples each, on the Kish effective sample size."""
    from statsmodels.stats.proportion import proportion_confint

    effective = len(counts) ** 2 / (1 / counts).sum()
    low, high = proportion_confint(average / 100 * effective, effective, 1 - CONFIDENCE, method="wilson")
    return clipped(100 * low, 100 * high, SCORE_RANGE)


def score_interval(scores: pd.DataFrame) -> tuple[float, float, float, int]:
    """Average, 95 % interval and units of one config's rows (columns task, unit, score)."""
    by_unit = scores.groupby(["task", "unit"])["score"].agg(["mean", "size"])
    per_task = by_unit["mean"].groupby(level="task").agg(["mean", "count", "var"])
    average = per_task["mean"].mean()
    pass_fail = scores["score"].isin(PASS_FAIL_SCORES).all() and (by_unit["size"] == 1).all()
    if pass_fail:
        low, high = wilson_interval(average, per_task["count"])
    else:
        low, high = t_interval(per_task, SCORE_RANGE)
    return average, low, high, int(per_task["count"].sum())


def config_stats(rows: pd.DataFrame, key: str) -> pd.DataFrame:
    """Per (press, `key`) config: the average (mean of the per-task means), its 95 % interval (low, high),
    its samples (rows) and units, and the means over its samples of the memory fraction, the kept-entry
    fraction and the bytes kept."""
    records = {}
    for config, group in rows.groupby(["press", key]):
        average, low, high, units = score_interval(group)
        records[config] = {
            "average": average,
            "low": low,
            "high": high,
            "samples": len(group),
            "units": units,
            "memory": group["memory_ratio"].mean(),
            "kept_fraction": group["kept_fraction"].mean(),
            "kept_bytes": group["kept_bytes"].mean(),
        }
    index = pd.MultiIndex.from_tuples(list(records), names=["press", key])
    columns = ["average", "low", "high", "samples", "units", "memory", "kept_fraction", "kept_bytes"]
    return pd.DataFrame(list(records.values()), index=index, columns=columns)


def sign_flip_p(differences: np.ndarray, weights: np.ndarray) -> float:
    """Two-sided p-value of the weighted sum of `differences` (one per unit) under the null that each
    unit's difference is as likely negative as positive: the share of sign assignments whose |sum| is at
    least the observed one. All 2^n assignments up to `EXACT_UNITS` units, else `RESAMPLES` seeded random
    ones (scipy.stats.permutation_test)."""
    from scipy.stats import permutation_test

    differences = np.asarray(differences, dtype=float)
    weights = np.asarray(weights, dtype=float)
    if len(differences) == 0:
        return float("nan")
    if len(differences) == 1 or not differences.any():
        return 1.0  # either sign of one difference (or of none) is as far from 0

    def statistic(x, axis=-1):
        return np.sum(weights * x, axis=axis)

    exact = len(differences) <= EXACT_UNITS
    result = permutation_test(
        (differences,),
        statistic,
        permutation_type="samples",
        vectorized=True,
        n_resamples=2 ** len(differences) if exact else RESAMPLES,
        batch=1000,
        random_state=np.random.default_rng(SEED),  # `rng` from scipy 1.15; the floor is 1.11
    )
    return float(min(result.pvalue, 1.0))


def significant(p: float, low: float, high: float) -> bool:
    """Whether a paired difference is called beyond noise: its sign-flip p below `ALPHA`, and its t
    interval, where it has one, clear of 0 (a t interval alone overstates a few pairs)."""
    if pd.isna(p) or p >= ALPHA:
        return False
    return pd.isna(low) or pd.isna(high) or low > 0 or high < 0


def paired_difference(cell: pd.DataFrame, press: str, other: str) -> tuple[float, float, float, int, float]:
    """`press` minus `other` on the samples both scored in `cell` (the rows of one ratio or budget), paired
    by (task, sample): the mean over tasks of the per-task mean difference, its 95 % t interval (low, high;
    NaN below 2 units in a task or at zero width), the number of pairs and the sign-flip p-value over the
    units (`sign_flip_p`, each unit weighed as in the mean of the per-task means)."""
    index = ["task", "unit", "sample_id"]
    scores = [cell[cell["press"] == name].groupby(index)["score"].mean() for name in (press, other)]
    difference = (scores[0] - scores[1]).dropna()
    if difference.empty:
        return float("nan"), float("nan"), float("nan"), 0, float("nan")
    by_unit = difference.groupby(level=["task", "unit"]).mean()
    per_task = by_unit.groupby(level="task").agg(["mean", "count", "var"])
    low, high = t_interval(per_task, DIFFERENCE_RANGE)
    counts = by_unit.groupby(level="task").transform("size")
    p = sign_flip_p(by_unit.to_numpy(), 1 / (len(per_task) * counts.to_numpy()))
    return per_task["mean"].mean(), low, high, len(difference), p


def paired_lead(rows: pd.DataFrame, average: pd.DataFrame, key: str) -> pd.DataFrame:
    """Per column of `average` (a ratio or a budget): the best press, the runner-up, and the best's lead on
    the samples both scored (`paired_difference`). Pairing removes what the two presses share (how hard a
    sample is), so a lead can be told apart from noise where the two intervals of the leaderboard overlap."""
    leads = []
    for column in average.columns:
        ranked = average[column].dropna().sort_values(ascending=False)
        if len(ranked) < 2:
            continue
        best, runner_up = ranked.index[:2]
        lead, low, high, pairs, p = paired_difference(rows[rows[key] == column], best, runner_up)
        leads.append(
            {key: column, "best": best, "runner-up": runner_up, "lead": lead, "low": low, "high": high}
            | {"pairs": pairs, "p": p}
        )
    return pd.DataFrame(leads, columns=[key, "best", "runner-up", "lead", "low", "high", "pairs", "p"])


def paired_versus(rows: pd.DataFrame, average: pd.DataFrame, key: str, baseline: str) -> pd.DataFrame:
    """Every other press's paired difference to `baseline` (`paired_difference`) at each column of
    `average` both were scored at: columns press, `key`, difference, low, high, pairs, p."""
    found = []
    for column in average.columns:
        if pd.isna(average[column].get(baseline)):
            continue
        cell = rows[rows[key] == column]
        for press in average[column].dropna().index.drop(baseline):
            difference, low, high, pairs, p = paired_difference(cell, press, baseline)
            found.append(
                {key: column, "press": press, "difference": difference, "low": low, "high": high}
                | {"pairs": pairs, "p": p}
            )
    return pd.DataFrame(found, columns=["press", key, "difference", "low", "high", "pairs", "p"])
