"""`kvbench report` on results it cannot take as they are: each class of bad value is one line naming the
file and the field (a warning where the rest still reads, an error where nothing does), never a traceback;
the rest of the report renders; plots of different things never share a file; and a report that cannot be
written leaves the one that was there as it was."""

import errno
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvbench.cli import main
from kvbench.store.results import ResultsStore, Row
from tests.conftest import skip_drawing
from tests.reporting.test_report import SCORES, configs, make_row, rows_of, write_results


@pytest.fixture(autouse=True)
def no_pixels(monkeypatch):
    """These tests read what a report says and which files it names, not its plots' pixels."""
    skip_drawing(monkeypatch)


RUN_CONFIG = {
    "tasks": ["t1", "t2"],
    "samples": 2,
    "configs": configs(["none", "knorm", "snapkv"], [0.25, 0.5]),
}


def good_results(folder: Path, rows: list[dict] | None = None) -> Path:
    return write_results(folder, rows if rows is not None else rows_of(SCORES), RUN_CONFIG)


def edit_rows(folder: Path, edit) -> None:
    """Rewrite rows.jsonl with `edit(rows)` applied: rows the store would refuse to write, as a hand edit, a
    foreign tool or a damaged disk leaves them."""
    path = folder / "rows.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    edit(rows)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def edit_run(folder: Path, edit) -> Path:
    [path] = (folder / "runs").glob("*.json")
    record = json.loads(path.read_text())
    edit(record)
    path.write_text(json.dumps(record))
    return path


def report(folder: Path, out: Path) -> tuple[int, list[str], list[str]]:
    """Exit code, the warning lines and the other lines of `kvbench report FOLDER --out OUT`."""
    result = CliRunner().invoke(main, ["report", str(folder), "--out", str(out)])
    assert "Traceback" not in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    lines = result.output.strip().splitlines()
    return result.exit_code, [line for line in lines if line.startswith("Warning: ")], lines


def headings(readme: Path) -> list[str]:
    return [line for line in readme.read_text().splitlines() if line.startswith("#")]


def tables(readme: Path) -> list[str]:
    return [line for line in readme.read_text().splitlines() if line.startswith("|")]


def snapshot(folder: Path) -> dict:
    return {
        str(path.relative_to(folder)): hashlib.sha1(path.read_bytes()).hexdigest() if path.is_file() else None
        for path in sorted(folder.rglob("*"))
    }


# ---- values the report cannot place ----


@pytest.mark.parametrize("score", [-0.5, 100.5, 1e200, 1e308, -1e308])
def test_a_score_off_the_scale_is_set_aside_in_one_line(score, tmp_path):
    """The row schema allows any finite score (lm-eval metrics are not all on 0-100); the report's scale is
    [0, 100], so the report sets such a row aside, says so once, and reports the rest as if it were not
    there. 1e308 overflowed the intervals and the error bars (a traceback, or NaN bands and warnings)."""
    mutated = good_results(tmp_path / "mutated")
    edit_rows(mutated, lambda rows: rows[3].update(score=score))
    without = good_results(tmp_path / "without")
    edit_rows(without, lambda rows: rows.pop(3))
    code, warned, _ = report(mutated, tmp_path / "report")
    assert code == 0
    assert len(warned) == 1 and "set aside 1 row with a score outside [0, 100]" in warned[0], warned
    assert str(mutated) in warned[0] and "task t2, sample t2-1" in warned[0]
    assert report(without, tmp_path / "expected")[:2] == (0, [])
    assert tables(tmp_path / "report" / "README.md") == tables(tmp_path / "expected" / "README.md")


def perplexity_rows(nlls: list[float]) -> list[dict]:
    rows = []
    for press, ratio in (("none", 0.0), ("knorm", 0.5)):
        for index, nll in enumerate(nlls):
            row = make_row(press, ratio, "prose", index, None)
            row.update(
                protocol="perplexity",
                protocol_args={"every": 16},
                nll=nll + ratio,
                meta={"span": 32, "span_nll": [nll, nll + 0.5]},
            )
            rows.append(row)
    return rows


def test_an_nll_whose_perplexity_overflows_is_set_aside_in_one_line(tmp_path):
    folder = good_results(tmp_path / "results", perplexity_rows([2.0, 2.5, 3.0]))
    edit_rows(folder, lambda rows: rows[1].update(nll=1e300))
    code, warned, _ = report(folder, tmp_path / "report")
    assert code == 0 and len(warned) == 1 and "an NLL above 700" in warned[0], warned
    readme = (tmp_path / "report" / "README.md").read_text()
    assert "Perplexity with a live cache" in readme and "1e+300" not in readme.split("Perplexity")[1]


