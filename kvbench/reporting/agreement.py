"""Whether the order of presses on one model carries to another (docs/studies/two-models.md): per ratio,
Kendall's tau-b between the two models' orders of the presses by mean score, and each learned press's lead
over the best heuristic on each model. tau-b's 95 % interval is a percentile bootstrap that resamples each
model's contexts within each task (a context keeps every press's score: the presses stay paired); the lead's
is the reports' paired interval (the sign-flip test inverted)."""

from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.stats import kendalltau

from kvbench.core.config import DEFAULT_PROTOCOL
from kvbench.reporting.stats import SignFlip

RESAMPLES = 2000


@dataclass
class Side:
    """One model's scores at one ratio: a matrix per task, rows the task's contexts, columns `presses`."""

    model: str
    presses: list[str]
    by_task: dict[str, np.ndarray]

    def means(self, rng: np.random.Generator | None) -> np.ndarray:
        """Each press's mean of its task means, over the contexts as they are (rng None) or resampled
        with replacement within each task."""
        task_means = []
        for scores in self.by_task.values():
            picked = scores if rng is None else scores[rng.integers(0, len(scores), len(scores))]
            task_means.append(picked.mean(axis=0))
        return np.mean(task_means, axis=0)


@dataclass
class Agreement:
    ratio: float
    presses: list[str]
    means: tuple[np.ndarray, np.ndarray]
    tau: float
    low: float
    high: float

    @property
    def verdict(self) -> str:
        if self.low > 0:
            return "carries"
        return "reversed" if self.high < 0 else "not told apart"


def query_agnostic_at(rows: pd.DataFrame, ratio: float) -> pd.DataFrame:
    """The rows of one compression ratio under the default protocol, without a memory or entries budget."""
    plain = rows["protocol"].fillna(DEFAULT_PROTOCOL).eq(DEFAULT_PROTOCOL)
    plain &= rows["memory"].isna() & rows["budget"].isna()
    return rows[plain & np.isclose(rows["ratio"].astype(float), ratio)]


def weak_tasks(rows: pd.DataFrame, floor: float) -> list[str]:
    """The tasks whose uncompressed mean score is below `floor`: no room to tell presses apart."""
    uncompressed = rows[rows["press"] == "none"].groupby("task")["score"].mean()
    return sorted(uncompressed[uncompressed < floor].index)


def side(rows: pd.DataFrame, ratio: float, presses: list[str], tasks: list[str]) -> Side:
    """`rows` at `ratio` as a Side over `tasks`, keeping the contexts every press of `presses` scored."""
    cell = query_agnostic_at(rows, ratio)
    table = cell.pivot_table(index=["task", "sample_id"], columns="press", values="score", aggfunc="mean")
    table = table.reindex(columns=presses).dropna()
    by_task = {
        task: table.xs(task, level="task").to_numpy(float)
        for task in tasks
        if task in table.index.get_level_values("task")
    }
    return Side(str(rows["model"].iloc[0]), presses, by_task)


def common_presses(first: pd.DataFrame, second: pd.DataFrame, ratio: float) -> list[str]:
    named = [set(query_agnostic_at(rows, ratio)["press"]) - {"none"} for rows in (first, second)]
    return sorted(named[0] & named[1])


def order_agreement(a: Side, b: Side, ratio: float, resamples: int = RESAMPLES, seed: int = 0) -> Agreement:
    """Kendall's tau-b between the two sides' orders of their presses, and its bootstrap interval."""
    rng = np.random.default_rng(seed)
    means = (a.means(None), b.means(None))
    tau = float(kendalltau(*means).statistic)
    draws = [kendalltau(a.means(rng), b.means(rng)).statistic for _ in range(resamples)]
    low, high = np.nanpercentile(draws, [2.5, 97.5])
    return Agreement(ratio, a.presses, means, tau, float(low), float(high))


def lead_over_best(one: Side, press: str, heuristics: list[str]):
    """(best heuristic, lead of `press` over it, low, high): the best by mean on these contexts (which
    favours it), the lead paired by context as the mean of per-task means, and its 95 % interval: the
    sign-flip test inverted, as the reports' paired differences (`stats.SignFlip`; a bootstrap within
    tasks of 2 contexts each would be far too narrow)."""
    means = one.means(None)
    columns = {name: i for i, name in enumerate(one.presses)}
    best = max(heuristics, key=lambda name: means[columns[name]])
    differences = [scores[:, columns[press]] - scores[:, columns[best]] for scores in one.by_task.values()]
    weights = [np.full(len(d), 1 / (len(differences) * len(d))) for d in differences]
    test = SignFlip(np.concatenate(differences), np.concatenate(weights))
    low, high = test.interval()
    return best, test.estimate, low, high
