"""The reports README.md quotes are what README.md's own `kvbench report` commands write from the committed
rows today: run as written (into a temporary folder instead of reports/), their README.md compared byte for
byte with the committed one. Every committed report is rendered again by `bash reports/render.sh` (about 90 s
on 2 cores, too long for every test run); these are the front page's first two (its third, which reads five
folders, takes 12 s alone: render.sh holds it)."""

import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_usage_doc import braces, doc_commands

from kvbench.cli import main

ROOT = Path(__file__).resolve().parents[1]
QUOTED = [command for command in doc_commands(ROOT / "README.md") if " --out reports/reference" in command]
REPORTS = [command for command in QUOTED if "--every-state" not in command]


def out_of(command: str) -> str:
    words = shlex.split(command)
    return words[words.index("--out") + 1]


def test_the_front_page_quotes_its_reports_commands():
    outs = sorted(map(out_of, QUOTED))
    assert outs == ["reports/reference", "reports/reference-after-choice-sixth", "reports/reference-memory"]
    assert sorted(map(out_of, REPORTS)) == ["reports/reference", "reports/reference-memory"]


@pytest.mark.parametrize("command", REPORTS, ids=out_of)
def test_a_committed_report_is_what_its_command_writes(command, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    words = [expanded for word in shlex.split(command)[1:] for expanded in braces(word)]
    out = Path(words[words.index("--out") + 1])
    words[words.index("--out") + 1] = str(tmp_path / out.name)
    result = CliRunner().invoke(main, words)
    assert result.exit_code == 0, result.output
    assert (tmp_path / out.name / "README.md").read_text() == (ROOT / out / "README.md").read_text()