ROW_SHAPES = [  # (what to do to the 4th row, the field the one line names)
    (lambda row: row.update(meta={"question": "a"}), "meta.question"),  # was a pandas traceback
    (lambda row: row.update(meta={"question": -1}), "meta.question"),
    (lambda row: row.update(meta={"turn": {"a": 1}}), "meta.turn"),
    (lambda row: row.update(meta={"question": 1, "context": [1]}), "meta.context"),
    (lambda row: row.update(meta=[1]), "'meta'"),
    (lambda row: row.update(meta={"length": "long"}), "meta.length"),
    (lambda row: row.update(task="longbench-e/qasper", meta={}), "meta.length"),  # was a KeyError
    (lambda row: row.update(protocol="perplexity", score=None, nll=2.0, meta={}), "meta.span"),
    (lambda row: row.update(protocol="perplexity", score=None, meta={"span": 4, "span_nll": [1.0]}), "'nll'"),
    (
        lambda row: row.update(protocol="perplexity", score=None, nll=2.0, meta={"span": 4, "span_nll": "x"}),
        "span_nll",
    ),
]


@pytest.mark.parametrize(
    "edit, field", ROW_SHAPES, ids=[f"{i}-{field}" for i, (_, field) in enumerate(ROW_SHAPES)]
)
def test_a_row_whose_nested_fields_have_the_wrong_shape_is_one_warning_naming_the_field(
    edit, field, tmp_path
):
    folder = good_results(tmp_path / "results")
    edit_rows(folder, lambda rows: edit(rows[3]))
    code, warned, _ = report(folder, tmp_path / "report")
    assert code == 0 and len(warned) == 1, warned
    assert "rows.jsonl:4: skipped a corrupt results row" in warned[0] and field in warned[0], warned
    assert (tmp_path / "report" / "README.md").is_file()


PERPLEXITY = {"score": None, "nll": 2.0, "meta": {"span": 4, "span_nll": [1.0]}}  # what its rows hold
PROTOCOL_ARGS = [  # (the 4th row's protocol and protocol_args, the field the line names, the section made)
    ("multi-question", {"questions": "four"}, "protocol_args.questions", "(questions=four)"),
    ("multi-question", {"questions": 0}, "protocol_args.questions", "(questions=0)"),
    ("multi-question", {"questions": 4.0}, "protocol_args.questions", "(questions=4.0)"),
    ("multi-question", {"questions": True}, "protocol_args.questions", "(questions=True)"),
    ("multi-question", {"chunk": 64}, "protocol_args", "(chunk=64)"),
    ("multi-question", {"questions": 4, "chunk": 64}, "protocol_args", "chunk=64"),
    ("multi-question", {}, "protocol_args", "multi-question"),
    (None, {"questions": 4}, "protocol_args", "(questions=4)"),  # a row without a protocol: query-agnostic
    ("", {"questions": 4}, "protocol_args", "(questions=4)"),
    ("query-aware", {"interval": 8}, "protocol_args", "(interval=8)"),
    ("perplexity", {"chunk": 64}, "protocol_args", "chunk=64"),
    ("perplexity", {"every": -1}, "protocol_args.every", "every=-1"),
    ("my-plugin", {"window": "x"}, "protocol_args.window", "window=x"),  # a protocol kvbench does not know
]


@pytest.mark.parametrize(
    "protocol, args, field, section",
    PROTOCOL_ARGS,
    ids=[f"{protocol}-{json.dumps(args)}" for protocol, args, _, _ in PROTOCOL_ARGS],
)
def test_a_row_whose_protocol_args_are_not_its_protocols_is_one_warning_naming_the_field(
    protocol, args, field, section, tmp_path
):
    """A row's protocol_args are exactly its protocol's arguments, each a whole number >= 1; any other was
    a leaderboard section of its own, e.g. "multi-question (questions=four)", and no word said."""
    folder = good_results(tmp_path / "results")
    perplexity = PERPLEXITY if protocol == "perplexity" else {}
    edit_rows(folder, lambda rows: rows[3].update(perplexity, protocol=protocol, protocol_args=args))
    code, warned, _ = report(folder, tmp_path / "report")
    assert code == 0 and len(warned) == 1, warned
    assert "rows.jsonl:4: skipped a corrupt results row" in warned[0], warned
    assert f"field '{field}'" in warned[0], warned
    assert not [line for line in headings(tmp_path / "report" / "README.md") if section in line]


