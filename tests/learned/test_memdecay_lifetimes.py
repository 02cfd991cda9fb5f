"""MemDecay's lifetime study (kvbench.learned.memdecay.lifetimes): the whole-curve and area fits recover
known decays, sinks are counted apart, the bootstrap's intervals bracket its estimates, and a tiny model's
long sequences go through to the committed files."""

import csv
import math

import numpy as np
import pytest
import torch

from kvbench.bridge.models import load_model
from kvbench.learned.memdecay import lifetimes
from kvbench.learned.memdecay.calibration import SINKS
from kvbench.tasks.base import Sample
from kvbench.tasks.prompt import REGIONS


def chat_sample(number: int) -> Sample:
    messages = [
        {"role": "system", "content": "You are a careful agent. The vault code is 4471."},
        {"role": "user", "content": f"Task {number}: read notes.txt."},
        {"role": "assistant", "content": "I will look first.", "region": "scratchpad"},
        {"role": "assistant", "content": "call: cat notes.txt"},
        {"role": "tool", "content": "the meeting moved to friday at noon; bring the report. " * 2},
    ]
    return Sample(
        task="chat",
        id=str(number),
        context="",
        question="When is the meeting?",
        answer_prefix="Answer:",
        references=["friday"],
        max_new_tokens=4,
        metric="string_match_all",
        messages=messages,
    )


def synthetic(h: float, a: float, b: float, max_age: int = 600, n: float = 1e6):
    """Expected counts of a curve fraction = a 2^(-(age - 1) / h) + b with n pairs at every age."""
    ages = np.arange(max_age + 1)
    pairs = np.full(max_age + 1, n)
    pairs[0] = 0
    return pairs * (a * 2.0 ** (-(ages - 1) / h) + b), pairs


@pytest.mark.parametrize(("h", "a", "b"), [(8.0, 0.5, 0.0), (40.0, 0.3, 0.05), (150.0, 0.6, 0.02)])
def test_whole_fit_recovers_decay_and_plateau(h, a, b):
    attended, pairs = synthetic(h, a, b)
    fit_h, fit_a, fit_b = lifetimes.fit_whole(attended, pairs)
    assert fit_h == pytest.approx(h, rel=0.03)
    assert fit_a == pytest.approx(a, rel=0.05)
    assert fit_b == pytest.approx(b, abs=0.005)


def test_area_half_life_is_the_half_life_of_a_pure_decay_and_longer_with_a_plateau():
    attended, pairs = synthetic(10.0, 0.5, 0.0)
    assert lifetimes.area_half_life(attended, pairs, 400) == pytest.approx(10.0 + math.log(2) / 2, rel=0.05)
    with_plateau, _ = synthetic(10.0, 0.5, 0.05)
    assert lifetimes.area_half_life(with_plateau, pairs, 400) > 2 * 10.0
    assert math.isnan(lifetimes.area_half_life(attended, pairs, len(pairs)))  # window beyond the ages


def test_sinks_are_counted_in_their_own_row():
    length, max_age = 12, 11
    regions = torch.tensor([0] * 6 + [4] * 6)
    rows = lifetimes.token_rows(regions)
    assert (rows[:SINKS] == lifetimes.ROWS.index("sinks")).all() and (rows[SINKS:6] == 0).all()
    weights = torch.full((2, length, length), 1.0).tril()
    weights = weights / weights.sum(-1, keepdim=True)
    weights[:, :, 0] *= 3  # the first token above its share at every age
    pairs, attended = lifetimes.count_layer(weights, rows, max_age, 1.0)
    assert pairs.sum() == 2 * length * (length - 1) / 2  # every (query, earlier token) pair, both heads
    sink, system = lifetimes.ROWS.index("sinks"), lifetimes.ROWS.index("system")
    assert attended[sink].sum() > 0 and attended[system].sum() == 0
    together, _ = lifetimes.curve_counts(pairs, attended, "system+sinks")
    assert together.sum() == pairs[sink].sum() + pairs[system].sum()


def fake_counts(samples: int, seed: int = 0) -> list:
    """Samples of a system curve that decays slower than the scratchpad's, with binomial noise."""
    rng = np.random.default_rng(seed)
    decay = {"system": 80.0, "user": 20.0, "assistant": 15.0, "tool": 30.0, "scratchpad": 10.0, "sinks": 1e4}
    counts = []
    for _ in range(samples):
        pairs = np.zeros((len(lifetimes.ROWS), 301))
        attended = np.zeros_like(pairs)
        for g, row in enumerate(lifetimes.ROWS):
            expected, n = synthetic(decay[row], 0.4, 0.01, max_age=300, n=400)
            pairs[g] = n
            attended[g] = rng.binomial(n.astype(int), np.clip(expected / np.maximum(n, 1), 0, 1))
        counts.append(lifetimes.SampleCounts(pairs, attended))
    return counts


def test_bootstrap_intervals_bracket_the_estimates_and_order_the_regions():
    fits, window = lifetimes.bootstrap(fake_counts(6), resamples=30)
    assert window == 300
    for method in lifetimes.METHODS:
        value, low, high = fits["system - scratchpad", method]
        assert low <= value <= high
        assert low > 0  # system lives longer than scratchpad beyond the interval
    value, low, high = fits["system", "whole"]
    assert low <= value <= high and value == pytest.approx(80.0, rel=0.3)


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_model(tiny_model_dir)


def test_tiny_model_long_sequences_go_through_to_the_files(tiny, tmp_path):
    model, tokenizer = tiny
    samples = [chat_sample(1), chat_sample(2)]
    ids, regions = lifetimes.long_sequence(model, tokenizer, samples[0], new_tokens=5)
    plain, _ = lifetimes.long_sequence(model, tokenizer, samples[0], new_tokens=0)
    assert len(ids) == len(plain) + 5 and len(regions) == len(ids)
    assert (regions[len(plain) :] == REGIONS.index("assistant")).all()
    counts = lifetimes.measure_samples(model, tokenizer, samples, new_tokens=5, log=lambda line: None)
    assert len(counts) == 2 and all(c.pairs.sum() > 0 for c in counts)
    lifetimes.write_results(tmp_path, counts, {"model": "tiny", "samples": 2, "new_tokens": 5}, resamples=10)
    assert {p.name for p in tmp_path.iterdir()} == {"curves.csv", "fits.csv", "lifetimes.png"}
    with open(tmp_path / "curves.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert {row["curve"] for row in rows} <= set(lifetimes.CURVES)
    assert all(float(row["low"]) <= float(row["fraction"]) + 1e-9 for row in rows)
