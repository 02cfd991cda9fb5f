"""kvbench report on small synthetic results folders with known scores."""

import base64
import itertools
import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from scipy.stats import permutation_test, ttest_1samp, ttest_ind

from kvbench.cli.report import report
from kvbench.reporting import render_report
from kvbench.reporting.boards import build_leaderboards
from kvbench.reporting.plots import (
    HIGHLIGHT,
    PRESS_LOOKS,
    heatmap_figure,
    press_style,
    press_styles,
    scores_figure,
)
from kvbench.reporting.read import collect, split_press_labels
from kvbench.reporting.stats import SignFlip, sign_flip_p
from kvbench.store.results import ResultsStore, Row, config_id
from tests.conftest import skip_drawing

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
BYTES_PER_ENTRY = 256  # keys + values of one head at head_dim 64 in fp16

# Two tasks with different sample counts, so the mean of task means differs from the mean of all samples.
# t1 samples have kv_total 1000 KV entries, t2 samples 2000; each entry takes BYTES_PER_ENTRY bytes.
SCORES = {
    ("none", 0.0): {"t1": [100, 80], "t2": [100, 100, 100, 60]},  # 90, 90
    ("knorm", 0.25): {"t1": [80, 80], "t2": [70, 70, 70, 70]},  # 80, 70 -> 75
    ("snapkv", 0.25): {"t1": [90, 90], "t2": [80, 80, 80, 80]},  # 90, 80 -> 85
    ("knorm", 0.5): {"t1": [50, 70], "t2": [80, 80, 40, 40]},  # 60, 60 -> 60
    ("snapkv", 0.5): {"t1": [100, 80], "t2": [20, 20, 20, 20]},  # 90, 20 -> 55 (all samples: 43.3)
}


@pytest.fixture(autouse=True)
def no_pixels(request, monkeypatch):
    """Figures built but not drawn, but in the tests marked `pixels`, which read the PNGs themselves."""
    if request.node.get_closest_marker("pixels") is None:
        skip_drawing(monkeypatch)


def make_row(press, ratio, task, index, score, model="smollm2-135m", length=1024):
    kv_total = 1000 if task == "t1" else 2000
    kv_kept = int(kv_total * (1 - ratio))
    return {
        "config_id": config_id(model, press, ratio, {}),
        "model": model,
        "press": press,
        "ratio": ratio,
        "press_args": {},
        "task": task,
        "sample_id": f"{task}-{index}",
        "length": length,
        "seed": 0,
        "prediction": "x",
        "references": ["x"],
        "score": score,
        "context_tokens": 900 + index,
        "kv_kept": kv_kept,
        "kv_total": kv_total,
        "kv_bytes_kept": kv_kept * BYTES_PER_ENTRY,
        "prefill_s": 0.1,
        "decode_s": 0.2,
    }


def rows_of(scores, **kwargs):
    return [
        make_row(press, ratio, task, i, score, **kwargs)
        for (press, ratio), tasks in scores.items()
        for task, values in tasks.items()
        for i, score in enumerate(values)
    ]


def write_results(folder: Path, rows: list[dict], run_config: dict | None = None) -> Path:
    store = ResultsStore(folder)
    for row in rows:
        store.append(Row.from_dict(row))
    if run_config is not None:
        store.write_run(
            {
                "command": "kvbench sweep --presses knorm,snapkv --ratios 0.25,0.5 --tasks t1,t2",
                "config": {"model": "smollm2-135m", "length": 1024, "seed": 0, "dtype": "float16"}
                | run_config,
                "versions": {"kvpress": "0.5.5", "torch": "2.15.0"},
                "hardware": {"machine": "x86_64", "cpus": 16, "gpu": "NVIDIA H200"},
                "git_commit": "abc1234",
                "started": "2026-01-01T00:00:00",
                "finished": "2026-01-01T00:10:00",
            }
        )
    return folder


def configs(presses: list[str], ratios: list[float]) -> list[dict]:
    """A run record's `configs`, as the runner writes them (`none` runs at ratio 0 only)."""
    return [{"press": "none", "ratio": 0.0, "press_args": []}] * ("none" in presses) + [
        {"press": press, "ratio": ratio, "press_args": []}
        for press in presses
        if press != "none"
        for ratio in ratios
    ]


@pytest.mark.pixels
def test_leaderboard_numbers_tables_and_plots(tmp_path):
    results = write_results(tmp_path / "results", rows_of(SCORES), {"tasks": ["t1", "t2"], "samples": 2})
    [board] = build_leaderboards(collect([results]).rows, collect([results]).runs)

    # Mean rank ties at 1.5; snapkv's higher mean average (70 vs 67.5) puts it first.
    assert list(board.ratio.average.index) == ["snapkv", "knorm"]
    assert board.ratio.average.loc["snapkv"].tolist() == pytest.approx([85.0, 55.0])
    assert board.ratio.average.loc["knorm"].tolist() == pytest.approx([75.0, 60.0])
    assert board.reference.mean() == pytest.approx(90.0)
    assert board.delta.loc["snapkv"].tolist() == pytest.approx([-5.0, -35.0])
    assert board.delta.loc["knorm"].tolist() == pytest.approx([-15.0, -30.0])
    assert board.ratio.rank.loc["snapkv"].tolist() == [1, 2]
    assert board.ratio.rank.loc["knorm"].tolist() == [2, 1]
    assert board.ratio.mean_rank.tolist() == [1.5, 1.5]
    # knorm @ 0.5 keeps half: t1 2 x 500 entries, t2 4 x 1000 entries.
    assert board.ratio.kept.loc[("knorm", 0.5), "kept_fraction"] == pytest.approx(0.5)
    assert board.ratio.kept.loc[("knorm", 0.5), "kept_bytes"] == pytest.approx((2 * 500 + 4 * 1000) / 6 * 256)
    assert board.ratio.samples.loc["knorm"].tolist() == [6, 6]
    assert not board.has_bytes and board.codecs == []  # no kv_bytes, no budgets: no memory leaderboard
    assert board.ratio.missing == {}
    # knorm @ 0.5: t1 [50, 70], t2 [80, 80, 40, 40]. The t interval of the mean of the two task means has half
    # the half-width of Welch's interval for their difference (same variance sum over 4, same freedom).
    welch = ttest_ind([50, 70], [80, 80, 40, 40], equal_var=False).confidence_interval()
    half_width = (welch.high - welch.low) / 4
    interval = board.ratio.low.loc["knorm", 0.5], board.ratio.high.loc["knorm", 0.5]
    assert interval == pytest.approx((60 - half_width, 60 + half_width))

    out = render_report([results], tmp_path / "report")
    readme = (out / "README.md").read_text()
    assert "mean of the per-task means" in readme
    assert "| press | 0.25 | 0.5 | mean rank |" in readme
    # Intervals inline; none at 0.25, where every sample scores alike (zero width is no interval). snapkv
    # @ 0.5 has t1 [100, 80] and t2 all 20: all its variance is t1's, of 1 degree of freedom, so t = 12.7
    # and the interval spans the whole score range (a normal one said 55.0 ± 9.8).
    assert "| snapkv | 85.0 | 55.0 [0.0, 100.0] | 1.50 |" in readme
    assert f"| knorm | 75.0 | 60.0 [{60 - half_width:.1f}, {60 + half_width:.1f}] | 1.50 |" in readme
    assert "Each cell averages 6 samples" in readme and not re.search(r"\(n=\d", readme)  # all hold 6
    assert "| knorm | -15.0 | -30.0 |" in readme
    assert "Leaderboard by memory" not in readme
    assert "No compression (`none`): 90.0" in readme
    assert "| t2 | 90.0 | 80.0 | 70.0 |" in readme  # ratio 0.25 breakdown: none, snapkv, knorm
    # 256 x 1250 B = 312.5 KiB and 256 x 5000 / 6 B = 208.3 KiB (rows of float16 runs: their kv_bytes_kept
    # is the 16-bit store already); the ratio 0 column is none's only.
    assert "| knorm |  | 75.0% (312.5 KiB) | 50.0% (208.3 KiB) |" in readme
    assert "kvbench sweep --presses knorm,snapkv" in readme and "abc1234" in readme
    assert "abc1234`, on NVIDIA H200 + 16 CPUs, started" in readme
    assert "| t2 | 4 | 902 |" in readme  # samples, mean context tokens (900..903)
    assert "Missing results" not in readme

    html = (out / "index.html").read_text()
    pngs = sorted(out.glob("*.png"))
    assert [p.name for p in pngs] == [
        "smollm2-135m-1024-scores.png",
        "smollm2-135m-1024-tasks-0.25.png",
        "smollm2-135m-1024-tasks-0.5.png",
    ]
    for png in pngs:
        data = png.read_bytes()
        assert data.startswith(PNG_SIGNATURE)
        assert base64.b64encode(data).decode() in html
        assert f"]({png.name})" in readme
    assert "<style>" in html and 'src="http' not in html


