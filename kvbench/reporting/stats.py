"""Statistics of a leaderboard: each config's mean and 95 % interval, and differences paired by sample (the
leader minus the runner-up, a chosen press minus every other).

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
- A paired difference (two presses on the same samples) gets its interval and its significance from one
  method, a sign-flip permutation test (`SignFlip`): under "the mean difference is d", each unit's
  difference minus d is as likely negative as positive; p is the share of sign assignments (weighted as the
  estimate weighs the units) at least as far from 0 as observed. Exact (all 2^n assignments) up to 16
  units, a seeded Monte-Carlo of 10,000 beyond. The interval is the set of d the test does not reject at
  5 %, so it excludes 0 exactly where p < 0.05, which is what `significant` calls significant: a table can
  never show an interval clear of 0 beside "not significant", or the reverse. With 5 units or fewer no
  sign assignment is rare enough, so nothing is significant and the interval is the whole range; 4 pairs
  all +50 give p = 2 / 2^4 = 0.125 (a t interval would be [+50, +50]).
- A score's t interval of zero width (every unit alike in every task) is no interval: NaN, the value shown
  alone.
- Every interval is clipped to the range its value can take: [0, 100] for a score, [-100, 100] for a
  difference.
- The independent units are the samples, except under the protocols that ask one context several questions
  (multi-question, multi-turn): those questions share one compressed cache, so their scores are averaged
  per context first and the contexts are the units (`read.context_units`). Pairs are still counted by
  question.
"""

import functools
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


class SignFlip:
    """The sign-flip permutation test of a weighted mean of per-unit differences, and the 95 % interval
    made by inverting it: under "the mean difference is `shift`", each unit's difference minus `shift` is as
    likely negative as positive, so the p-value of a shift is the share of sign assignments whose weighted
    sum is at least as far from 0 as the observed one. The interval holds the shifts the test does not
    reject at `ALPHA`, so it excludes 0 exactly where p (at shift 0) < `ALPHA`: one method for both.

    The assignments: all 2^n up to `EXACT_UNITS` units, else `RESAMPLES` seeded random ones (then p counts
    the observed assignment too, as scipy.stats.permutation_test does). One set of assignments serves every
    shift, so each shift's p is computed from two sums per assignment; scipy's permutation_test gives the
    same p at shift 0 (the tests check it), but would draw and sum the assignments again at every shift."""

    def __init__(self, differences, weights):
        differences = np.asarray(differences, dtype=float)
        weights = np.asarray(weights, dtype=float)
        units = len(differences)
        self.exact = units <= EXACT_UNITS
        # Each assignment's sum, and its slope in the shift, in one order of the assignments.
        if self.exact:
            self.flipped, self.slopes = every_signed_sum(weights * differences), every_signed_sum(weights)
        else:
            signs = random_signs(units)
            self.flipped, self.slopes = signs @ (weights * differences), signs @ weights
        self.observed = float(weights @ differences)
        self.total = float(weights.sum())
        self.estimate = self.observed / self.total if units else float("nan")

    def p(self, shift: float) -> float:
        """Two-sided p-value of "the weighted mean difference is `shift`"."""
        if not len(self.flipped):
            return float("nan")
        observed = abs(self.observed - shift * self.total)
        sums = np.abs(self.flipped - shift * self.slopes)
        extreme = int(np.count_nonzero(sums >= observed - 1e-9 * (1 + observed)))
        return extreme / len(sums) if self.exact else (extreme + 1) / (len(sums) + 1)

    def accepts(self, shift: float) -> bool:
        return self.p(shift) >= ALPHA

    def bound(self, rejected: float, accepted: float) -> float:
        """The shift between a rejected and an accepted one where the test's verdict changes, found by
        bisection to far below a table's rounding; the accepted side."""
        for _ in range(60):
            middle = (rejected + accepted) / 2
            rejected, accepted = (rejected, middle) if self.accepts(middle) else (middle, accepted)
        return accepted

    def interval(self, bounds: tuple[float, float] = DIFFERENCE_RANGE) -> tuple[float, float]:
        """The shifts within `bounds` that the test does not reject, as (low, high): a bound the test never
        rejects up to is that end of `bounds` (with 5 units or fewer no assignment set is rare enough, so
        the interval is the whole range). The side facing 0 is searched on 0's side of the estimate as 0 is
        accepted or rejected, so the interval excludes 0 exactly where p < `ALPHA`."""
        if pd.isna(self.estimate):
            return float("nan"), float("nan")
        ends = []
        for end in bounds:
            start = self.estimate
            if min(start, end) < 0 < max(start, end):  # 0 lies on this side: search past it only if accepted
                if not self.accepts(0.0):
                    ends.append(self.bound(0.0, start))
                    continue
                start = 0.0
            ends.append(end if self.accepts(end) else self.bound(end, start))
        return ends[0], ends[1]


