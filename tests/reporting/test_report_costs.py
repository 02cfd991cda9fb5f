"""The report's accuracy-against-cost view: costs of `kvbench speed` joined to scores by press and budget."""

import json
from dataclasses import asdict

import pytest
from click.testing import CliRunner

from kvbench.cli import main
from kvbench.reporting import render_report
from kvbench.reporting.boards import build_leaderboards
from kvbench.reporting.costs import cost_points, on_frontier, read_costs
from kvbench.reporting.read import collect
from kvbench.store.costs import COSTS_FILE, Cost
from tests.reporting.test_report import PNG_SIGNATURE, markdown_tables, memory_rows, write_results


def cost(press, memory, tokens=1024, overhead=0.1, rate=20.0, allocated=0.5, accounted=0.25) -> Cost:
    full = 1_000_000
    return Cost(
        press,
        0.0 if memory is not None else 0.5,
        memory,
        {},
        tokens,
        "cpu",
        1.0 + overhead,
        1.0,
        overhead,
        rate,
        40.0,
        int(allocated * full),
        full,
        int(accounted * full),
        full,
    )


def write_costs(folder, costs, model="smollm2-135m"):
    folder.mkdir(parents=True)
    (folder / COSTS_FILE).write_text("".join(json.dumps(asdict(c)) + "\n" for c in costs))
    (folder / "runs").mkdir()
    (folder / "runs" / "speed-1.json").write_text(json.dumps({"config": {"model": model}}))
    return folder


def rewrite_first(folder, **changes):
    lines = (folder / COSTS_FILE).read_text().splitlines()
    lines[0] = json.dumps({**json.loads(lines[0]), **changes})
    (folder / COSTS_FILE).write_text("\n".join(lines) + "\n")


COSTS = [
    cost("knorm", 0.5, overhead=0.02, rate=36.0, allocated=0.5, accounted=0.5),
    cost("quant", 0.25, overhead=0.3, rate=30.0, allocated=1.0, accounted=0.2),
    cost("knorm", 0.5, tokens=4096, overhead=0.5),  # another length: not this 1024-token board's
    cost("snapkv", 0.5),  # no snapkv rows: nothing to set it beside
    cost("knorm", 0.9),  # no knorm rows at memory 0.9
]


def test_costs_join_the_scores_of_the_same_press_budget_and_length(tmp_path):
    results = write_results(tmp_path / "results", memory_rows())
    [board] = build_leaderboards(collect([results]).rows, [])
    costs = read_costs(write_costs(tmp_path / "speed", COSTS))
    points, length = cost_points(board, costs)
    assert length == 1024
    assert sorted(zip(points["press"], points["budget"], strict=True)) == [("knorm", 0.5), ("quant", 0.25)]
    knorm = points.set_index("press").loc["knorm"]
    assert knorm["average"] == pytest.approx(board.memory.average.at["knorm", 0.5])
    assert knorm["prefill_overhead"] == pytest.approx(0.02) and knorm["decode_speed"] == pytest.approx(0.9)

    out = render_report([results], tmp_path / "report", costs=costs)
    readme = (out / "README.md").read_text()
    assert "### Accuracy against cost" in readme
    [table] = [t for t in markdown_tables(readme) if t[0][:3] == ["press", "budget", "score"]]
    rows = {row[0]: row for row in table[1:]}
    assert set(rows) == {"knorm", "quant"}
    assert rows["knorm"][3:] == ["+2.0%", "36.0", "0.90x", "0.50", "0.50", "yes"]  # alone at its budget
    assert rows["quant"][3:] == ["+30.0%", "30.0", "0.75x", "1.00", "0.20", "yes"]
    assert (out / "smollm2-135m-1024-costs.png").read_bytes().startswith(PNG_SIGNATURE)


