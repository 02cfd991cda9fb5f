"""Attention lifetimes per region over long decoding, with intervals over samples (issue 28, item 2).

`kvbench memdecay calibrate` fits the early drop of each region's curve with the attention sinks left out.
This module measures the same curves on longer sequences and fits them three ways, each with a percentile
bootstrap over samples (the sample is the unit that is resampled: its (query, token) pairs are not
independent), so that the region order can be read with its uncertainty:

- `early`: the shipped method (`calibration.fit_half_life`): log2 fraction on age, from age 1 to the first
  age at a quarter of age 1's fraction; sinks left out.
- `whole`: the whole curve, fraction(age) = A * 2^(-(age - 1) / h) + B by weighted least squares over every
  age with at least MIN_PAIRS pairs (weights: the binomial variance of each age's fraction). h is the
  half-life of the decaying part, B the plateau of re-reads that never decays; both reported.
- `area`: model-free, ln 2 x the area under fraction(age) / fraction(1) over ages 1..W (W the longest age
  every region reaches, so that the regions are compared on the same span): equal to h for a pure
  exponential that has died out before W, longer when a plateau holds the tokens up.

Sinks: the first SINKS tokens (all system tokens in a chat-rendered sample) are counted in a row of their
own, so that each fit is made with them out (`system`) and in (`system+sinks`, the system row plus the sink
row: what a fit that does not exclude them would say of the system region).

Long decoding: each sample (its chat turns, the question, the answer prefix) is extended by `new_tokens`
tokens decoded greedily with the end of turn suppressed (a long answer), then read in one causal forward
with eager attention: the queries of the generated tokens are the decoding steps' queries on a full cache,
so the ages reach the whole sequence. Generated tokens are "assistant".
"""

import csv
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from kvbench.bridge.adapter import attention_hooks, attention_implementation, language_model
from kvbench.learned.memdecay.calibration import (
    DEFAULT_THRESHOLD,
    MIN_PAIRS,
    SINKS,
    fit_half_life,
    sample_tokens,
)
from kvbench.tasks.prompt import REGIONS

ROWS = (*REGIONS, "sinks")  # the counts' rows: the regions without their sink tokens, then the sinks
CURVES = (*REGIONS, "system+sinks")  # what is fitted: each region, and system with its sinks counted
METHODS = ("early", "whole", "area")
MAX_WINDOW = 512  # the area's span is capped here (ages beyond are reached by the first tokens only)


@dataclass
class SampleCounts:
    """One sample's (query, token) pairs and attended pairs per (row of ROWS, age), summed over layers and
    KV heads."""

    pairs: np.ndarray  # (len(ROWS), max_age + 1)
    attended: np.ndarray


def count_layer(weights: torch.Tensor, rows: torch.Tensor, max_age: int, threshold: float):
    """(pairs, attended) per (row, age) of one layer: `weights` (kv_heads, L, L) causal attention averaged
    over each KV head's query heads, `rows` (L,) the row (index in ROWS) of each token."""
    heads, length, _ = weights.shape
    query = torch.arange(length).unsqueeze(1)
    age = query - torch.arange(length).unsqueeze(0)
    counted = (age >= 1) & (age <= max_age)
    index = (rows.unsqueeze(0) * (max_age + 1) + age)[counted]
    seen = (query + 1).to(weights.dtype)
    attended = (weights > threshold / seen).sum(dim=0)[counted].double()
    size = len(ROWS) * (max_age + 1)
    pairs = heads * torch.bincount(index, minlength=size).double()
    hits = torch.bincount(index, weights=attended, minlength=size)
    shape = (len(ROWS), max_age + 1)
    return pairs.view(shape).numpy(), hits.view(shape).numpy()


def token_rows(regions: torch.Tensor) -> torch.Tensor:
    rows = regions.clone()
    rows[:SINKS] = ROWS.index("sinks")
    return rows