@functools.lru_cache(maxsize=8)
def random_signs(units: int) -> np.ndarray:
    """`RESAMPLES` seeded random assignments of signs to `units` units (read-only): the same for every test
    of that many units, so a report drawing hundreds of them draws each size once."""
    signs = np.random.default_rng(SEED).choice([-1.0, 1.0], size=(RESAMPLES, units))
    signs.flags.writeable = False
    return signs


def every_signed_sum(values: np.ndarray) -> np.ndarray:
    """The sum of `values` under each of the 2^n assignments of signs, in an order fixed by n alone: built
    by doubling, one addition per assignment, where a matrix of signs would take n."""
    sums = np.zeros(1)
    for value in values:
        sums = np.concatenate([sums + value, sums - value])
    return sums


def sign_flip_p(differences: np.ndarray, weights: np.ndarray) -> float:
    """Two-sided p-value of the weighted sum of `differences` (one per unit) under the null that each
    unit's difference is as likely negative as positive (`SignFlip` at shift 0)."""
    return SignFlip(differences, weights).p(0.0)


def significant(p: float) -> bool:
    """Whether a paired difference is called beyond noise: its sign-flip p below `ALPHA`, which is where
    its interval (the same test inverted, `SignFlip.interval`) excludes 0."""
    return not pd.isna(p) and p < ALPHA


def paired_difference(cell: pd.DataFrame, press: str, other: str) -> tuple[float, float, float, int, float]:
    """`press` minus `other` on the samples both scored in `cell` (the rows of one ratio or budget), paired
    by (task, sample): the mean over tasks of the per-task mean difference, its 95 % interval (low, high)
    and p-value from one sign-flip test over the units (`SignFlip`, each unit weighed as in the mean of the
    per-task means), and the number of pairs."""
    index = ["task", "unit", "sample_id"]
    scores = [cell[cell["press"] == name].groupby(index)["score"].mean() for name in (press, other)]
    difference = (scores[0] - scores[1]).dropna()
    if difference.empty:
        return float("nan"), float("nan"), float("nan"), 0, float("nan")
    by_unit = difference.groupby(level=["task", "unit"]).mean()
    counts = by_unit.groupby(level="task").transform("size").to_numpy()
    tasks = by_unit.index.get_level_values("task").nunique()
    test = SignFlip(by_unit.to_numpy(), 1 / (tasks * counts))
    low, high = test.interval()
    return test.estimate, low, high, len(difference), test.p(0.0)


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


def paired_versus(rows: pd.DataFrame, average: pd.DataFrame, key: str, named: str) -> pd.DataFrame:
    """The `named` press minus every other press (`paired_difference`) at each column of `average` both
    were scored at: columns press (the other), `key`, difference, low, high, pairs, p."""
    found = []
    for column in average.columns:
        if pd.isna(average[column].get(named)):
            continue
        cell = rows[rows[key] == column]
        for press in average[column].dropna().index.drop(named):
            difference, low, high, pairs, p = paired_difference(cell, named, press)
            found.append(
                {key: column, "press": press, "difference": difference, "low": low, "high": high}
                | {"pairs": pairs, "p": p}
            )
    return pd.DataFrame(found, columns=["press", key, "difference", "low", "high", "pairs", "p"])
