"""docs/extending.md as a newcomer follows it: in an empty folder, its files written and its `$` commands
run in the order written, on the embedded model; then what the tutorial says of the results, checked."""

import json
import re
import runpy
import shlex
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvbench.cli import main

DOC = Path(__file__).resolve().parents[2] / "docs" / "extending.md"
BLOCK = re.compile(r"```(\w+)([^\n]*)\n(.*?)```", re.S)


def doc_steps() -> list[tuple[str, str, str]]:
    """The tutorial's steps in order: ("file", path, text) for a block with `file=PATH`, ("run", command,
    "") for each `$` line of a console block; blocks of other kinds (the package's pyproject) are shown
    only, as the page says."""
    steps = []
    for kind, info, body in BLOCK.findall(DOC.read_text()):
        found = re.search(r"file=(\S+)", info)
        if found:
            steps.append(("file", found.group(1), body))
        elif kind == "console":
            steps += [("run", line[2:], "") for line in body.splitlines() if line.startswith("$ ")]
    return steps


def test_the_tutorial_lists_its_blocks():
    steps = doc_steps()
    files = [path for kind, path, _ in steps if kind == "file"]
    assert files == [
        "my_press.py",
        "make_data.py",
        "api.py",
        "tasks/meetings.yaml",
        "tasks/my_suite.yaml",
        "my_protocol.py",
    ]
    assert sum(kind == "run" for kind, _, _ in steps) == 8


@pytest.mark.doc_runs  # the embedded model through every command of the page: 80 s on 2 idle cores
def test_every_step_of_the_tutorial_runs_in_an_empty_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for kind, what, text in doc_steps():
        if kind == "file":
            Path(what).parent.mkdir(parents=True, exist_ok=True)
            Path(what).write_text(text)
            continue
        words = shlex.split(what)
        if words[0] == "python":
            # In this process, as `python FILE` runs it (its folder first on sys.path, run as __main__):
            # a process of its own would only import torch and kvpress again (15 s on 2 cores).
            monkeypatch.syspath_prepend(str(tmp_path))
            monkeypatch.setattr(sys, "argv", words[1:])
            runpy.run_path(words[1], run_name="__main__")
        else:
            assert words[0] == "kvbench", what
            result = CliRunner().invoke(main, words[1:])
            assert result.exit_code == 0, (what, result.output[-3000:])
    rows = [json.loads(line) for line in Path("results/mine/rows.jsonl").read_text().splitlines()]
    assert sorted({row["press"] for row in rows}) == ["ValueNormPress", "kvp", "none", "snapkv"]
    assert len(rows) == 20 and all(
        row["task"] == "mine" and row["meta"]["metric"] == "contains" for row in rows
    )
    assert all(
        row["press_source"]["file"].endswith("my_press.py")
        for row in rows
        if row["press"] == "ValueNormPress"
    )
    args = {
        row["press"]: row["press_args"]
        for row in Path("results/mine-args/rows.jsonl").read_text().splitlines()
        for row in [json.loads(row)]
    }
    assert args == {"none": {}, "ValueNormPress": {"power": 1}, "snapkv": {"window_size": 16}}
    assert Path("reports/mine/README.md").is_file()
    api = {json.loads(line)["press"] for line in Path("results/api/rows.jsonl").read_text().splitlines()}
    assert api == {"none", "mine", "squared", "snapkv"}
    suite = [json.loads(line) for line in Path("results/suite/rows.jsonl").read_text().splitlines()]
    assert sorted({row["task"] for row in suite}) == ["meetings", "niah_single_1"] and len(suite) == 12


def test_the_hooks_a_press_may_declare_are_listed_as_the_one_file_declares_them():
    from kvbench.core.press_hooks import HOOKS

    text = DOC.read_text()
    listed = re.findall(r"^\| `([^`]+)` \| (.+) \|$", text, flags=re.MULTILINE)
    assert listed == [(hook.signature, hook.contract) for hook in HOOKS.values()]


def test_kvbench_reads_no_press_attribute_of_its_own_outside_the_declared_hooks():
    """Every read of a kvbench hook goes through `press_hooks.declared`: no getattr/hasattr probe of a
    press for a name of its own elsewhere in the package."""
    from kvbench.core.press_hooks import HOOKS

    probe = re.compile(r"(?:getattr|hasattr)\((?:press|type\(press\)|self\.press|inner), \"(\w+)\"")
    found = [
        (path.name, name)
        for path in (DOC.parents[1] / "kvbench").rglob("*.py")
        if path.name != "press_hooks.py"
        for name in probe.findall(path.read_text())
    ]
    assert [(file, name) for file, name in found if name in HOOKS] == []
