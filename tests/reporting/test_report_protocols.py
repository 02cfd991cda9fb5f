"""The report under every protocol: a board per protocol, never averaged across them; absolute budgets
with their own view and plot; score by question (multi-question) and by turn (multi-turn), their questions
one unit per context; rows without a score (perplexity) kept off the score boards."""

import re

import pytest
from scipy.stats import sem, t

from kvbench.reporting import render_report
from kvbench.reporting.boards import build_leaderboards
from kvbench.reporting.plots import budget_figure, press_styles
from kvbench.reporting.read import collect
from kvbench.store.results import config_id
from tests.reporting.test_report import make_row, rows_of, write_results


def budget_row(press, budget, task, index, score):
    """A row of a config given an absolute budget: ratio 0.0, memory None (as the planner writes it)."""
    return make_row(press, 0.0, task, index, score) | {
        "budget": budget,
        "kv_total": 1000 * 30 * 3,  # 1000 tokens x 30 layers x 3 KV heads
        "kv_kept": budget * 30 * 3,  # `budget` per head and layer
        "kv_bytes_kept": budget * 30 * 3 * 256,
        "config_id": config_id("smollm2-135m", press, 0.0, {}, budget=budget),
    }


def test_budget_configs_get_their_own_view_plot_and_labels(tmp_path):
    """Budget rows sit at ratio 0.0 like the reference: they must neither join it nor the ratio view."""
    rows = rows_of({("none", 0.0): {"t1": [100, 100]}, ("knorm", 0.5): {"t1": [50, 70]}})
    for press, by_budget in {
        "knorm": {64: [20, 40], 128: [60, 80]},
        "tova": {64: [40, 60], 128: [80, 100]},
    }.items():
        rows += [
            budget_row(press, budget, "t1", i, score)
            for budget, scores in by_budget.items()
            for i, score in enumerate(scores)
        ]
    configs = [{"press": "knorm", "ratio": 0.0, "press_args": [], "budget": b} for b in (64, 128, 256)]
    results = write_results(tmp_path / "r", rows, {"configs": configs, "tasks": ["t1"], "samples": 2})
    [board] = build_leaderboards(collect([results]).rows, collect([results]).runs, versus="knorm")

    assert board.reference.mean() == 100.0  # the budget rows at ratio 0.0 are not the reference
    assert board.ratio.average.to_dict() == {0.5: {"knorm": 60.0}}
    assert list(board.budget.average.columns) == [128.0, 64.0]  # most entries first
    assert board.budget.average.loc["tova"].tolist() == [90.0, 50.0]
    assert board.budget.average.loc["knorm"].tolist() == [70.0, 30.0]
    assert board.budget.missing == {("knorm", 256.0): ["t1 0/2"]}
    [lead_128, lead_64] = board.budget.lead.to_dict("records")
    assert (lead_128["best"], lead_128["lead"], lead_64["lead"]) == ("tova", 20.0, 20.0)
    # knorm (named) minus tova
    assert board.budget.versus.set_index(["press", "budget"]).at[("tova", 64.0), "difference"] == -20.0

    axes = budget_figure(board, press_styles(board.presses)).axes[0]
    assert axes.get_xscale() == "log" and sorted(axes.get_xticks()) == [64, 128]
    out = render_report([results], tmp_path / "report", versus="knorm")
    readme = (out / "README.md").read_text()
    assert "### Leaderboard by budget (KV entries per head)" in readme
    assert "| press | budget=128 | budget=64 | mean rank |" in readme
    # 2 pairs both +20: p = 2 / 2^2, and the test rejects no difference: not significant
    assert "| budget=128 | tova | knorm | +20.0 [-100.0, +100.0] | 0.500 | no | 2 |" in readme
    assert "knorm @ budget=256: t1 0/2" in readme
    kept = readme.split("### KV cache kept at each budget")[1].split("###")[0]
    assert (
        "| press | budget=128 | budget=64 |" in kept and "| tova | 12.8% (2.8 MiB) | 6.4% (1.4 MiB) |" in kept
    )
    assert (out / "smollm2-135m-1024-budget.png").is_file()