def test_partial_sweep_says_what_is_missing(tmp_path):
    partial = {
        ("none", 0.0): {"t1": [100, 80], "t2": [100, 80]},
        ("knorm", 0.25): {"t1": [60, 80], "t2": [80, 60]},
        ("knorm", 0.5): {"t1": [50, 70], "t2": [80, 40]},
        ("snapkv", 0.5): {"t1": [100]},  # interrupted: t1 1/2, t2 0/2, nothing at 0.25
    }
    config = {
        "configs": configs(["none", "knorm", "snapkv", "tova"], [0.25, 0.5]),
        "tasks": ["t1", "t2"],
        "samples": 2,
    }
    results = write_results(tmp_path / "results", rows_of(partial), config)
    [board] = build_leaderboards(collect([results]).rows, collect([results]).runs)
    assert board.ratio.missing == {
        ("snapkv", 0.25): ["t1 0/2", "t2 0/2"],
        ("snapkv", 0.5): ["t1 1/2", "t2 0/2"],
        ("tova", 0.25): ["t1 0/2", "t2 0/2"],
        ("tova", 0.5): ["t1 0/2", "t2 0/2"],
    }
    assert board.ratio.average.loc["snapkv", 0.5] == pytest.approx(100.0)  # its only task
    assert board.delta.loc["snapkv", 0.5] == pytest.approx(10.0)  # on t1, the one task both ran
    assert board.ratio.mean_rank.to_dict() == {"snapkv": 1.0, "knorm": 1.5}  # snapkv ranked at 0.5 only

    readme = (render_report([results], tmp_path / "report") / "README.md").read_text()
    assert "snapkv @ ratio 0.5: t1 1/2, t2 0/2" in readme
    assert "tova @ ratio 0.5: t1 0/2, t2 0/2" in readme
    # One sample of 100, pass/fail: Wilson's interval for 1 of 1, [20.7, 100]; the other cells hold 4 samples.
    assert "| snapkv |  | 100.0 [20.7, 100.0]* (n=1) | 1.00 |" in readme
    assert "| t1 | 90.0 | 100.0 (n=1) | 60.0 |" in readme  # ratio 0.5 breakdown: none, snapkv, knorm


def test_requested_samples_above_what_any_config_has(tmp_path):
    scores = {("none", 0.0): {"t1": [100]}, ("knorm", 0.5): {"t1": [50]}}
    config = {"configs": configs(["none", "knorm"], [0.5]), "tasks": ["t1"], "samples": 3}
    results = write_results(tmp_path / "results", rows_of(scores), config)
    [board] = build_leaderboards(collect([results]).rows, collect([results]).runs)
    assert board.ratio.missing == {("knorm", 0.5): ["t1 1/3"], ("none", 0.0): ["t1 1/3"]}


def test_two_models_get_separate_leaderboards(tmp_path):
    small = write_results(tmp_path / "small", rows_of(SCORES))
    other_scores = {("none", 0.0): {"t1": [0, 0]}, ("knorm", 0.5): {"t1": [10, 30]}}
    other = write_results(tmp_path / "other", rows_of(other_scores, model="Qwen/Qwen2.5-7B-Instruct"))
    collected = collect([small, other])
    boards = {board.model: board for board in build_leaderboards(collected.rows, collected.runs)}
    assert boards["smollm2-135m"].ratio.average.loc["knorm", 0.5] == pytest.approx(
        60.0
    )  # unchanged by the other
    assert boards["Qwen/Qwen2.5-7B-Instruct"].ratio.average.loc["knorm", 0.5] == pytest.approx(20.0)

    out = render_report([small, other], tmp_path / "report")
    readme = (out / "README.md").read_text()
    assert "2 models (Qwen/Qwen2.5-7B-Instruct, smollm2-135m)" in readme
    assert "never averaged across models" in readme
    assert (out / "Qwen-Qwen2.5-7B-Instruct-1024-scores.png").is_file()


def test_corrupt_line_is_skipped_and_report_renders(tmp_path):
    results = write_results(tmp_path / "results", rows_of(SCORES))
    with open(results / "rows.jsonl", "a") as file:
        file.write('{"model": "smollm2-135m", "pre\n')  # a corrupt line amid good rows
    with pytest.warns(UserWarning, match="rows.jsonl:31"):  # the store reads its rows when it opens
        write_results(results, rows_of({("tova", 0.5): {"t1": [40]}}))
    with pytest.warns(UserWarning, match="rows.jsonl"):
        collected = collect([results])
    [board] = build_leaderboards(collected.rows, collected.runs)
    assert board.ratio.average.loc["snapkv"].tolist() == pytest.approx([85.0, 55.0])
    with pytest.warns(UserWarning, match="rows.jsonl"):
        readme = (render_report([results], tmp_path / "report") / "README.md").read_text()
    assert "Skipped while reading" in readme and "rows.jsonl:31: skipped a corrupt results row" in readme
    assert "| snapkv | 85.0 | 55.0 [0.0, 100.0] | 1.50 |" in readme
    assert "| tova |  | 40.0* (n=1) |" in readme  # the row after the corrupt line counts


def test_cli_writes_report(tmp_path):
    results = write_results(tmp_path / "results", rows_of(SCORES))
    out = tmp_path / "reports" / "sweep"
    outcome = CliRunner().invoke(report, [str(results), "--out", str(out)])
    assert outcome.exit_code == 0, outcome.output
    assert (out / "README.md").is_file() and (out / "index.html").is_file()
    assert "No runs/*.json (a run still going, or interrupted?)" in (out / "README.md").read_text()


