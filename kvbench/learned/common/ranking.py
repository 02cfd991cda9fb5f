"""Plackett-Luce rankings, the sampling both learned rankers train through (KVP's agents, DistillCache's
keep-sets): sampled by Gumbel-perturbed argsort, scored by their log-probability in O(P)."""

import torch


def sample_rankings(scores: torch.Tensor, k: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """k rankings from the Plackett-Luce distribution of scores (..., P) -> (..., k, P).

    Sorting scores perturbed by i.i.d. Gumbel noise draws exactly from Plackett-Luce.
    """
    shape = (*scores.shape[:-1], k, scores.shape[-1])
    uniform = torch.rand(shape, generator=generator, device=scores.device, dtype=scores.dtype)
    gumbel = -torch.log(-torch.log(uniform.clamp(1e-20, 1.0 - 1e-7)))
    return (scores.unsqueeze(-2) + gumbel).argsort(dim=-1, descending=True)


def plackett_luce_log_prob(scores: torch.Tensor, rankings: torch.Tensor) -> torch.Tensor:
    """log P(ranking) under Plackett-Luce, in O(P): scores (..., P), rankings (..., K, P) -> (..., K).

    P(sigma) = prod_r exp(s[sigma_r]) / sum_{t >= r} exp(s[sigma_t]); the denominators of all ranks are one
    reverse log-cumsum-exp over the ranked scores.
    """
    ranked = scores.unsqueeze(-2).expand(rankings.shape).gather(-1, rankings)
    tails = ranked.flip(-1).logcumsumexp(-1).flip(-1)
    return (ranked - tails).sum(-1)