def question_rows(protocol, args, key, scores):
    """Rows of contexts asked several questions: `scores` press -> one list per question, one score per
    context; sample ids "<context>/<j>", meta {key: j} (0-based), as the engine writes them."""
    rows = []
    for press, per_question in scores.items():
        ratio = 0.0 if press == "none" else 0.5
        for question, values in enumerate(per_question):
            for context, score in enumerate(values):
                row = make_row(press, ratio, "t1", context, score)
                rows.append(
                    row
                    | {
                        "sample_id": f"t1-{context}/{question}",
                        "meta": {
                            key: question,
                            "context": f"t1-{context}",
                            "part": f"t1-{context}-{question}",
                        },
                        "protocol": protocol,
                        "protocol_args": args,
                        "config_id": row["config_id"] + protocol,
                    }
                )
    return rows


def test_multi_question_scores_by_question_with_contexts_as_units(tmp_path):
    scores = {"none": [[100] * 4, [100] * 4], "knorm": [[100] * 4, [0, 100, 0, 100]]}
    rows = question_rows("multi-question", {"questions": 2}, "question", scores)
    rows += rows_of({("none", 0.0): {"t1": [100, 100]}, ("knorm", 0.5): {"t1": [10, 30]}})  # query-agnostic
    results = write_results(tmp_path / "r", rows)
    agnostic, multi = build_leaderboards(collect([results]).rows, [])
    assert (agnostic.protocol, multi.protocol) == ("query-agnostic", "multi-question (questions=2)")
    assert agnostic.ratio.average.at["knorm", 0.5] == 20.0 and agnostic.parts is None  # never averaged
    assert multi.ratio.average.at["knorm", 0.5] == 75.0
    assert multi.parts.loc[("knorm", "ratio 0.5")].tolist() == [100.0, 50.0]
    # The two questions of a context share its cache: the units are the 4 contexts (means 50, 100, 50, 100),
    # a t interval on 3 degrees of freedom, not Wilson on 8 independent pass/fail answers.
    low, high = t.interval(0.95, 3, loc=75, scale=sem([50, 100, 50, 100]))
    assert (multi.ratio.low.at["knorm", 0.5], multi.ratio.high.at["knorm", 0.5]) == pytest.approx(
        (low, 100.0)
    )
    assert multi.ratio.samples.at["knorm", 0.5] == 8

    readme = (render_report([results], tmp_path / "report") / "README.md").read_text()
    assert re.search(
        r"## smollm2-135m, 1 task, length 1024 \(a cap: [^)]*\), multi-question \(questions=2\)\n", readme
    )
    assert "### Score by question" in readme and "| config | question 1 | question 2 |" in readme
    assert "| none @ ratio 0 | 100.0 | 100.0 |" in readme and "| knorm @ ratio 0.5 | 100.0 | 50.0 |" in readme
    assert readme.count("### Score by question") == 1  # not on the query-agnostic board


def test_multi_turn_scores_by_turn(tmp_path):
    scores = {"none": [[100, 100], [100, 100], [100, 0]], "tova": [[100, 100], [100, 0], [0, 0]]}
    results = write_results(tmp_path / "r", question_rows("multi-turn", {"turns": 3}, "turn", scores))
    [board] = build_leaderboards(collect([results]).rows, [])
    assert board.part_name == "turn"
    assert board.parts.loc[("tova", "ratio 0.5")].tolist() == [100.0, 50.0, 0.0]
    assert board.parts.loc[("none", "ratio 0")].tolist() == [100.0, 100.0, 50.0]
    readme = (render_report([results], tmp_path / "report") / "README.md").read_text()
    assert "### Score by turn" in readme and "| config | turn 1 | turn 2 | turn 3 |" in readme
    assert "| tova @ ratio 0.5 | 100.0 | 50.0 | 0.0 |" in readme