@torch.no_grad()
def long_sequence(model, tokenizer, sample, new_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The sample's ids (context, question, answer prefix) followed by `new_tokens` greedy tokens decoded
    with the end of turn suppressed; the region id of each token (the generated ones "assistant")."""
    ids, regions = sample_tokens(tokenizer, sample)
    if new_tokens:
        banned = [[t] for t in {tokenizer.eos_token_id, tokenizer.pad_token_id} if t is not None]
        output = model.generate(
            ids.unsqueeze(0).to(model.device),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long, device=model.device),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            bad_words_ids=banned or None,
            pad_token_id=tokenizer.pad_token_id,
        )[0].cpu()
        generated = output[len(ids) :]
        ids = output
        regions = torch.cat([regions, torch.full((len(generated),), REGIONS.index("assistant"))])
    return ids, regions.long()


@torch.no_grad()
def measure_samples(
    model, tokenizer, samples, *, new_tokens: int, threshold: float = DEFAULT_THRESHOLD, log=print
) -> list[SampleCounts]:
    """Per sample: the counts of every layer of one causal forward over its long sequence."""
    sequences = [long_sequence(model, tokenizer, sample, new_tokens) for sample in samples]
    max_age = max(len(ids) for ids, _ in sequences) - 1
    config = model.config.get_text_config()
    groups = config.num_attention_heads // config.num_key_value_heads
    counts: list[SampleCounts] = []
    current: dict = {}

    def hook(module, args, kwargs, output):
        weights = output[1][0].float()
        pairs, hits = count_layer(
            weights.view(-1, groups, *weights.shape[1:]).mean(dim=1), current["rows"], max_age, threshold
        )
        current["pairs"] += pairs
        current["attended"] += hits
        return output[0], None

    with attention_hooks(model, hook), attention_implementation(model, "eager"):
        for number, (ids, regions) in enumerate(sequences, 1):
            current.update(
                rows=token_rows(regions),
                pairs=np.zeros((len(ROWS), max_age + 1)),
                attended=np.zeros((len(ROWS), max_age + 1)),
            )
            language_model(model)(input_ids=ids.unsqueeze(0).to(model.device), output_attentions=True)
            counts.append(SampleCounts(current["pairs"], current["attended"]))
            log(f"sample {number}/{len(sequences)}: {len(ids)} tokens")
    return counts


def curve_counts(pairs: np.ndarray, attended: np.ndarray, curve: str) -> tuple[np.ndarray, np.ndarray]:
    """(pairs, attended) along age of one of CURVES from summed counts (rows of ROWS)."""
    if curve == "system+sinks":
        rows = [ROWS.index("system"), ROWS.index("sinks")]
        return pairs[rows].sum(0), attended[rows].sum(0)
    g = ROWS.index(curve)
    return pairs[g], attended[g]


def fit_whole(attended: np.ndarray, pairs: np.ndarray) -> tuple[float, float, float]:
    """(h, A, B) of fraction = A * 2^(-(age - 1) / h) + B over every age with MIN_PAIRS pairs; NaNs when
    fewer than 4 ages qualify. h is searched on a log grid (the fit is linear in A, B for a fixed h), so the
    fit has no start value to depend on; h is clipped to [0.5, 10 x the longest age]."""
    ages = np.arange(len(pairs))
    use = (pairs >= MIN_PAIRS) & (ages >= 1)
    if use.sum() < 4:
        return math.nan, math.nan, math.nan
    x, n = ages[use].astype(float), pairs[use]
    y = attended[use] / n
    p = np.clip(y, 1e-4, 1 - 1e-4)
    weight = n / (p * (1 - p))  # inverse binomial variance
    best = None
    for h in np.geomspace(0.5, 10 * x.max(), 400):
        basis = np.stack([2.0 ** (-(x - 1) / h), np.ones_like(x)], axis=1)
        sw = np.sqrt(weight)[:, None]
        coef, *_ = np.linalg.lstsq(basis * sw, y * sw[:, 0], rcond=None)
        a, b = coef
        if b < 0:  # a plateau below zero: refit without it
            a, b = float(np.sum(weight * basis[:, 0] * y) / np.sum(weight * basis[:, 0] ** 2)), 0.0
        loss = float(np.sum(weight * (y - a * basis[:, 0] - b) ** 2))
        if best is None or loss < best[0]:
            best = (loss, float(h), float(a), float(b))
    return best[1], best[2], best[3]


def area_half_life(attended: np.ndarray, pairs: np.ndarray, window: int) -> float:
    """ln 2 x sum over ages 1..window of fraction(age) / fraction(1) (ages below MIN_PAIRS interpolated
    from their neighbours); NaN if age 1 or the window's end is not measured."""
    ages = np.arange(len(pairs))
    use = (pairs >= MIN_PAIRS) & (ages >= 1) & (ages <= window)
    if not use[1] or window >= len(pairs) or not use[window]:
        return math.nan
    fraction = np.interp(np.arange(1, window + 1), ages[use], attended[use] / pairs[use])
    if fraction[0] <= 0:
        return math.nan
    return float(math.log(2) * fraction.sum() / fraction[0])


def common_window(pairs: np.ndarray) -> int:
    """The longest age (at most MAX_WINDOW) at which every region's curve has MIN_PAIRS pairs."""
    window = MAX_WINDOW
    for curve in REGIONS:
        counts, _ = curve_counts(pairs, pairs, curve)
        reached = np.nonzero(counts >= MIN_PAIRS)[0]
        if len(reached):
            window = min(window, int(reached.max()))
    return window


def estimates(pairs: np.ndarray, attended: np.ndarray, window: int) -> dict:
    """{(curve, quantity): value} for summed counts: each method's half-life, the whole fit's plateau share
    B / (A + B), and the attended fraction over all pairs (what the shipped priorities are made from)."""
    out = {}
    for curve in CURVES:
        n, k = curve_counts(pairs, attended, curve)
        out[curve, "early"] = fit_half_life(torch.from_numpy(k), torch.from_numpy(n)) if n.sum() else math.nan
        h, a, b = fit_whole(k, n)
        out[curve, "whole"] = h
        out[curve, "plateau"] = b / (a + b) if a + b > 0 else math.nan
        out[curve, "area"] = area_half_life(k, n, window)
        out[curve, "fraction"] = float(k.sum() / n.sum()) if n.sum() else math.nan
    return out


def bootstrap(counts: list[SampleCounts], resamples: int = 400, seed: int = 0, level: float = 0.95):
    """Point estimates and percentile intervals over samples (resampled with replacement) of `estimates`,
    plus the paired differences system - scratchpad and system+sinks - scratchpad per method."""
    pairs = np.stack([c.pairs for c in counts])
    attended = np.stack([c.attended for c in counts])
    window = common_window(pairs.sum(0))

    def with_differences(values: dict) -> dict:
        for method in METHODS:
            for curve in ("system", "system+sinks"):
                values[f"{curve} - scratchpad", method] = values[curve, method] - values["scratchpad", method]
        return values

    point = with_differences(estimates(pairs.sum(0), attended.sum(0), window))
    rng = np.random.default_rng(seed)
    draws = []
    for _ in range(resamples):
        chosen = rng.integers(0, len(counts), len(counts))
        draws.append(with_differences(estimates(pairs[chosen].sum(0), attended[chosen].sum(0), window)))
    tail = (1 - level) / 2 * 100
    result = {}
    for key, value in point.items():
        values = np.array([d[key] for d in draws], dtype=float)
        values = values[np.isfinite(values)]
        low, high = np.percentile(values, [tail, 100 - tail]) if len(values) else (math.nan, math.nan)
        result[key] = (value, float(low), float(high))
    return result, window


def log_bins(max_age: int) -> list[tuple[int, int]]:
    """Age bins for the committed curves: every age up to 16, then 12 bins per doubling."""
    edges = sorted({*range(1, 17), *np.unique(np.geomspace(16, max_age + 1, 80).astype(int)).tolist()})
    edges = [e for e in edges if e <= max_age + 1] + [max_age + 1]
    return [(a, b) for a, b in zip(edges, edges[1:], strict=False) if b > a]


def curve_rows(counts: list[SampleCounts], resamples: int = 400, seed: int = 0) -> list[dict]:
    """The fraction attended per curve and age bin, with a percentile interval over samples."""
    pairs = np.stack([c.pairs for c in counts])
    attended = np.stack([c.attended for c in counts])
    max_age = pairs.shape[-1] - 1
    rng = np.random.default_rng(seed)
    choices = [rng.integers(0, len(counts), len(counts)) for _ in range(resamples)]
    rows = []
    for curve in CURVES:
        n_all, k_all = zip(
            *(curve_counts(p, a, curve) for p, a in zip(pairs, attended, strict=True)), strict=True
        )
        n_all, k_all = np.stack(n_all), np.stack(k_all)
        for low, high in log_bins(max_age):
            n, k = n_all[:, low:high].sum(1), k_all[:, low:high].sum(1)
            if n.sum() < MIN_PAIRS:
                continue
            draws = [k[c].sum() / n[c].sum() for c in choices if n[c].sum() > 0]
            lo, hi = np.percentile(draws, [2.5, 97.5])
            rows.append(
                {
                    "curve": curve,
                    "age_low": low,
                    "age_high": high - 1,
                    "pairs": int(n.sum()),
                    "fraction": round(float(k.sum() / n.sum()), 6),
                    "low": round(float(lo), 6),
                    "high": round(float(hi), 6),
                }
            )
    return rows


def write_results(directory: Path, counts: list[SampleCounts], card: dict, resamples: int = 400) -> dict:
    """curves.csv (fraction by age bin), fits.csv (every estimate with its interval), lifetimes.png."""
    directory.mkdir(parents=True, exist_ok=True)
    fits, window = bootstrap(counts, resamples)
    rows = curve_rows(counts, resamples)
    with open(directory / "curves.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    with open(directory / "fits.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["curve", "quantity", "estimate", "low", "high"])
        for (curve, quantity), (value, low, high) in fits.items():
            writer.writerow([curve, quantity, *(f"{v:.4g}" for v in (value, low, high))])
    plot(rows, fits, directory / "lifetimes.png", card, window)
    return {"fits": fits, "window": window}


def plot(rows: list[dict], fits: dict, path: Path, card: dict, window: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(8, 5))
    for curve in CURVES:
        mine = [r for r in rows if r["curve"] == curve]
        if not mine:
            continue
        age = np.array([(r["age_low"] + r["age_high"]) / 2 for r in mine])
        fraction = np.array([r["fraction"] for r in mine])
        style = ":" if curve == "system+sinks" else "-"
        (line,) = axis.plot(
            age, fraction, style, lw=1.2, label=f"{curve} (whole h {fits[curve, 'whole'][0]:.3g})"
        )
        axis.fill_between(
            age, [r["low"] for r in mine], [r["high"] for r in mine], color=line.get_color(), alpha=0.2
        )
    axis.axvline(window, color="grey", lw=0.8, ls="--")
    axis.set(xscale="log", yscale="log", xlabel="age (tokens since the token)", ylabel="fraction attended")
    axis.set_title(
        f"{card.get('model', '')}: {card.get('samples', '?')} samples + "
        f"{card.get('new_tokens', '?')} decoded tokens; 95 % bootstrap over samples; dashed: area window",
        fontsize=9,
    )
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
