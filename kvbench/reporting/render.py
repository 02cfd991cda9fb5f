"""Rendering: the document blocks as markdown (README.md) and, through a jinja2 template
(templates/report.html.j2), as self-contained HTML (index.html), both from the same blocks and table cells;
and `render_report`, which writes a whole report folder.
"""

import base64
import os
import re
import shutil
import tempfile
from collections.abc import Generator
from contextlib import contextmanager, suppress
from dataclasses import replace
from pathlib import Path

from kvbench.core.errors import BadInput, KvbenchError
from kvbench.core.validation import as_path, as_paths
from kvbench.reporting.blocks import (
    Code,
    Heading,
    Image,
    Paragraph,
    Table,
    file_stem,
    leaderboard_blocks,
    unique_stems,
)
from kvbench.reporting.boards import build_leaderboards, unscored_note
from kvbench.reporting.conformance import conformance_blocks, read_conformance
from kvbench.reporting.costs import Costs, cost_blocks, read_costs
from kvbench.reporting.perplexity import is_perplexity, perplexity_blocks
from kvbench.reporting.plots import press_styles
from kvbench.reporting.read import REFERENCE_PRESS, collect, only_presses, versus_press
from kvbench.store.results import rows_files

TEMPLATES = Path(__file__).parent / "templates"


class ReportWriteError(KvbenchError, OSError):
    """The report could not be written (a full disk, a file size limit, permissions): not the user's input,
    so exit 1, but one line; the report that was there stays as it was."""

    exit_code = 1


TITLE = "kvbench report"


def markdown_table(table: Table) -> str:
    lines = ["| " + " | ".join(table.header) + " |", "|" + "---|" * len(table.header)]
    for index, cells in table.rows:
        texts = [index] + [cell.markdown() for cell in cells]
        lines.append("| " + " | ".join(text.replace("|", "\\|") for text in texts) + " |")
    return "\n".join(lines)


def to_markdown(title: str, blocks: list) -> str:
    parts = [f"# {title}"]
    for block in blocks:
        if isinstance(block, Heading):
            parts.append("#" * block.level + " " + block.text)
        elif isinstance(block, Paragraph):
            parts.append(block.text)
        elif isinstance(block, Table):
            parts.append(markdown_table(block))
        elif isinstance(block, Image):
            parts.append(f"![{block.caption}]({block.path.name})")
        elif isinstance(block, Code):
            parts.append(f"```\n{block.text}\n```")
    return "\n\n".join(parts) + "\n"


def code_spans(text: str) -> list[tuple[str, bool]]:
    """A paragraph's text as (text, is code) pieces: `name` spans are code."""
    pieces = re.split(r"`([^`]*)`", text)
    return [(piece, i % 2 == 1) for i, piece in enumerate(pieces) if piece]


def data_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(Path(path).read_bytes()).decode("ascii")


def to_html(title: str, blocks: list) -> str:
    from jinja2 import Environment, FileSystemLoader, StrictUndefined

    environment = Environment(
        loader=FileSystemLoader(TEMPLATES),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    environment.filters["spans"] = code_spans
    environment.filters["data_uri"] = data_uri
    return environment.get_template("report.html.j2").render(title=title, blocks=blocks)


def render_report(
    result_dirs: Path | str | list,
    out: Path | str,
    recursive: bool = False,
    versus: str | None = None,
    presses: list[str] | None = None,
    every_state: bool = False,
    costs: Costs | Path | str | None = None,
) -> Path:
    """Write README.md, index.html and the PNG plots of the results in `result_dirs` (one folder or a
    list; with `recursive`, the folders below them too) into `out`; the folder written. `versus`: a press
    (as the run was given it, or as the leaderboard names it: `read.versus_press`) compared to every other
    press, paired by sample, and drawn prominent. `presses`: only these presses (named alike) and the
    reference; None: every press of the results.
    `every_state`: rows of a learned press's older states as presses of their own (PRESS@STATE). `costs`:
    what `kvbench speed` measured (its --out folder, or `read_costs` of it), set beside each leaderboard's
    scores."""
    out = as_path(out, "out")
    if rows_files(out):
        raise BadInput(f"--out {str(out)!r} is a results folder: give the report a folder of its own")
    if costs is not None and not isinstance(costs, Costs):
        costs = read_costs(as_path(costs, "costs"))  # checked before any row is read
    result_dirs = as_paths(result_dirs, "result_dirs")
    collected = collect(result_dirs, recursive, every_state)
    if presses:
        collected = only_presses(collected, presses)
    if versus:
        versus = versus_press(collected.rows, versus)
    perplexity = is_perplexity(collected.rows)  # NLLs, not scores: a section of their own
    scored = collected.rows[~perplexity]
    boards = build_leaderboards(scored, collected.runs, versus)
    stems = unique_stems([file_stem(board) for board in boards], [board.title for board in boards])
    boards = [replace(board, stem=stem) for board, stem in zip(boards, stems, strict=True)]
    folders = ", ".join(folder_label(folder, collected.runs) for folder in collected.dirs)
    blocks = [Paragraph(f"Results folders: {folders}")]
    notes = [*collected.notes, unscored_note(scored)]
    blocks += [Paragraph(note) for note in notes if note]
    presses = sorted(set(collected.rows["press"]) - {REFERENCE_PRESS})  # perplexity's too
    styles = press_styles(presses, versus)
    checked = read_conformance(collected.dirs)
    with staged(out) as stage:
        for board in boards:
            costed = cost_blocks(board, costs, stage, styles) if costs is not None else []
            blocks += leaderboard_blocks(board, stage, styles, costed + conformance_blocks(board, checked))
        blocks += perplexity_blocks(collected.rows[perplexity], stage, styles, collected.runs)
        (stage / "README.md").write_text(to_markdown(TITLE, blocks))
        (stage / "index.html").write_text(to_html(TITLE, blocks))
    return out


def folder_label(folder: str, runs: list) -> str:
    """A results folder as the report names it, with how many run records (runs/*.json) it holds."""
    count = sum(run.results_dir == folder for run in runs)
    return f"`{folder}` ({count or 'no'} run record{'' if count == 1 else 's'})"


@contextmanager
def staged(out_dir: Path) -> Generator[Path, None, None]:
    """A hidden folder inside `out_dir` (made if need be) to write a report's files into; once all are
    written, each is moved into `out_dir` (a rename, which writes no byte), so a report that fails half-way
    (a full disk, a file size limit) leaves the report that was there as it was, and no folder it made.
    Files of `out_dir` that the report does not write stay. A write that fails is a ReportWriteError (exit
    1): not the user's input; a file of the report that is a folder in `out_dir` is bad input, found before
    any file moves."""
    made = [folder for folder in (out_dir, *out_dir.parents) if not folder.exists()]
    stage = None
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(prefix=".report-", suffix=".tmp", dir=out_dir))
        yield stage
        files = sorted(stage.iterdir())
        for file in files:
            if (out_dir / file.name).is_dir() or (out_dir / file.name).is_symlink():
                raise BadInput(f"cannot write the report to {out_dir}: {out_dir / file.name} is not a file")
        for file in files:
            os.replace(file, out_dir / file.name)
        made = []
    except OSError as error:
        reason = error.strerror or str(error) or type(error).__name__
        raise ReportWriteError(f"cannot write the report to {out_dir}: {reason} (nothing written)") from None
    finally:
        if stage is not None:
            shutil.rmtree(stage, ignore_errors=True)
        for folder in made:  # deepest first; only those still empty
            with suppress(OSError):
                folder.rmdir()