def test_cli_path_without_results_is_a_usage_error(tmp_path):
    (tmp_path / "empty").mkdir()
    outcome = CliRunner().invoke(report, [str(tmp_path / "empty"), "--out", str(tmp_path / "report")])
    assert outcome.exit_code == 2
    assert "holds no results" in outcome.output
    assert not (tmp_path / "report").exists()


def test_longbench_categories_and_length_buckets(tmp_path):
    scores = {
        ("none", 0.0): {
            "longbench/qasper": [40, 60],
            "longbench/narrativeqa": [30],
            "longbench/hotpotqa": [80, 80, 20],
        },
        ("knorm", 0.5): {"longbench/qasper": [20], "longbench/narrativeqa": [10], "longbench/hotpotqa": [30]},
    }
    rows = rows_of(scores)
    # LongBench-E: buckets on the sample's length in words (meta["length"]): 0-4k, 4-8k, 8k+.
    for task, words_and_scores in {
        "longbench-e/qasper": [(1000, 80), (5000, 40), (9000, 20)],
        "longbench-e/hotpotqa": [(2000, 60), (6000, 20)],
    }.items():
        for i, (words, score) in enumerate(words_and_scores):
            rows.append(make_row("none", 0.0, task, i, score) | {"meta": {"length": words}})
    results = write_results(tmp_path / "results", rows)
    [board] = build_leaderboards(collect([results]).rows, collect([results]).runs)

    longbench = board.longbench["longbench"]
    assert longbench.loc[("none", 0.0)].to_dict() == pytest.approx(
        {"Single-Doc QA": 40.0, "Multi-Doc QA": 60.0, "Average": 140 / 3}
    )
    assert longbench.loc[("knorm", 0.5)].to_dict() == pytest.approx(
        {"Single-Doc QA": 15.0, "Multi-Doc QA": 30.0, "Average": 20.0}
    )
    assert board.longbench["longbench-e"].loc[("none", 0.0)].to_dict() == pytest.approx(
        {"Single-Doc QA": 140 / 3, "Multi-Doc QA": 40.0, "Average": (140 / 3 + 40) / 2}
    )
    assert board.longbench_e_buckets.loc[("none", 0.0)].to_dict() == pytest.approx(
        {"0-4k": 70.0, "4-8k": 30.0, "8k+": 20.0}
    )

    readme = (render_report([results], tmp_path / "report") / "README.md").read_text()
    assert "### LongBench by category" in readme
    assert "| none @ 0 | 40.0 | 60.0 | 46.7 |" in readme
    assert "| knorm @ 0.5* | 15.0 | 30.0 | 20.0 |" in readme  # fewer samples than none: incomplete
    assert "| none @ 0 | 70.0 | 30.0 | 20.0 |" in readme


def test_press_arguments_keep_configs_apart_and_reference_alone_renders(tmp_path):
    rows = [
        make_row("kvp", 0.5, "t1", 0, 50) | {"press_args": {"agent": "a"}, "config_id": "kvp-a"},
        make_row("kvp", 0.5, "t1", 0, 70) | {"press_args": {"agent": "b"}, "config_id": "kvp-b"},
        make_row("knorm", 0.5, "t1", 0, 70),
    ]
    results = write_results(tmp_path / "results", rows)
    [board] = build_leaderboards(collect([results]).rows, collect([results]).runs)
    assert board.ratio.average[0.5].to_dict() == {"knorm": 70.0, "kvp(agent=b)": 70.0, "kvp(agent=a)": 50.0}
    assert board.ratio.rank[0.5].to_dict() == {"knorm": 1, "kvp(agent=b)": 1, "kvp(agent=a)": 3}  # ties share

    reference_only = write_results(tmp_path / "reference", rows_of({("none", 0.0): {"t1": [100, 50]}}))
    out = render_report([reference_only], tmp_path / "report")
    readme = (out / "README.md").read_text()
    assert "No compression (`none`): 75.0" in readme and "nothing to rank" in readme
    assert not list(out.glob("*.png"))


def test_rows_of_older_learned_state_are_set_aside(tmp_path):
    rows = rows_of({("none", 0.0): {"t1": [100, 100]}, ("kvp", 0.5): {"t1": [0, 0]}})
    retrained = {
        "press_state": "new-agents",
        "config_id": config_id("smollm2-135m", "kvp", 0.5, {}, "new-agents"),
    }
    rows += [make_row("kvp", 0.5, "t1", i, score) | retrained for i, score in enumerate([100, 50])]
    [board] = build_leaderboards(collect([write_results(tmp_path / "r", rows)]).rows, [])
    assert board.ratio.average.loc["kvp", 0.5] == pytest.approx(75.0)  # the new agents' rows only
    readme = (render_report([tmp_path / "r"], tmp_path / "report") / "README.md").read_text()
    assert "kvp on smollm2-135m: rows of 2 versions" in readme and "latest (new-agents)" in readme
    assert "sets aside 2 rows" in readme


def test_every_state_reports_older_agents_as_a_press_of_their_own(tmp_path):
    rows = rows_of({("none", 0.0): {"t1": [100, 100]}, ("kvp", 0.5): {"t1": [0, 100]}})
    rows = [row | {"press_state": "old-agents"} if row["press"] == "kvp" else row for row in rows]
    retrained = {
        "press_state": "new-agents",
        "config_id": config_id("smollm2-135m", "kvp", 0.5, {}, "new-agents"),
    }
    rows += [make_row("kvp", 0.5, "t1", i, score) | retrained for i, score in enumerate([100, 100])]
    results = write_results(tmp_path / "r", rows)
    [board] = build_leaderboards(collect([results], every_state=True).rows, [], versus="kvp@old-agents")
    assert board.ratio.average[0.5].to_dict() == {"kvp": 100.0, "kvp@old-agents": 50.0}
    versus = board.ratio.versus.set_index(["press", "ratio"])
    assert versus.at[("kvp", 0.5), "difference"] == pytest.approx(-50.0)  # old (named) minus new, paired
    readme = (render_report([results], tmp_path / "report", every_state=True) / "README.md").read_text()
    assert "reports the older ones as kvp@STATE" in readme and "sets aside" not in readme


FULL_BYTES = {"t1": 1000 * BYTES_PER_ENTRY, "t2": 2000 * BYTES_PER_ENTRY}  # the 16-bit cache, uncompressed


def memory_rows() -> list[dict]:
    """Evictors and codecs with bytes: knorm by ratio and by budget; quant, a codec, by ratio (every entry
    kept, half the bytes) and by budget (storing less than asked)."""
    rows = []

    def add(press, ratio, memory, kept_fraction, stored_fraction, scores):
        for task, values in scores.items():
            for i, score in enumerate(values):
                row = make_row(press, ratio, task, i, score)
                row["kv_kept"] = int(row["kv_total"] * kept_fraction)
                row["kv_bytes"] = int(FULL_BYTES[task] * stored_fraction)
                row["kv_bytes_full"] = FULL_BYTES[task]
                row["memory"] = memory
                row["config_id"] = f"{press}-{ratio}-{memory}"
                rows.append(row)

    add("none", 0.0, None, 1.0, 1.0, {"t1": [100, 80], "t2": [100, 100, 100, 60]})
    add("knorm", 0.5, None, 0.5, 0.5, {"t1": [50, 70], "t2": [80, 80, 40, 40]})
    add("knorm", 0.5, 0.5, 0.5, 0.5, {"t1": [60, 80], "t2": [80, 60, 40, 40]})
    add("knorm", 0.75, 0.25, 0.25, 0.25, {"t1": [30, 10], "t2": [20, 20]})
    add("quant", 0.5, None, 1.0, 0.48, {"t1": [90, 90], "t2": [90, 70, 80, 80]})
    add("quant", 0.0, 0.25, 1.0, 0.2, {"t1": [70, 50], "t2": [60, 60, 40]})
    return rows


