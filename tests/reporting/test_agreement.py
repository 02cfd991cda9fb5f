"""`kvbench compare-models`: Kendall's tau-b between two models' orders of presses, its bootstrap
interval and verdict, and a learned press's paired lead over the best other press on each model."""

import itertools

import numpy as np
import pytest
from click.testing import CliRunner

from kvbench.cli import main
from kvbench.reporting import agreement
from kvbench.store.results import ResultsStore, Row

PRESSES = ["a", "b", "c", "d"]


def brute_force_tau(x, y) -> float:
    """Kendall's tau (no ties) from its definition: (concordant - discordant) / pairs."""
    signs = [np.sign(x[i] - x[j]) * np.sign(y[i] - y[j]) for i, j in itertools.combinations(range(len(x)), 2)]
    return sum(signs) / len(signs)


def make_side(means: dict[str, float], tasks: int = 3, contexts: int = 6, noise: float = 1.0, seed: int = 0):
    rng = np.random.default_rng(seed)
    by_task = {
        f"t{t}": np.stack([means[p] + rng.normal(0, noise, contexts) for p in PRESSES], axis=1)
        for t in range(tasks)
    }
    return agreement.Side("m", PRESSES, by_task)


def test_tau_is_kendalls_and_the_verdict_follows_the_interval():
    a = make_side({"a": 80, "b": 60, "c": 40, "d": 20})
    same = make_side({"a": 70, "b": 50, "c": 30, "d": 10}, seed=1)
    reversed_ = make_side({"a": 10, "b": 30, "c": 50, "d": 70}, seed=2)
    one = agreement.order_agreement(a, same, 0.5, resamples=200)
    assert one.tau == pytest.approx(brute_force_tau(*one.means)) == 1.0
    assert one.verdict == "carries" and one.low > 0
    other = agreement.order_agreement(a, reversed_, 0.5, resamples=200)
    assert other.tau == -1.0 and other.verdict == "reversed"
    noisy = make_side({"a": 50, "b": 50, "c": 50, "d": 50}, noise=30, seed=3)
    unclear = agreement.order_agreement(a, noisy, 0.5, resamples=300)
    assert unclear.low < 0 < unclear.high and unclear.verdict == "not told apart"


def test_the_lead_is_over_the_best_other_press_paired_by_context():
    side = make_side({"a": 80, "b": 60, "c": 75, "d": 20}, noise=0.5)
    best, lead, low, high = agreement.lead_over_best(side, "a", ["b", "c", "d"])
    columns = {p: i for i, p in enumerate(PRESSES)}
    expected = np.mean([s[:, columns["a"]].mean() - s[:, columns["c"]].mean() for s in side.by_task.values()])
    assert best == "c" and lead == pytest.approx(expected) and low < lead < high and low > 0


def write_results(folder, model: str, scores: dict[str, float], uncompressed: dict[str, float]):
    store = ResultsStore(folder)
    for task, sample in itertools.product(["t1", "t2"], range(3)):
        store.append(
            Row(
                "n",
                model,
                "none",
                0.0,
                task,
                512,
                0,
                str(sample),
                content_hash="h",
                score=uncompressed[task],
                kv_kept=100,
                kv_total=100,
            )
        )
        for press, score in scores.items():
            store.append(
                Row(
                    f"c{press}",
                    model,
                    press,
                    0.5,
                    task,
                    512,
                    0,
                    str(sample),
                    content_hash="h",
                    score=score + sample,
                    kv_kept=50,
                    kv_total=100,
                )
            )


def test_compare_models_prints_the_order_verdict_and_leads_and_leaves_weak_tasks_out(tmp_path):
    write_results(
        tmp_path / "x", "small", {"kvp": 90, "knorm": 50, "tova": 70, "snapkv": 20}, {"t1": 95, "t2": 95}
    )
    write_results(
        tmp_path / "y", "large", {"kvp": 85, "knorm": 40, "tova": 60, "snapkv": 10}, {"t1": 90, "t2": 30}
    )
    result = CliRunner().invoke(
        main,
        ["compare-models", str(tmp_path / "x"), str(tmp_path / "y"), "--ratios", "0.5", "--resamples", "200"],
    )
    assert result.exit_code == 0, result.output
    assert "left out (uncompressed below 50 on large): t2" in result.output
    assert "| 0.5 | 4 | kvp > tova > knorm > snapkv | kvp > tova > knorm > snapkv | +1.00" in result.output
    assert "| 0.5 | small | kvp | tova | +20.0" in result.output
    assert "| 0.5 | large | kvp | tova | +25.0" in result.output


def test_compare_models_refuses_what_it_cannot_compare_in_one_line(tmp_path):
    write_results(tmp_path / "x", "small", {"kvp": 90, "knorm": 50, "tova": 70}, {"t1": 90, "t2": 90})
    write_results(tmp_path / "y", "large", {"kvp": 85, "knorm": 40, "tova": 60}, {"t1": 20, "t2": 20})
    result = CliRunner().invoke(main, ["compare-models", str(tmp_path / "x"), str(tmp_path / "y")])
    assert result.exit_code == 2 and "share no task that" in result.output
    bad = CliRunner().invoke(
        main, ["compare-models", str(tmp_path / "x"), str(tmp_path / "y"), "--ratios", "2"]
    )
    assert bad.exit_code == 2 and len(bad.output.strip().splitlines()) == 1