def test_rows_without_a_score_stay_off_the_score_boards(tmp_path):
    """Rows that record no score (a protocol whose rows measure something else) neither break the report
    nor count as zeros on any board; the report says how many it left out."""
    scored = rows_of({("none", 0.0): {"t1": [100, 80]}, ("knorm", 0.5): {"t1": [60, 40]}})
    unscored = [
        row
        | {
            "score": None,
            "protocol": "decode-time",
            "protocol_args": {"interval": 8},
            "config_id": row["config_id"] + "d",
        }
        for row in rows_of({("none", 0.0): {"t1": [0, 0]}, ("knorm", 0.5): {"t1": [0, 0]}})
    ]
    unscored_agnostic = make_row("tova", 0.5, "t1", 0, None)  # a row of the default protocol, no score
    results = write_results(tmp_path / "r", scored + unscored + [unscored_agnostic])
    [board] = build_leaderboards(collect([results]).rows, [])
    assert board.protocol == "query-agnostic" and board.ratio.average.to_dict() == {0.5: {"knorm": 50.0}}
    assert board.ratio.samples.at["knorm", 0.5] == 2
    readme = (render_report([results], tmp_path / "report") / "README.md").read_text()
    assert "Rows without a score (4 under decode-time (interval=8), 1 under query-agnostic" in readme
    assert "decode-time" not in readme.split("\n## ")[1].splitlines()[0] and readme.count("\n## ") == 1

    only = write_results(tmp_path / "only", unscored)
    readme = (render_report([only], tmp_path / "only-report") / "README.md").read_text()
    assert "Rows without a score (4 under decode-time (interval=8))" in readme and "\n## " not in readme


def test_rows_of_lm_eval_tasks_without_a_length_get_their_board(tmp_path):
    """lm-eval's tasks size their own samples (length None) and write protocol query-aware: a board of
    their own, beside kvbench's query-aware rows at a length, not dropped."""
    rows = [
        row | {"protocol": "query-aware", "config_id": row["config_id"] + "qa"}
        for length in (None, 1024)
        for row in rows_of(
            {("none", 0.0): {"t1": [100]}, ("knorm", 0.5): {"t1": [40 if length else 20]}}, length=length
        )
    ]
    results = write_results(tmp_path / "r", rows)
    boards = build_leaderboards(collect([results]).rows, [])
    assert [(board.length, board.protocol, board.ratio.average.at["knorm", 0.5]) for board in boards] == [
        (1024, "query-aware", 40.0),
        (None, "query-aware", 20.0),
    ]
    out = render_report([results], tmp_path / "report")
    readme = (out / "README.md").read_text()
    assert "## smollm2-135m, 1 task, each task's own length, query-aware" in readme
    assert (out / "smollm2-135m-query-aware-scores.png").is_file()


def test_each_protocols_board_cites_the_run_that_made_it(tmp_path):
    """A sweep records the protocol in each config, not beside them: a folder with a query-agnostic and a
    multi-turn run puts each run's command under its own board only."""
    scores = {"none": [[100, 100], [100, 0]], "tova": [[100, 0], [0, 0]]}
    turn_rows = question_rows("multi-turn", {"turns": 2}, "turn", scores)
    plain_rows = rows_of({("none", 0.0): {"t1": [100, 100]}, ("tova", 0.5): {"t1": [50, 0]}})
    multi_turn = [
        {"press": p, "ratio": r, "press_args": [], "protocol": "multi-turn", "protocol_args": [["turns", 2]]}
        for p, r in (("none", 0.0), ("tova", 0.5))
    ]
    results = write_results(tmp_path / "r", turn_rows, {"configs": multi_turn, "tasks": ["t1"], "samples": 5})
    plain = [{"press": p, "ratio": r, "press_args": []} for p, r in (("none", 0.0), ("tova", 0.5))]
    write_results(tmp_path / "r", plain_rows, {"configs": plain, "tasks": ["t1"], "samples": 2})
    collected = collect([results])
    boards = {board.protocol: board for board in build_leaderboards(collected.rows, collected.runs)}
    cited = {
        protocol: [[c.get("protocol", "query-agnostic") for c in run.config["configs"]] for run in board.runs]
        for protocol, board in boards.items()
    }
    assert cited == {
        "query-agnostic": [["query-agnostic", "query-agnostic"]],
        "multi-turn (turns=2)": [["multi-turn", "multi-turn"]],
    }
    # A multi-turn run's `samples` counts contexts (the held-out suite's 10 contexts give each of its 5
    # tasks 8 rows), so it sets no per-task count to miss; the configs are still compared with each other.
    assert boards["multi-turn (turns=2)"].ratio.missing == {}