@pytest.mark.pixels
def test_memory_leaderboard_matches_pandas(tmp_path):
    rows = memory_rows()
    results = write_results(tmp_path / "results", rows)
    [board] = build_leaderboards(collect([results]).rows, [])

    # quant keeps every entry: its ratio says nothing, so it leaves the ratio view for the memory view,
    # at budget 1 - ratio when it was run with a ratio.
    assert board.codecs == ["quant"] and list(board.ratio.average.index) == ["knorm"]
    assert board.ratio.average.loc["knorm", 0.5] == pytest.approx(60.0)
    frame = pd.DataFrame(rows)
    codec = (frame["press"] == "quant") & frame["memory"].isna()
    frame["budget"] = frame["memory"].where(~codec, 1 - frame["ratio"])
    frame = frame[frame["budget"].notna()]
    expected = frame.groupby(["press", "budget", "task"])["score"].mean().groupby(["press", "budget"]).mean()
    measured = (frame["kv_bytes"] / frame["kv_bytes_full"]).groupby([frame["press"], frame["budget"]]).mean()
    view = board.memory
    for (press, budget), value in expected.items():
        assert view.average.loc[press, budget] == pytest.approx(value)
        assert view.measured.loc[press, budget] == pytest.approx(measured[(press, budget)])
    assert view.average.notna().sum().sum() == len(expected)
    assert list(view.average.columns) == [0.5, 0.25]  # most memory first, as ratios go least compressed first
    assert view.samples.loc["knorm", 0.25] == 4 and view.samples.loc["quant", 0.5] == 6
    # The plot puts every compressed config at its measured memory: knorm run with ratio 0.5 at 0.5 too.
    points = board.memory_points.set_index(["press", "memory"])["average"].sort_index()
    assert points.loc[("knorm", 0.5)].tolist() == pytest.approx([60.0, 62.5])

    out = render_report([results], tmp_path / "report")
    readme = (out / "README.md").read_text()
    assert "| press | budget 0.5 | budget 0.25 | mean rank |" in readme
    # quant @ 0.25: t1 [70, 50], t2 [60, 60, 40] (half Welch's half-width, as in the first test); it stored
    # 0.2 of the bytes when 0.25 was allowed; 5 samples where most cells hold 6 (`*`: fewer than the fullest
    # config of each task).
    welch = ttest_ind([70, 50], [60, 60, 40], equal_var=False).confidence_interval()
    half_width = (welch.high - welch.low) / 4
    assert f"56.7 [{170 / 3 - half_width:.1f}, {170 / 3 + half_width:.1f}]* (stores 0.2, n=5)" in readme
    assert "| quant | 85.0 [" in readme and "] (stores 0.48) |" in readme
    assert "Codecs left out here: `quant`" in readme
    assert (out / "smollm2-135m-1024-memory.png").read_bytes().startswith(PNG_SIGNATURE)


def test_protocols_are_never_averaged_together(tmp_path):
    rows = rows_of({("none", 0.0): {"t1": [100, 100]}, ("knorm", 0.5): {"t1": [80, 60]}})
    for protocol, args, score in [("decode-time", {"interval": 16}, 20), ("streaming", {"chunk": 256}, 40)]:
        for row in rows_of({("none", 0.0): {"t1": [90, 90]}, ("knorm", 0.5): {"t1": [score, score]}}):
            rows.append(
                row | {"protocol": protocol, "protocol_args": args, "config_id": row["config_id"] + protocol}
            )
    results = write_results(tmp_path / "results", rows)
    boards = build_leaderboards(collect([results]).rows, [])
    assert [board.protocol for board in boards] == [
        "query-agnostic",
        "decode-time (interval=16)",
        "streaming (chunk=256)",
    ]
    assert [board.ratio.average.loc["knorm", 0.5] for board in boards] == pytest.approx([70.0, 20.0, 40.0])
    assert [board.reference.mean() for board in boards] == pytest.approx([100.0, 90.0, 90.0])

    out = render_report([results], tmp_path / "report")
    readme = (out / "README.md").read_text()
    assert re.search(r"## smollm2-135m, 1 task, length 1024 \(a cap: [^)]*\), query\-agnostic\n", readme)
    assert re.search(
        r"## smollm2-135m, 1 task, length 1024 \(a cap: [^)]*\), decode\-time\ \(interval=16\)\n", readme
    )
    assert re.search(
        r"## smollm2-135m, 1 task, length 1024 \(a cap: [^)]*\), streaming\ \(chunk=256\)\n", readme
    )
    assert "| knorm | 20.0 | 1.00 |" in readme and "| knorm | 70.0 [0.0, 100.0] | 1.00 |" in readme
    assert (out / "smollm2-135m-1024-decode-time-interval-16-scores.png").is_file()
    assert (out / "smollm2-135m-1024-streaming-chunk-256-scores.png").is_file()


def test_unfinished_run_reads_without_none_or_nan(tmp_path):
    long_command = "kvbench sweep " + " ".join(f"--task niah_single_{i}" for i in range(30))
    partial = {("none", 0.0): {"t1": [100], "t2": [50]}, ("knorm", 0.5): {"t1": [60]}}  # no t2, one sample
    results = write_results(tmp_path / "results", rows_of(partial))
    ResultsStore(results).write_run(
        {
            "command": long_command,
            "config": {"model": "smollm2-135m", "length": 1024, "tasks": ["t1", "t2"], "samples": 2},
            "versions": {"kvpress": "0.5.5"},
            "git_commit": None,
            "started": "2026-01-01T00:00:00.123456+00:00",
            "finished": None,
        }
    )
    out = render_report([results], tmp_path / "report")
    readme = (out / "README.md").read_text()
    page = re.sub(r'src="data:[^"]*"', "", (out / "index.html").read_text())
    for text in (readme, page):
        assert not re.search(r"\bNone\b", text) and not re.search(r"\bnan\b", text, re.IGNORECASE)
        assert "unfinished (no end time recorded" in text and "started 2026-01-01 00:00:00 UTC" in text
    [code] = [block.splitlines() for block in readme.split("```\n") if block.startswith("kvbench sweep")]
    assert len(code) > 1 and all(len(line) <= 100 for line in code)
    assert all(line.endswith(" \\") for line in code[:-1])
    assert " ".join(line.removesuffix(" \\").strip() for line in code) == long_command
    assert "white-space: pre-wrap" in page
    # One header row per table, in both renderings.
    heads = re.findall(r"<thead>(.*?)</thead>", page, re.DOTALL)
    assert heads and all(head.count("<tr>") == 1 for head in heads)
    tables = [block.splitlines() for block in readme.split("\n\n") if block.startswith("| ")]
    assert tables and all(
        set(table[2].strip("| ").split(" | ")) != {""} for table in tables if len(table) > 2
    )