def test_the_rows_of_a_protocol_kvbench_does_not_know_keep_their_arguments(tmp_path):
    """A plugin's protocol that is not installed: its argument names cannot be checked, its rows are
    reported as they are."""
    rows = [row | {"protocol": "my-plugin", "protocol_args": {"window": 3}} for row in rows_of(SCORES)]
    code, warned, _ = report(good_results(tmp_path / "results", rows), tmp_path / "report")
    assert (code, warned) == (0, [])
    heading = (
        "## smollm2-135m, 2 tasks, length 1024 (a cap: contexts of 900-903 tokens), my-plugin (window=3)"
    )
    assert heading in headings(tmp_path / "report" / "README.md")


BLANK_OPTIONS = [  # (the options, the one line)
    (["--presses", ","], "--presses names no press"),  # was every press
    (["--presses", ""], "--presses names no press"),
    (["--presses", " , "], "--presses names no press"),
    (["--versus", ""], "--versus names no press"),  # was no --versus
    (["--costs", ""], "Invalid value for '--costs': names no folder"),
    (["--out", ""], "Invalid value for '--out': names no folder"),  # was a report over ./README.md
]


@pytest.mark.parametrize(
    "options, line", BLANK_OPTIONS, ids=[" ".join(map(repr, o)) for o, _ in BLANK_OPTIONS]
)
def test_an_option_that_names_nothing_is_one_line_and_writes_nothing(options, line, tmp_path, monkeypatch):
    folder = good_results(tmp_path / "results")
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    args = ["report", str(folder), "--out", str(tmp_path / "report"), *options]  # the last --out counts
    result = CliRunner().invoke(main, args)
    assert (result.exit_code, result.output.strip().splitlines()) == (2, [f"Error: {line}"]), result.output
    assert not (tmp_path / "report").exists() and not any((tmp_path / "here").iterdir())


RUN_SHAPES = [  # (what to do to the run record, the field the one line names)
    (lambda run: run["config"].update(tasks="t1"), "config.tasks"),  # was iterated letter by letter
    (lambda run: run["config"].update(tasks=[1]), "config.tasks.0"),
    (lambda run: run["config"].update(samples="2"), "config.samples"),
    (lambda run: run["config"].update(configs="x"), "config.configs"),
    (lambda run: run["config"]["configs"][0].pop("press"), "config.configs.0.press"),
    (lambda run: run["config"]["configs"][0].update(ratio="a"), "config.configs.0.ratio"),
    (lambda run: run["config"]["configs"][1].update(press_args=[1]), "config.configs.1.press_args"),
    (lambda run: run["config"]["configs"][1].update(press_args="ab"), "config.configs.1.press_args"),
    (lambda run: run["config"]["configs"][1].update(protocol=[1]), "config.configs.1.protocol"),
    # Protocol arguments that are not their protocol's, as a row's are held (`check_protocol_args`).
    (
        lambda run: run["config"]["configs"][1].update(protocol="decode-time", protocol_args={}),
        "config.configs.1",
    ),
    (
        lambda run: run["config"].update(protocol="query-agnostic", protocol_args={"chunk": 8}),
        "config.protocol_args",
    ),
    (
        lambda run: run["config"]["configs"][1].update(protocol="streaming", protocol_args=[["turns", 2]]),
        "config.configs.1",
    ),
    (lambda run: run["config"].update(suite=[1]), "config.suite"),
    (lambda run: run["config"].update(model=[1]), "config.model"),
    (lambda run: run["config"].update(dtype={}), "config.dtype"),
    (lambda run: run.update(config=[1]), "config'"),
    (lambda run: run["hardware"].update(cpus=[1]), "hardware.cpus"),
]


@pytest.mark.parametrize("edit, field", RUN_SHAPES, ids=[field for _, field in RUN_SHAPES])
def test_a_run_record_whose_nested_fields_have_the_wrong_shape_is_one_warning_naming_the_field(
    edit, field, tmp_path
):
    """Run records hold no results: one of the wrong shape is skipped (one line naming the file and the
    field) and the report renders from the rows, as it does for a folder without records."""
    folder = good_results(tmp_path / "results")
    record = edit_run(folder, edit)
    code, warned, _ = report(folder, tmp_path / "report")
    assert code == 0 and len(warned) == 1, warned
    assert f"{record}: skipped a corrupt run record: field '{field}" in warned[0], warned
    readme = (tmp_path / "report" / "README.md").read_text()
    assert "No runs/*.json" in readme and "| t |" not in readme  # no task named by a letter of "t1"


