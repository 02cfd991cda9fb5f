import itertools

import pytest
import torch

from kvbench.learned.common.ranking import plackett_luce_log_prob, sample_rankings
from kvbench.learned.kvp.reward import (
    normalised_cost,
    oracle_cost,
    random_normalised_cost,
    ranking_by_score,
    ranking_cost,
)


def brute_force_log_prob(scores: list[float], ranking: list[int]) -> float:
    total, left = 0.0, list(ranking)
    for item in ranking:
        total += scores[item] - torch.logsumexp(torch.tensor([scores[i] for i in left]), 0).item()
        left.remove(item)
    return total


def test_cost_by_hand():
    utility = torch.tensor([0.1, 0.6, 0.3])
    # ranking [0, 1, 2]: 1*0.1 + 2*0.6 + 3*0.3; oracle [1, 2, 0]: 1*0.6 + 2*0.3 + 3*0.1
    assert ranking_cost(utility, torch.tensor([[0, 1, 2]])).item() == pytest.approx(2.2)
    assert oracle_cost(utility).item() == pytest.approx(1.5)
    assert normalised_cost(utility, torch.tensor([[0, 1, 2]])).item() == pytest.approx(2.2 / 1.5)


@pytest.mark.parametrize(
    "budget_weights, weight",
    [
        ("uniform", lambda k: 1.0),
        ("harmonic", lambda k: 1 / (k + 1)),
        ("quarter", lambda k: float(k <= 5 / 4)),
        ("tenth", lambda k: float(k <= 5 / 10)),
    ],
)
def test_cost_is_the_weighted_sum_over_budgets_of_the_utility_evicted(budget_weights, weight):
    utility = torch.tensor([0.05, 0.4, 0.15, 0.3, 0.1], dtype=torch.float64)
    rankings = torch.tensor(list(itertools.permutations(range(5))))
    costs = ranking_cost(utility, rankings, budget_weights)
    for ranking, cost in zip(rankings.tolist(), costs.tolist(), strict=True):
        # Budget k keeps the ranking's first k tokens and evicts the rest.
        by_budgets = sum(weight(k) * utility[ranking[k:]].sum().item() for k in range(5))
        assert cost == pytest.approx(by_budgets)
    normalised = normalised_cost(utility, rankings, budget_weights)
    assert normalised.min().item() == pytest.approx(1.0) and (normalised >= 1 - 1e-9).all()


def test_cost_is_one_at_the_oracle_and_larger_for_every_other_ranking():
    utility = torch.tensor([0.05, 0.4, 0.15, 0.3, 0.1])
    oracle = tuple(utility.argsort(descending=True).tolist())
    rankings = torch.tensor(list(itertools.permutations(range(5))))
    costs = normalised_cost(utility, rankings)
    for ranking, cost in zip(rankings.tolist(), costs.tolist(), strict=True):
        if tuple(ranking) == oracle:
            assert cost == pytest.approx(1.0, abs=1e-6)
        else:
            assert cost > 1.0 + 1e-4
    # The expected cost of a random ranking is the mean over all permutations.
    assert random_normalised_cost(utility).item() == pytest.approx(costs.mean().item(), rel=1e-5)


def test_plackett_luce_log_prob_matches_brute_force_and_sums_to_one():
    scores = torch.tensor([0.3, -1.2, 2.0, 0.7])
    rankings = torch.tensor(list(itertools.permutations(range(4))))
    log_probs = plackett_luce_log_prob(scores, rankings)
    for ranking, log_prob in zip(rankings.tolist(), log_probs.tolist(), strict=True):
        assert log_prob == pytest.approx(brute_force_log_prob(scores.tolist(), ranking), abs=1e-5)
    assert log_probs.exp().sum().item() == pytest.approx(1.0, abs=1e-5)


def test_gumbel_sampling_follows_plackett_luce():
    scores = torch.tensor([1.5, 0.0, -0.5])
    rankings = sample_rankings(scores, 40_000, torch.Generator().manual_seed(0))
    first = torch.bincount(rankings[:, 0], minlength=3).float() / len(rankings)
    assert torch.allclose(first, scores.softmax(0), atol=0.01)


def test_batched_shapes_and_ranking_by_score():
    scores = torch.tensor([[0.2, 0.9, 0.1], [3.0, 1.0, 2.0]])
    assert ranking_by_score(scores).tolist() == [[[1, 0, 2]], [[0, 2, 1]]]
    rankings = sample_rankings(scores, 5)
    assert rankings.shape == (2, 5, 3)
    assert plackett_luce_log_prob(scores, rankings).shape == (2, 5)
    assert normalised_cost(scores.softmax(-1), rankings).shape == (2, 5)
