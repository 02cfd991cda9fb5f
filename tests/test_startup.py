"""Start-up: a misspelt name is refused with a did-you-mean before torch, transformers or kvpress are
imported (their imports take 10-30 s on 2 busy cores; the name checks need none of them)."""

import json
import subprocess
import sys

import pytest

from kvbench.errors import did_you_mean

HEAVY = ("torch", "transformers", "kvpress", "pandas")

# (arguments, what the one line on stderr must say)
MISSPELT = [
    (["run", "--press", "knrom", "--ratio", "0.5"], "unknown press 'knrom': did you mean 'knorm'?"),
    (
        ["sweep", "--presses", "knorm,snapk", "--ratios", "0.5"],
        "unknown press 'snapk': did you mean 'snapkv'",
    ),
    (
        ["run", "--press", "knorm", "--ratio", "0.5", "--task", "niah_singel_1"],
        "unknown task 'niah_singel_1': did you mean 'niah_single_1'",
    ),
    (
        ["sweep", "--presses", "knorm", "--ratios", "0.5", "--suite", "ruler-1K"],
        "unknown suite 'ruler-1K': did you mean 'ruler-1k'",
    ),
    (["run", "--press", "knorm", "--raito", "0.5"], "Did you mean '--ratio'?"),  # click's own suggestion
    (["rnu", "--press", "knorm"], "Did you mean 'run'?"),
    # numbers and paths are checked before torch too
    (["run", "--press", "knorm", "--ratio", "1.5"], "ratio must be in [0, 1), got 1.5"),
    (["run", "--press", "knorm", "--ratio", "0.5", "--out", "/proc/kvbench"], "is not writable"),
]

# Each case in one process of its own, as a user's command runs; all in one subprocess so that the test
# pays Python's start-up once. Prints, per case, the exit code and the heavy modules imported so far.
SCRIPT = """
import contextlib, io, json, sys
from kvbench.cli import main

for args in json.loads(sys.argv[1]):
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        try:
            main(args)
        except SystemExit as done:
            code = done.code
    heavy = [name for name in {heavy!r} if name in sys.modules]
    print(json.dumps({{"code": code, "stderr": stderr.getvalue(), "heavy": heavy}}))
"""


def test_misspelt_names_are_refused_with_a_suggestion_before_any_heavy_import(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(heavy=HEAVY), json.dumps([args for args, _ in MISSPELT])],
        capture_output=True,
        text=True,
        cwd=tmp_path,  # nothing may be written: the folder stays empty
    )
    assert done.returncode == 0, done.stderr
    outcomes = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(outcomes) == len(MISSPELT)
    for (args, message), outcome in zip(MISSPELT, outcomes, strict=True):
        assert outcome["code"] == 2, (args, outcome)
        lines = outcome["stderr"].strip().splitlines()
        assert len(lines) == 1 and message in lines[0], (args, outcome["stderr"])
        assert outcome["heavy"] == [], (args, outcome["heavy"])
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("name", "known", "said"),
    [
        ("knrom", ["knorm", "snapkv", "tova"], ": did you mean 'knorm'?"),
        ("snap", ["snapkv", "pyramidkv", "knorm"], ": did you mean 'snapkv'?"),
        ("xyzzy", ["knorm", "snapkv"], ""),  # nothing close: no guess
        (3, ["knorm"], ""),  # a YAML-typed value that is not text
    ],
)
def test_did_you_mean_names_the_close_names_only(name, known, said):
    assert did_you_mean(name, known) == said


def test_a_misspelt_press_argument_is_suggested():
    from kvbench.errors import BadInput
    from kvbench.presses import build_press

    with pytest.raises(BadInput, match="no argument 'windw_size': did you mean 'window_size'"):
        build_press("snapkv", 0.5, windw_size=8)