# ---- plots of different things never share a file ----


def image_files(readme: Path) -> list[str]:
    return re.findall(r"!\[[^\]]*\]\(([^)]+)\)", readme.read_text())


def test_models_whose_names_slug_alike_keep_their_own_plots(tmp_path):
    """`org/m`, `org-m` and `Org-M` all slug to org-m (the last on a file system that ignores case): each
    board gets its own files, told apart by a hash; a name too long for a file is cut and hashed; a name
    that is unique already keeps its file names."""
    scores = {("none", 0.0): {"t1": [100, 80]}, ("knorm", 0.5): {"t1": [50, 70]}}
    names = ["org/m", "org-m", "Org-M", "x" * 300, "smollm2-135m"]
    rows = [row for name in names for row in rows_of(scores, model=name)]
    code, _, _ = report(write_results(tmp_path / "results", rows), tmp_path / "report")
    assert code == 0
    files = image_files(tmp_path / "report" / "README.md")
    assert len(files) == len(set(name.casefold() for name in files)) == len(names) * 2  # scores, tasks
    assert all((tmp_path / "report" / name).is_file() and len(name) < 255 for name in files)
    assert "smollm2-135m-1024-scores.png" in files and "org-m-1024-scores.png" not in files
    assert sum(name.startswith("org-m-1024-") or name.startswith("Org-M-1024-") for name in files) == 6


def test_ratios_that_print_alike_keep_their_own_heatmaps(tmp_path):
    scores = {
        ("none", 0.0): {"t1": [100, 80]},
        ("knorm", 0.1234567): {"t1": [50]},
        ("knorm", 0.1234568): {"t1": [60]},
    }
    code, _, _ = report(write_results(tmp_path / "results", rows_of(scores)), tmp_path / "report")
    assert code == 0
    heatmaps = [name for name in image_files(tmp_path / "report" / "README.md") if "-tasks-" in name]
    assert len(set(heatmaps)) == 2, heatmaps


def test_perplexity_plots_of_tasks_that_slug_alike_keep_their_own_files(tmp_path):
    rows = perplexity_rows([2.0, 2.5])
    rows += [{**row, "task": "pro/se", "nll": row["nll"] + 1} for row in rows]
    rows = [{**row, "task": "pro-se"} if row["task"] == "prose" else row for row in rows]
    code, _, _ = report(write_results(tmp_path / "results", rows), tmp_path / "report")
    assert code == 0
    files = image_files(tmp_path / "report" / "README.md")
    assert len(files) == len(set(files)) == 4, files  # memory and position, for each task


# ---- the store: a claims folder holding what no writer wrote ----


def test_claims_that_are_no_writers_do_not_stop_a_writer_or_the_report(tmp_path):
    """claims/x.json a folder made the next writer's claim a traceback (unlink of a folder), on every rerun;
    a lock that is a folder, a FIFO, a live writer's claims that are not lists of keys are no claims
    either. They are left where they are."""
    from filelock import FileLock

    folder = good_results(tmp_path / "results")
    claims = folder / "claims"
    (claims / "x.json").mkdir(parents=True)
    (claims / "y.lock").mkdir()
    (claims / "y.json").write_text("[]")
    (claims / "z.json").write_text("[1, [[1]]]")
    os.mkfifo(claims / "f.json")
    live = FileLock(str(claims / "z.lock"), thread_local=False)
    live.acquire()
    try:
        row = Row.from_dict({**rows_of(SCORES)[0], "sample_id": "new"})
        with ResultsStore(folder) as store:
            assert store.claim([row]) == [row] and store.append(row)
    finally:
        live.release()
    assert sorted(path.name for path in claims.iterdir()) == [
        "f.json",
        "x.json",
        "y.json",
        "y.lock",
        "z.json",
        "z.lock",
    ]
    assert report(folder, tmp_path / "report")[:2] == (0, [])


# ---- a report that cannot be written ----