def test_report_reads_the_folder_only_unless_recursive(tmp_path):
    results = write_results(tmp_path / "results", rows_of(SCORES))
    other = rows_of({("knorm", 0.5): {"t1": [10]}}, model="Qwen/Qwen2.5-7B-Instruct")
    write_results(tmp_path / "results" / "reference", other)
    assert collect([results]).rows["model"].unique().tolist() == ["smollm2-135m"]
    assert sorted(collect([results], recursive=True).rows["model"].unique()) == [
        "Qwen/Qwen2.5-7B-Instruct",
        "smollm2-135m",
    ]
    for flags, models in [([], 1), (["--recursive"], 2)]:
        out = tmp_path / f"report-{models}"
        outcome = CliRunner().invoke(report, [str(results), "--out", str(out), *flags])
        assert outcome.exit_code == 0, outcome.output
        assert ("Qwen" in (out / "README.md").read_text()) == (models == 2)

    outcome = CliRunner().invoke(report, [str(tmp_path), "--out", str(tmp_path / "report")])
    assert outcome.exit_code == 2 and "pass --recursive" in outcome.output


def test_a_file_of_garbage_is_one_warning(tmp_path):
    results = write_results(tmp_path / "results", rows_of(SCORES))
    with open(results / "rows.jsonl", "a") as file:
        file.writelines(f"garbage {i}\n" for i in range(111))
    outcome = CliRunner().invoke(report, [str(results), "--out", str(tmp_path / "report")])
    assert outcome.exit_code == 0, outcome.output
    warned = [line for line in outcome.output.splitlines() if "skipped" in line]
    assert (
        len(warned) == 1 and "skipped 111 corrupt results rows (lines 31, 32, 33, 34, 35, ...)" in warned[0]
    )
    readme = (tmp_path / "report" / "README.md").read_text()
    assert readme.count("Skipped while reading") == 1

    (tmp_path / "garbage").mkdir()
    (tmp_path / "garbage" / "rows.jsonl").write_text("".join(f"garbage {i}\n" for i in range(111)))
    outcome = CliRunner().invoke(report, [str(tmp_path / "garbage"), "--out", str(tmp_path / "nothing")])
    assert outcome.exit_code == 2 and len(outcome.output.splitlines()) <= 5, outcome.output
    assert len([line for line in outcome.output.splitlines() if "skipped" in line]) == 1
    assert "no result rows" in outcome.output


