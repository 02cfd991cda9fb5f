"""Ranking cost, Plackett-Luce sampling and log-probability: the pieces of the KVP training objective.

A ranking orders a prompt's tokens best first; keeping its top k for a budget k loses the utility of the
rest. Summed over every budget k = 0..P-1, the loss of ranking sigma is sum_r (r+1) * u[sigma_r]. We divide by
the oracle's (utility sorted descending), so a ranking's normalised cost is 1 at the oracle and larger
otherwise; the reward is its negative.

Budget weights (training only; validation and reports always use the paper's uniform sum): with weight w_k on
budget k the cost is sum_r W(r) u[sigma_r], W(r) = sum_{k <= r} w_k. "uniform" (w_k = 1, W(r) = r + 1) is
the paper's; "harmonic" (w_k = 1/(k+1), W(r) the harmonic number H(r+1)) makes the small budgets of high
compression ratios count most: the budget that keeps 10 % weighs 5 times the one that keeps half.
"quarter" and "tenth" (w_k = 1 for budgets keeping at most that share of the prompt, k <= P/4 or P/10, else
0; W(r) = min(r + 1, that share + 1)) train for high ratios only: which tokens make the top quarter (or
tenth), and their order there, is all the reward sees.
"""

import torch

from kvbench.learned.kvp.config import BUDGET_WEIGHTS, TOP_SHARE  # noqa: F401 (this module's API)


def rank_weights(length: int, budget_weights: str, dtype, device) -> torch.Tensor:
    """W(r) for ranks r = 0..length-1: the summed weight of the budgets that evict rank r."""
    ranks = torch.arange(1, length + 1, dtype=dtype, device=device)
    if budget_weights == "uniform":
        return ranks
    if budget_weights == "harmonic":
        return ranks.reciprocal().cumsum(-1)
    if budget_weights in TOP_SHARE:
        return ranks.clamp_max(int(length * TOP_SHARE[budget_weights]) + 1)
    raise ValueError(f"unknown budget weights {budget_weights!r} (one of {', '.join(BUDGET_WEIGHTS)})")


def ranking_cost(
    utility: torch.Tensor, rankings: torch.Tensor, budget_weights: str = "uniform"
) -> torch.Tensor:
    """Cost of rankings. utility: (..., P); rankings: (..., K, P) token indices, best first -> (..., K)."""
    ranked = utility.unsqueeze(-2).expand(rankings.shape).gather(-1, rankings)
    return ranked @ rank_weights(utility.shape[-1], budget_weights, utility.dtype, utility.device)


def oracle_cost(utility: torch.Tensor, budget_weights: str = "uniform") -> torch.Tensor:
    """Cost of the best ranking (utility sorted descending): (..., P) -> (...)."""
    oracle = utility.argsort(dim=-1, descending=True).unsqueeze(-2)
    cost = ranking_cost(utility, oracle, budget_weights).squeeze(-1)
    return cost.clamp_min(torch.finfo(utility.dtype).tiny)


def normalised_cost(
    utility: torch.Tensor, rankings: torch.Tensor, budget_weights: str = "uniform"
) -> torch.Tensor:
    """ranking_cost / oracle_cost: exactly 1 for the oracle ranking, larger for any worse one."""
    cost = ranking_cost(utility, rankings, budget_weights)
    return cost / oracle_cost(utility, budget_weights).unsqueeze(-1)


def random_normalised_cost(utility: torch.Tensor) -> torch.Tensor:
    """Expected normalised cost of a uniformly random ranking: every rank has mean weight (P+1)/2."""
    return (utility.shape[-1] + 1) / 2 * utility.sum(-1) / oracle_cost(utility)


def ranking_by_score(scores: torch.Tensor) -> torch.Tensor:
    """The deterministic ranking of scores (highest first) as (..., 1, P), the shape the costs take."""
    return scores.argsort(dim=-1, descending=True).unsqueeze(-2)