@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGINT"])
def test_a_report_killed_half_way_leaves_the_report_that_was_there(
    tmp_path, monkeypatch, request, signal_name
):
    """A `kill` (SIGTERM) or Ctrl-C (SIGINT) while the plots are drawn: one line, exit 128 + the signal,
    the report already in --out as it was and no staging folder left (SIGTERM left .report-*.tmp)."""
    import signal

    from kvbench.reporting import render

    folder = good_results(tmp_path / "results")
    out = tmp_path / "report"
    assert report(folder, out)[0] == 0
    before = snapshot(out)
    draw = render.leaderboard_blocks

    def killed_while_drawing(*args, **kwargs):
        blocks = draw(*args, **kwargs)  # some plots are in the staging folder now
        os.kill(os.getpid(), getattr(signal, signal_name))
        return blocks

    monkeypatch.setattr(render, "leaderboard_blocks", killed_while_drawing)
    # As in a terminal: an xdist worker may have been started with SIGINT ignored.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    request.addfinalizer(lambda: signal.signal(signal.SIGINT, previous))
    result = CliRunner().invoke(main, ["report", str(folder), "--out", str(out)])
    assert result.exit_code == 128 + getattr(signal, signal_name), result.output
    assert result.output.strip() == ("terminated" if signal_name == "SIGTERM" else "interrupted")
    assert snapshot(out) == before
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the command's handler is gone with it


def test_a_file_size_limit_leaves_the_report_that_was_there(tmp_path):
    """Under `ulimit -f` (EFBIG on the first big write): one line, exit 1 (the machine, not the input), the
    report already in --out byte for byte as it was, no staging folder left; into a new --out, no folder
    at all. Before, it was a traceback with a half-written report, or an empty folder."""
    import resource

    folder = good_results(tmp_path / "results")
    out = tmp_path / "report"
    assert report(folder, out)[0] == 0
    (out / "notes.txt").write_text("the user's own file, not the report's\n")
    before = snapshot(out)
    code = "from kvbench.cli import main; main()"
    limit = 30_000  # bytes: README.md fits, index.html and the plots do not

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    for target in (out, tmp_path / "new" / "report"):
        result = subprocess.run(
            [sys.executable, "-c", code, "report", str(folder), "--out", str(target)],
            capture_output=True,
            text=True,
            preexec_fn=small_files,
            timeout=300,
        )
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
        assert lines == [f"Error: cannot write the report to {target}: File too large (nothing written)"], (
            lines
        )
    assert snapshot(out) == before
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("failing", ["heatmap", "index.html"])
def test_a_full_disk_half_way_replaces_nothing(failing, tmp_path, monkeypatch):
    """ENOSPC at a plot or at the last file: nothing of the new report is moved into --out."""
    from kvbench.reporting import blocks, render

    folder = good_results(tmp_path / "results")
    out = tmp_path / "report"
    assert report(folder, out)[0] == 0
    before = snapshot(out)
    edit_rows(folder, lambda rows: rows[3].update(score=0.0))  # a report that would differ

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(*(render, "to_html", full) if failing == "index.html" else (blocks, "save", full))
    code, _, lines = report(folder, out)
    assert code == 1 and lines == [
        f"Error: cannot write the report to {out}: No space left on device (nothing written)"
    ]
    assert snapshot(out) == before


def test_a_report_file_that_is_a_folder_in_out_is_one_line_and_nothing_moves(tmp_path):
    folder = good_results(tmp_path / "results")
    out = tmp_path / "report"
    (out / "index.html").mkdir(parents=True)
    code, _, lines = report(folder, out)
    assert code == 2 and lines == [
        f"Error: cannot write the report to {out}: {out / 'index.html'} is not a file"
    ]
    assert sorted(path.name for path in out.iterdir()) == ["index.html"]


@pytest.mark.parametrize("count", [1, 3, 7])
@pytest.mark.parametrize("score", [0, 100])
def test_a_config_of_one_ratio_whose_samples_all_score_alike_plots_its_interval(score, count, tmp_path):
    """All 0 (or all 100): Wilson's bound lands a rounding error past the score (5.6e-15 above 0), which as
    an error bar's length is negative; the bar is clipped to the score, not refused by matplotlib."""
    scores = {("none", 0.0): {"t1": [100 - score] * count}, ("knorm", 0.5): {"t1": [score] * count}}
    code, _, lines = report(write_results(tmp_path / "results", rows_of(scores)), tmp_path / "report")
    assert code == 0, lines
    assert "smollm2-135m-1024-scores.png" in image_files(tmp_path / "report" / "README.md")