def test_a_press_looks_the_same_in_every_report():
    """A press's colour and marker come from its name alone, whatever else a report holds; the presses
    reports show together differ in colour; a variant of a press is dashed; no press is black."""
    reference = [
        "kvp",
        "streaming_llm",
        "tova",
        "distillcache",
        "h2o",
        "snapkv",
        "knorm",
        "expected_attention",
    ]
    alone, among_others = press_styles(["kvp"]), press_styles(sorted(reference + ["random", "quant"]))
    assert alone["kvp"] == among_others["kvp"] == press_style("kvp")
    new = (
        "zz_new_press"  # not in PRESS_LOOKS: its look from a stable hash of its name, not Python's salted one
    )
    assert press_styles([new])[new] == press_styles(["kvp", new])[new]
    other_process = subprocess.run(
        [
            sys.executable,
            "-c",
            f"from kvbench.reporting.plots import press_style; print(press_style({new!r}))",
        ],
        env={**os.environ, "PYTHONHASHSEED": "12345"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert other_process.stdout.strip() == repr(press_style(new))
    for together in (
        [*reference, "random"],
        ["kvp", "streaming_llm", "knorm", "compactor", "leverage", "cap", "kvzip", "lagkv"]
        + ["non_causal_attention", "keydiff", "pyramidkv", "cur"],
        ["kvp", "tova", "distillcache", "knorm", "snapkv", "streaming_llm", "qevict", "quant"]
        + ["andpro", "lowrank", "varrate"],
    ):
        colours = [press_style(press).color for press in together]
        assert len(set(colours)) == len(together), together
    looks = {(press_style(p).color, press_style(p).marker) for p in PRESS_LOOKS}
    assert len(looks) == len(PRESS_LOOKS)  # every named press its own look
    variants = ["kvp@58260c05679a", "kvp(agents=agents/old)", "snapkv(window_size=8)"]
    assert all(press_style(press).linestyle == "--" for press in variants)
    assert all((press_style(press).color, press_style(press).marker) not in looks for press in variants)
    assert press_style("kvp").linestyle == "-"
    assert "#000000" not in {press_style(press).color for press in [*PRESS_LOOKS, *variants]}


def test_the_leaders_lead_is_paired_by_sample(tmp_path):
    """Two presses whose scores swing together from sample to sample: their intervals overlap, but the
    paired lead (a - b on each sample, mean of the per-task means) is beyond noise. A sample only one of
    them scored is no pair."""
    a = {"t1": [90, 30, 80, 20], "t2": [70, 12, 60, 12, 50]}  # b, 10-12 lower, stays in [0, 100]
    gaps = [10, 12, 10, 12]
    b = {
        "t1": [s - g for s, g in zip(a["t1"], gaps, strict=True)],
        "t2": [s - g for s, g in zip(a["t2"], gaps, strict=False)],  # b lacks t2's fifth sample
    }
    results = write_results(tmp_path / "results", rows_of({("a", 0.5): a, ("b", 0.5): b}))
    [board] = build_leaderboards(collect([results]).rows, collect([results]).runs)
    [lead] = board.ratio.lead.to_dict("records")
    assert (lead["ratio"], lead["best"], lead["runner-up"], lead["pairs"]) == (0.5, "a", "b", 8)
    assert lead["lead"] == pytest.approx(11.0)  # t2's fifth sample (a only) left out
    assert_inverts_the_test(gaps + gaps, [1 / 8] * 8, lead["low"], lead["high"], lead["p"])
    assert board.ratio.low.at["a", 0.5] < board.ratio.high.at["b", 0.5]  # the intervals overlap
    assert lead["low"] > 0  # the paired lead stays clear of zero


def test_versus_compares_every_press_to_the_baseline_paired_by_sample(tmp_path):
    """a against b and c: b trails a by the same 10-12 on every sample (beyond noise though the intervals
    overlap); c is a plus a little noise. The table reads a minus each (the press named first), and the
    CLI refuses an unknown press."""
    a = {"t1": [90, 30, 80, 20], "t2": [70, 12, 60, 12]}  # b, 10-12 lower, stays in [0, 100]
    gaps = {"t1": [10, 12, 10, 12], "t2": [12, 10, 12, 10]}
    b = {task: [s - g for s, g in zip(a[task], gaps[task], strict=True)] for task in a}
    c = {"t1": [95, 25, 80, 20], "t2": [70, 12, 65, 12]}
    scores = {("a", 0.5): a, ("b", 0.5): b, ("c", 0.5): c, ("a", 0.75): a}
    results = write_results(tmp_path / "results", rows_of(scores))
    [board] = build_leaderboards(collect([results]).rows, collect([results]).runs, versus="a")
    versus = board.ratio.versus.set_index(["press", "ratio"])
    assert set(versus.index) == {("b", 0.5), ("c", 0.5)}  # only where a was scored too; not a itself
    assert versus.at[("b", 0.5), "difference"] == pytest.approx(11.0)
    low, high, p = versus.loc[("b", 0.5), ["low", "high", "p"]]
    assert_inverts_the_test(gaps["t1"] + gaps["t2"], [1 / 8] * 8, low, high, p)
    # a - c: t1 -5, +5, 0, 0 (mean 0), t2 0, 0, -5, 0 (mean -1.25): the mean of the task means
    assert versus.at[("c", 0.5), "difference"] == pytest.approx(-0.625)
    assert versus.at[("b", 0.5), "pairs"] == 8

    outcome = CliRunner().invoke(report, [str(results), "--out", str(tmp_path / "r"), "--versus", "a"])
    assert outcome.exit_code == 0, outcome.output
    readme = (tmp_path / "r" / "README.md").read_text()
    assert f"| b | **+11.0 [{low:+.1f}, {high:+.1f}]** |" in readme and low > 0  # excludes 0
    assert "| c | -0.6 [" in readme and "| c | **" not in readme
    assert "\n| a minus | 0.5 |\n" in readme
    outcome = CliRunner().invoke(report, [str(results), "--out", str(tmp_path / "r2"), "--versus", "z"])
    assert outcome.exit_code != 0 and "--versus 'z' is not a press of these results" in str(outcome.exception)
    assert not (tmp_path / "r2" / "README.md").exists()


def brute_force_p(differences, weights):
    """The two-sided sign-flip p-value by enumerating every one of the 2^n sign assignments."""
    observed = abs(sum(w * d for w, d in zip(weights, differences, strict=True)))
    extreme = [
        abs(sum(s * w * d for s, w, d in zip(signs, weights, differences, strict=True))) >= observed - 1e-9
        for signs in itertools.product((1, -1), repeat=len(differences))
    ]
    return sum(extreme) / len(extreme)


def assert_inverts_the_test(differences, weights, low, high, p):
    """[low, high] is the sign-flip test inverted, by enumeration: its ends are not rejected at 5 %, a shift
    just past an end is (unless the end is the range's), and it excludes 0 exactly where p < 0.05."""
    differences, weights = np.asarray(differences, dtype=float), np.asarray(weights, dtype=float)

    def shifted(shift):
        return brute_force_p(differences - shift, weights)

    assert p == pytest.approx(shifted(0.0))
    inside = min(1e-6, (high - low) / 2)  # an end sits on a tie, where rounding decides: just inside
    assert shifted(low + inside) >= 0.05 and shifted(high - inside) >= 0.05
    assert low == -100 or shifted(low - 1e-6) < 0.05
    assert high == 100 or shifted(high + 1e-6) < 0.05
    assert (low > 0 or high < 0) == (p < 0.05)


@pytest.mark.parametrize("seed", range(12))
def test_the_paired_interval_is_the_sign_flip_test_inverted(seed):
    """Random small samples (ties, zeros, unequal weights as unequal tasks give): the interval's ends are
    where the brute-force test's verdict changes, and it excludes 0 exactly where p < 0.05."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 12))
    differences = rng.choice([-50.0, -10.0, 0.0, 5.0, 10.0, 20.0, 50.0], size=n) + rng.integers(0, 3, n)
    weights = rng.choice([1.0, 0.5, 0.25], size=n)
    weights = weights / weights.sum()
    test = SignFlip(differences, weights)
    low, high = test.interval()
    assert low <= test.estimate <= high
    assert_inverts_the_test(differences, weights, low, high, test.p(0.0))


@pytest.mark.parametrize("seed", range(6))
def test_no_report_line_calls_an_interval_clear_of_zero_not_significant(tmp_path, seed):
    """Random sweeps of 3 presses on 2 tasks, 3 to 12 samples each: on every line of the lead table and of
    the --versus table, the interval excludes 0 exactly where the line says significant (yes, or bold)."""
    rng = np.random.default_rng(seed)
    counts = {"t1": int(rng.integers(3, 13)), "t2": int(rng.integers(3, 13))}
    shift = {"a": 0, "b": int(rng.integers(0, 30)), "c": int(rng.integers(-30, 5))}
    base = {task: rng.integers(20, 80, size=count) for task, count in counts.items()}
    scores = {
        (press, ratio): {
            task: np.clip(values + gap + rng.integers(-15, 16, len(values)), 0, 100).tolist()
            for task, values in base.items()
        }
        for press, gap in shift.items()
        for ratio in (0.25, 0.5)
    }
    results = write_results(tmp_path / "results", rows_of(scores))
    readme = (render_report([results], tmp_path / "r", versus="a") / "README.md").read_text()
    interval = r"([+-]\d+\.\d) \[([+-]\d+\.\d), ([+-]\d+\.\d)\]"
    leads = re.findall(rf"\| {interval} \| [<\d.]+ \| (yes|no) \|", readme)
    lines = [line for line in readme.splitlines() if line.startswith(("| b | ", "| c | "))]
    cells = [cell for line in lines for cell in line.strip("| ").split(" | ")]
    versus = [re.fullmatch(rf"(\*\*)?{interval}(\*\*)?", cell) for cell in cells]
    versus = [match.groups() for match in versus if match]
    assert len(leads) == 2 and len(versus) == 4
    for _, low, high, verdict in leads:
        assert (float(low) > 0 or float(high) < 0) == (verdict == "yes")
    for bold, _, low, high, _ in versus:
        assert (float(low) > 0 or float(high) < 0) == (bold == "**")


@pytest.mark.parametrize("seed", range(6))
def test_sign_flip_p_matches_enumeration_on_small_samples(seed):
    """Random small samples (ties, zeros, unequal weights as unequal tasks give): scipy's exact test equals
    the brute-force count of sign assignments; beyond 16 units the seeded Monte-Carlo is reproducible and
    close to a large-sample check."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 11))
    differences = rng.choice([-50.0, -10.0, 0.0, 5.0, 10.0, 50.0], size=n)
    weights = rng.choice([1.0, 0.5, 0.25], size=n)
    assert sign_flip_p(differences, weights) == pytest.approx(brute_force_p(differences, weights))
    statistic = lambda x, axis=-1: np.sum(weights * x, axis=axis)  # noqa: E731
    scipys = permutation_test((differences,), statistic, permutation_type="samples", vectorized=True)
    assert sign_flip_p(differences, weights) == pytest.approx(scipys.pvalue)
    many = rng.normal(1.0, 3.0, size=40)
    first = sign_flip_p(many, np.ones(40) / 40)
    assert first == sign_flip_p(many, np.ones(40) / 40)  # seeded
    assert first == pytest.approx(ttest_1samp(many, 0).pvalue, abs=0.05)


@pytest.mark.parametrize("pairs, gap", [(4, 50), (5, 50), (3, 1), (4, -20)])
def test_a_few_identical_differences_are_not_called_significant(tmp_path, pairs, gap):
    """4 pairs all +50: a t interval would be [+50, +50] (zero width), yet 2 of the 2^4 sign assignments are
    as extreme, p = 0.125. With 5 pairs or fewer the sign-flip test rejects no difference, so its interval
    is the whole range: the report calls it significant nowhere (not in the lead table, not in bold in
    --versus); 5 pairs (p = 0.0625) neither. Smaller gaps the same."""
    a = {"t1": [60.0] * pairs}
    b = {"t1": [60.0 - gap] * pairs}
    results = write_results(tmp_path / "results", rows_of({("a", 0.5): a, ("b", 0.5): b}))
    [board] = build_leaderboards(collect([results]).rows, collect([results]).runs, versus="b")
    [lead] = board.ratio.lead.to_dict("records")
    assert lead["p"] == pytest.approx(2 / 2**pairs) and lead["p"] > 0.05
    assert (lead["low"], lead["high"]) == (-100.0, 100.0)  # no difference is rejected
    outcome = CliRunner().invoke(report, [str(results), "--out", str(tmp_path / "r"), "--versus", "b"])
    assert outcome.exit_code == 0, outcome.output
    readme = (tmp_path / "r" / "README.md").read_text()
    assert f"| {abs(gap):+.1f} [-100.0, +100.0] | {2 / 2**pairs:.3f} | no | {pairs} |\n" in readme  # lead
    assert f"\n| a | {-gap:+.1f} [-100.0, +100.0] |\n" in readme and "**" not in readme  # b - a, not bold
    assert "excludes 0: yes" not in readme and "| yes |" not in readme


def test_many_identical_differences_are_significant_with_a_point_interval(tmp_path):
    """20 pairs all +50: the sign-flip test rejects every difference but +50 itself (p about 1 / 10,001 by
    its Monte-Carlo), so the interval is that point, and the difference is significant."""
    results = write_results(
        tmp_path / "results", rows_of({("a", 0.5): {"t1": [90.0] * 20}, ("b", 0.5): {"t1": [40.0] * 20}})
    )
    readme = (render_report([results], tmp_path / "r", versus="b") / "README.md").read_text()
    assert "| +50.0 [+50.0, +50.0] | <0.001 | yes | 20 |" in readme
    assert "\n| a | **-50.0 [-50.0, -50.0]** |\n" in readme  # b (named) minus a


def test_presses_keeps_only_the_named_presses_and_the_reference(tmp_path):
    a = {"t1": [90, 30], "t2": [70, 10]}
    scores = {("a", 0.5): a, ("b", 0.5): a, ("c", 0.5): a, ("none", 0.0): a}
    rows = rows_of(scores)
    for row in rows:  # c has two arguments: its label holds a comma
        if row["press"] == "c":
            row["press_args"] = {"x": 1, "y": 2}
    results = write_results(tmp_path / "results", rows)
    assert split_press_labels("a, c(x=1, y=2)") == ["a", "c(x=1, y=2)"]
    out = render_report([results], tmp_path / "r", presses=["a", "c(x=1, y=2)"])
    readme = (out / "README.md").read_text()
    assert "| a |" in readme and "| c(x=1, y=2) |" in readme and "| b |" not in readme
    assert "No compression (`none`)" in readme
    outcome = CliRunner().invoke(report, [str(results), "--out", str(tmp_path / "r2"), "--presses", "a,zz"])
    assert outcome.exit_code != 0
    assert "--presses 'zz' is not a press of these results" in str(outcome.exception)
    assert not (tmp_path / "r2" / "README.md").exists()


def test_versus_covers_the_memory_view(tmp_path):
    a = {"t1": [90, 30, 80, 20], "t2": [70, 10, 60, 0]}
    b = {task: [s - 10 for s in scores] for task, scores in a.items()}
    rows = [row | {"memory": 0.25} for row in rows_of({("a", 0.75): a, ("b", 0.75): b})]
    results = write_results(tmp_path / "results", rows)
    [board] = build_leaderboards(collect([results]).rows, collect([results]).runs, versus="a")
    [compared] = board.memory.versus.to_dict("records")
    assert (compared["press"], compared["memory"], compared["difference"]) == (
        "b",
        0.25,
        pytest.approx(10.0),  # a (named) minus b
    )


def test_intervals_are_right_at_small_n_and_clipped_to_the_score_range(tmp_path):
    """Textbook values: t at 2 and 3 samples, Wilson for pass/fail scores (pooled when the tasks hold as many
    samples), and plot bands inside 0-100 where the t interval runs past it."""
    scores = {
        ("spread", 0.25): {"t1": [20, 80]},  # t(1) = 12.71 x 30: far past both ends, clipped to [0, 100]
        ("spread", 0.5): {"t1": [20, 80]},
        ("three", 0.5): {"t1": [40, 50, 60]},  # 50 ± t(2) x 10 / sqrt(3) = 4.303 x 5.774 = 24.8
        ("zero", 0.5): {"t1": [0] * 10},  # Wilson for 0 of 10: [0, 27.8], where t says [0, 0]
        ("three_of_five", 0.5): {"t1": [100, 100, 100, 0, 0]},  # Wilson for 3 of 5: [23.1, 88.2]
        ("pooled", 0.5): {"t1": [100, 0, 0], "t2": [100, 100, 0]},  # 3 of 6 pooled: [18.8, 81.2]
    }
    [board] = build_leaderboards(collect([write_results(tmp_path / "r", rows_of(scores))]).rows, [])
    view = board.ratio

    def interval(press):
        return round(view.low.at[press, 0.5], 1), round(view.high.at[press, 0.5], 1)

    assert interval("spread") == (0.0, 100.0)
    assert interval("three") == (25.2, 74.8)
    assert interval("zero") == (0.0, 27.8)
    assert interval("three_of_five") == (23.1, 88.2)
    assert interval("pooled") == (18.8, 81.2)
    readme = (render_report([tmp_path / "r"], tmp_path / "report") / "README.md").read_text()
    # `*`: fewer samples than the fullest config (zero's 10).
    assert "| spread | 50.0 [0.0, 100.0]* | 50.0 [0.0, 100.0]* |" in readme
    assert "| zero |  | 0.0 [0.0, 27.8]* (n=10) |" in readme

    figure = scores_figure(board, press_styles(board.presses))
    bands = [path for collection in figure.axes[0].collections for path in collection.get_paths()]
    assert bands and all(0 <= y <= 100 for path in bands for y in path.vertices[:, 1])


def test_plot_titles_fit_inside_their_figures(tmp_path):
    """A long title over a narrow heatmap (two presses) and over a score plot stays inside the figure."""
    long_title = (
        "Qwen/Qwen2.5-7B-Instruct, ruler-1k, heldout, confirm, length 1024, decode-time (interval=16)"
    )
    table = pd.DataFrame({"none": [90.0, 80.0], "kvp": [70.0, 60.0]}, index=["t1", "t2"])
    heatmap = heatmap_figure(table, f"{long_title}\nratio 0.5: mean score per task")
    rows = [row | {"model": "Qwen/Qwen2.5-7B-Instruct"} for row in rows_of(SCORES)]
    [board] = build_leaderboards(collect([write_results(tmp_path / "r", rows)]).rows, [])
    board.suite = "ruler-1k, heldout, confirm, a suite with a long name"
    for figure in (heatmap, scores_figure(board, press_styles(board.presses))):
        figure.canvas.draw()
        title = figure.get_suptitle() and figure._suptitle.get_window_extent(figure.canvas.get_renderer())
        assert title and 0 <= title.x0 and title.x1 <= figure.bbox.width, (title, figure.bbox)
        assert "\n" in figure.get_suptitle()


def test_bytes_of_older_rows_are_counted_at_16_bits_in_one_unit(tmp_path):
    """Rows written before kv_bytes counted the cache at the compute dtype (kv_bytes_kept, float32: 512 B an
    entry at head_dim 64): the report scales them by the dtype their runs record, so they match newer rows
    that kept as many entries (kv_bytes, 256 B an entry); rows whose runs do not say stay without bytes."""
    old = [
        row
        | {"kv_bytes_kept": row["kv_kept"] * 512, "kv_total": 5000, "kv_kept": int(5000 * (1 - row["ratio"]))}
        for row in rows_of({("none", 0.0): {"t1": [100]}, ("old", 0.5): {"t1": [50]}})
    ]
    for row in old:
        row["kv_bytes_kept"] = row["kv_kept"] * 512
    new = [
        row | {"kv_total": 5000, "kv_kept": 2500, "kv_bytes": 2500 * 256, "kv_bytes_full": 5000 * 256}
        for row in rows_of({("new", 0.5): {"t1": [60]}})
    ]
    write_results(tmp_path / "old", old, {"tasks": ["t1"], "dtype": "float32"})
    write_results(tmp_path / "new", new)
    write_results(tmp_path / "unrecorded", rows_of({("other", 0.5): {"t1": [40]}}))  # no runs/*.json
    collected = collect([tmp_path / "old", tmp_path / "new", tmp_path / "unrecorded"])
    [board] = build_leaderboards(collected.rows, collected.runs)
    kept = board.ratio.kept["kept_bytes"]
    assert kept[("none", 0.0)] == 5000 * 256 and kept[("old", 0.5)] == kept[("new", 0.5)] == 2500 * 256
    assert pd.isna(kept[("other", 0.5)])
    readme = (
        render_report([tmp_path / n for n in ("old", "new", "unrecorded")], tmp_path / "rep") / "README.md"
    )
    table = readme.read_text().split("### KV cache kept")[1].split("###")[0]
    # 1.2 MiB and 625 KiB written in one unit: 0.6 MiB.
    assert "100.0% (memory 1, 1.2 MiB)" in table and "50.0% (memory 0.5, 0.6 MiB)" in table
    assert "KiB" not in table and "| other |  | 50.0% (memory 0.5) |" in table


def markdown_tables(readme: str) -> list[list[list[str]]]:
    """Every table of a README as rows of cell texts, the bold markers dropped (HTML writes <strong>)."""
    tables = []
    for block in readme.split("\n\n"):
        lines = block.strip().splitlines()
        if len(lines) >= 2 and lines[0].startswith("| ") and set(lines[1]) <= set("|-"):
            rows = [lines[0]] + lines[2:]
            tables.append(
                [[cell.strip().replace("**", "") for cell in row.strip("|").split(" | ")] for row in rows]
            )
    return tables


class PageTables(HTMLParser):
    """The cell texts of every <table> of a page, and its text outside <pre> and <code>."""

    def __init__(self):
        super().__init__()
        self.tables, self.text, self.cell, self.quoted = [], [], None, 0

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self.cell = []
        elif tag in ("pre", "code"):
            self.quoted += 1

    def handle_endtag(self, tag):
        if tag in ("td", "th"):
            self.tables[-1][-1].append("".join(self.cell).strip())
            self.cell = None
        elif tag in ("pre", "code"):
            self.quoted -= 1

    def handle_data(self, data):
        if self.cell is not None:
            self.cell.append(data)
        if not self.quoted:
            self.text.append(data)


def test_the_html_page_renders_the_markdown_tables_cell_for_cell(tmp_path):
    """index.html, without a browser: the same tables as README.md, cell for cell, the --versus cells in
    <strong> instead of Markdown's asterisks, and no Markdown left in its text."""
    results = write_results(tmp_path / "results", rows_of(SCORES) + memory_rows()[-6:])
    out = render_report([results], tmp_path / "report", versus="knorm")
    page = (out / "index.html").read_text()
    parsed = PageTables()
    parsed.feed(page)
    tables = markdown_tables((out / "README.md").read_text())
    assert len(tables) >= 8 and parsed.tables == tables
    assert "<strong>" in page
    text = "".join(parsed.text)
    assert "**" not in text and "`" not in text and "](" not in text


def test_versus_and_presses_take_the_name_the_sweep_was_given_and_highlight_it(tmp_path):
    """`outlier8=outlier_press.py:KeyOutlierPress` with `--press-arg outlier8.window=8` is labelled
    `outlier8(window=8)`; `--versus outlier8` and `--presses outlier8` name it, the table reads
    outlier8 minus each press, and every plot draws it thick, solid, in the highlight colour. A name that
    two labels share is refused with both."""
    a = {"t1": [90, 30, 80, 20, 60, 70], "t2": [70, 12, 60, 12, 50, 40]}
    b = {task: [score - 10 for score in scores] for task, scores in a.items()}
    rows = rows_of({("outlier8", 0.5): a, ("knorm", 0.5): b, ("none", 0.0): a})
    for row in rows:
        if row["press"] == "outlier8":
            row["press_args"] = {"window": 8}
    results = write_results(tmp_path / "results", rows)
    outcome = CliRunner().invoke(
        report,
        [str(results), "--out", str(tmp_path / "r"), "--versus", "outlier8", "--presses", "outlier8,knorm"],
    )
    assert outcome.exit_code == 0, outcome.output
    readme = (tmp_path / "r" / "README.md").read_text()
    assert "`outlier8(window=8)` minus each press" in readme
    assert "| outlier8(window=8) minus | 0.5 |" in readme and "| knorm | **+10.0 [" in readme

    [board] = build_leaderboards(collect([results]).rows, [], versus="outlier8(window=8)")
    styles = press_styles(board.presses, "outlier8(window=8)")
    assert styles["outlier8(window=8)"].color == HIGHLIGHT.color != styles["knorm"].color
    lines = {line.get_label(): line for line in scores_figure(board, styles).axes[0].get_lines()}
    mine = lines["outlier8(window=8)"]
    assert (mine.get_linewidth(), mine.get_linestyle(), mine.get_color()) == (3.0, "-", HIGHLIGHT.color)
    assert lines["knorm"].get_linewidth() < 3.0

    other = {
        "press_args": {"window": 4},
        "config_id": config_id("smollm2-135m", "outlier8", 0.5, {"window": 4}),
    }
    rows += [row | other for row in rows if row["press"] == "outlier8"]
    twice = write_results(tmp_path / "twice", rows)
    outcome = CliRunner().invoke(report, [str(twice), "--out", str(tmp_path / "r2"), "--versus", "outlier8"])
    assert outcome.exit_code != 0
    assert "names 2 presses: give one of outlier8(window=4), outlier8(window=8)" in str(outcome.exception)
