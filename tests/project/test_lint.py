"""`uv run --group dev pytest` covers the linters too: ruff's checks and formatting, and ty's type check
(rules in pyproject.toml), on the whole repository."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "command", [["ruff", "check", "."], ["ruff", "format", "--check", "."], ["ty", "check"]], ids=" ".join
)
def test_the_code_is_clean(command):
    tool = Path(sys.executable).parent / command[0]  # the environment's own, as `uv run` puts it there
    tool = str(tool) if tool.exists() else shutil.which(command[0])
    if tool is None:
        pytest.skip(f"{command[0]} is not installed (`uv sync --group dev` installs the dev tools)")
    result = subprocess.run([tool, *command[1:]], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
