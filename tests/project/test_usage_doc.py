"""Every `kvbench` command written in README.md and docs/ (usage, the studies, ...) parses as written: its
subcommand exists, its options exist and their values are of their types (click parses them, no work is
done). tests/project/test_doc_commands.py runs them. `lm-eval-kvbench` lines are lm-eval's own command line
and are checked by tests/harness/test_lmeval.py's runs of it."""

import re
import shlex
import warnings
from pathlib import Path

import click
import pytest

from kvbench.cli import main

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def doc_commands(path: Path) -> list[str]:
    """The `kvbench ...` command lines of the code blocks of `path`, continuation lines joined, comments
    and the `uv run [--extra X | --group X]` prefix dropped."""
    return [command for command, _ in marked_commands(path)]


def marked_commands(path: Path) -> list[tuple[str, str]]:
    """`doc_commands` with each command's comment (the text after its `#`, stripped; "" where none)."""
    commands, block = [], None
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            block = [] if block is None else None
            continue
        if block is None:
            continue
        block.append(line)
        text = " ".join(part.rstrip("\\").strip() for part in block)
        if line.rstrip().endswith("\\"):
            continue
        block.clear()
        if not re.match(r"(uv run .*)?kvbench ", text) or "─►" in text:
            continue  # Python, YAML, output, a diagram
        words = shlex.split(text, comments=True)
        while words[:2] == ["uv", "run"] or words[:1] in (["--extra"], ["--group"]):
            words = words[2:]
        if words[:1] == ["kvbench"]:
            comment = text.partition(" #")[2].strip()
            commands.append((shlex.join(words), comment))
    return commands


COMMANDS = [(str(path.relative_to(ROOT)), command) for path in DOCS for command in doc_commands(path)]


def test_the_docs_hold_the_commands_this_test_reads():
    assert len(COMMANDS) >= 100
    assert any("lm-eval" in command for _, command in COMMANDS)


def parse(words: list[str]) -> tuple[str, ...]:
    """Parse `kvbench WORDS` down to its leaf command without running it; the command path."""
    command, path = main, []
    context = command.make_context("kvbench", list(words), resilient_parsing=False)
    while isinstance(command, click.Group):
        with warnings.catch_warnings():  # click 8.2 deprecates protected_args, where it still puts the name
            warnings.simplefilter("ignore", DeprecationWarning)
            args = context.protected_args + context.args
        if command.invoke_without_command and not args:
            break  # a group that runs as a command of its own (`kvbench models`)
        name, command, rest = command.resolve_command(context, args)
        path.append(name)
        context = command.make_context(name, rest, parent=context)
    return tuple(path)


def braces(word: str) -> list[str]:
    """The shell's brace expansion of one word: `a-{b,c}` -> [`a-b`, `a-c`] (one level, as the docs use)."""
    found = re.search(r"\{([^{}]*,[^{}]*)\}", word)
    if found is None:
        return [word]
    return [word[: found.start()] + part + word[found.end() :] for part in found.group(1).split(",")]


MISSING = re.compile(r"Path '([^']+)' does not exist")


@pytest.mark.parametrize("doc, command", COMMANDS, ids=[f"{doc}:{command[:60]}" for doc, command in COMMANDS])
def test_a_documented_command_parses_as_written(doc, command, tmp_path, monkeypatch):
    """In an empty folder holding the committed results folders; a path the command names as the user's
    own (`results/mine`) is made empty there, since it must exist to parse."""
    (tmp_path / "results").mkdir()
    for folder in (ROOT / "results").iterdir():
        (tmp_path / "results" / folder.name).symlink_to(folder)
    monkeypatch.chdir(tmp_path)
    words = [expanded for word in shlex.split(command)[1:] for expanded in braces(word)]
    for _ in range(5):
        try:
            path = parse(words)
            break
        except click.exceptions.UsageError as error:
            missing = MISSING.search(error.format_message())
            if missing is None or (tmp_path / missing.group(1)).exists():
                pytest.fail(f"{doc}: `{command}` does not parse: {error.format_message()}")
            made = tmp_path / missing.group(1)
            made.parent.mkdir(parents=True, exist_ok=True)
            made.touch() if made.suffix else made.mkdir()
    assert path  # the leaf command it reached


def test_a_broken_command_would_fail_the_parse():
    with pytest.raises(click.exceptions.UsageError, match="No such option"):
        parse(["run", "--press", "knorm", "--ratioo", "0.5"])
    with pytest.raises(click.exceptions.UsageError):
        parse(["run", "--press", "knorm", "--protocol", "sideways"])
    with pytest.raises(click.exceptions.UsageError, match="No such command"):
        parse(["sweeep"])
    assert re.fullmatch(r"\('run',\)", str(parse(["run", "--press", "knorm", "--ratio", "0.5"])))