@pytest.mark.parametrize("seed", range(8))
def test_the_frontier_holds_the_presses_no_cheaper_press_outscores(seed):
    """Random points at two budgets, with tied scores and tied costs: a point is on its budget's frontier
    exactly where its score is at least the best score of the other points that cost no more."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(seed)
    n = 12
    points = pd.DataFrame(
        {
            "axis": "ratio",
            "budget": rng.choice([0.5, 0.75], n),
            "average": rng.choice([10.0, 40.0, 40.0, 70.0, 90.0], n),
            "prefill_overhead": rng.choice([-0.1, 0.0, 0.05, 0.05, 0.4, 4.0], n),
        }
    )
    expected = []
    for i, row in points.iterrows():
        cheaper = points[
            (points.index != i)
            & (points["budget"] == row["budget"])
            & (points["prefill_overhead"] <= row["prefill_overhead"])
        ]
        expected.append(cheaper.empty or row["average"] >= cheaper["average"].max())
    assert on_frontier(points) == expected


def test_the_report_marks_the_frontier_and_a_dominated_press_is_off_it(tmp_path):
    """knorm and quant at one budget: the one that costs more and scores less is off the frontier."""
    results = write_results(tmp_path / "results", memory_rows())
    [board] = build_leaderboards(collect([results]).rows, [])
    knorm, quant = board.memory.average.at["knorm", 0.25], board.memory.average.at["quant", 0.25]
    cheap, dear = ("knorm", "quant") if knorm >= quant else ("quant", "knorm")
    costs = [cost(cheap, 0.25, overhead=0.01), cost(dear, 0.25, overhead=0.2)]
    costs = read_costs(write_costs(tmp_path / "speed", costs))
    readme = (render_report([results], tmp_path / "report", costs=costs) / "README.md").read_text()
    [table] = [t for t in markdown_tables(readme) if t[0][:3] == ["press", "budget", "score"]]
    frontier = {row[0]: row[-1] for row in table[1:]}
    assert frontier == {cheap: "yes", dear: ""}


def test_costs_of_the_shortest_length_when_none_is_the_boards(tmp_path):
    results = write_results(tmp_path / "results", memory_rows())
    [board] = build_leaderboards(collect([results]).rows, [])
    costs = read_costs(write_costs(tmp_path / "speed", [cost("knorm", 0.5, tokens=t) for t in (8192, 2048)]))
    points, length = cost_points(board, costs)
    assert length == 2048 and len(points) == 1


def test_costs_of_another_model_are_not_set_beside_the_scores(tmp_path):
    results = write_results(tmp_path / "results", memory_rows())
    costs = write_costs(tmp_path / "speed", COSTS, model="qwen")  # a folder, as the API takes it
    readme = (render_report([results], tmp_path / "report", costs=costs) / "README.md").read_text()
    assert "not set beside this leaderboard: they were measured on qwen" in readme
    assert not (tmp_path / "report" / "smollm2-135m-1024-costs.png").exists()


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda folder: (folder / COSTS_FILE).write_text("{not json\n"), "costs.jsonl line 1"),
        (lambda folder: (folder / COSTS_FILE).write_text(""), "holds no costs.jsonl lines"),
        (lambda folder: (folder / COSTS_FILE).unlink(), "holds no costs.jsonl lines"),
        # what the view divides by: a zero would be a traceback, not a row
        (lambda folder: rewrite_first(folder, decode_none_tokens_per_s=0.0), "decode_none_tokens_per_s"),
        (lambda folder: rewrite_first(folder, allocated_bytes_full=0), "allocated_bytes_full"),
        (lambda folder: rewrite_first(folder, memory=1.5), "memory"),
    ],
)
def test_a_bad_costs_folder_is_one_line_exit_2_and_no_report(tmp_path, damage, message):
    results = write_results(tmp_path / "results", memory_rows())
    folder = write_costs(tmp_path / "speed", COSTS)
    damage(folder)
    out = tmp_path / "report"
    outcome = CliRunner().invoke(main, ["report", str(results), "--out", str(out), "--costs", str(folder)])
    assert outcome.exit_code == 2 and message in outcome.output
    assert len(outcome.output.strip().splitlines()) == 1 and not out.exists()


def test_costs_that_is_a_file_is_refused(tmp_path):
    results = write_results(tmp_path / "results", memory_rows())
    (tmp_path / "costs.jsonl").write_text("")
    out = tmp_path / "report"
    args = ["report", str(results), "--out", str(out), "--costs", str(tmp_path / "costs.jsonl")]
    outcome = CliRunner().invoke(main, args)
    assert outcome.exit_code == 2 and "costs.jsonl' is a file" in outcome.output and not out.exists()
