"""Rendering: the document blocks as markdown (README.md) and self-contained HTML (index.html), and
`render_report`, which writes a whole report folder.
"""

import base64
import html
import re
from pathlib import Path

import pandas as pd

from kvbench.errors import BadInput
from kvbench.reporting.blocks import Code, Heading, Image, Paragraph, Table, leaderboard_blocks
from kvbench.reporting.boards import build_leaderboards
from kvbench.reporting.perplexity import is_perplexity, perplexity_blocks
from kvbench.reporting.plots import press_styles
from kvbench.reporting.read import REFERENCE_PRESS, collect, only_presses


def cell_text(value) -> str:
    """A table cell as text; a missing value is an empty cell, never `None` or `nan`."""
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return ""
    return str(value)


def markdown_table(frame: pd.DataFrame) -> str:
    header = [frame.index.name or ""] + [cell_text(c) for c in frame.columns]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for index, row in frame.iterrows():
        cells = [cell_text(index)] + [cell_text(v) for v in row]
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines)


def html_table(frame: pd.DataFrame) -> str:
    """One header row (the index name heads the first column), then one row per index entry."""
    header = "".join(
        f"<th>{html.escape(c)}</th>" for c in [frame.index.name or ""] + list(map(cell_text, frame))
    )
    body = [
        f"<tr><th>{html.escape(cell_text(index))}</th>"
        + "".join(f"<td>{html.escape(cell_text(v))}</td>" for v in row)
        + "</tr>"
        for index, row in frame.iterrows()
    ]
    return f"<table>\n<thead><tr>{header}</tr></thead>\n<tbody>\n" + "\n".join(body) + "\n</tbody>\n</table>"


def to_markdown(title: str, blocks: list) -> str:
    parts = [f"# {title}"]
    for block in blocks:
        if isinstance(block, Heading):
            parts.append("#" * block.level + " " + block.text)
        elif isinstance(block, Paragraph):
            parts.append(block.text)
        elif isinstance(block, Table):
            parts.append(markdown_table(block.frame))
        elif isinstance(block, Image):
            parts.append(f"![{block.caption}]({block.path.name})")
        elif isinstance(block, Code):
            parts.append(f"```\n{block.text}\n```")
    return "\n\n".join(parts) + "\n"


STYLE = """
body { font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; padding: 0 1em; color: #222; }
h2 { border-bottom: 1px solid #ccc; padding-bottom: 0.2em; margin-top: 2em; }
table { border-collapse: collapse; margin: 0.5em 0 1em; font-size: 0.9em; display: block; overflow-x: auto; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; white-space: nowrap; }
th:first-child, td:first-child { text-align: left; }
thead th { background: #f0f0f0; }
tbody th { font-weight: normal; }
pre { background: #f6f6f6; padding: 0.6em; white-space: pre-wrap; overflow-wrap: anywhere; }
img { max-width: 100%; }
figure { margin: 1em 0; }
figcaption { color: #555; font-size: 0.9em; }
"""


def inline_html(text: str) -> str:
    return re.sub(r"`([^`]*)`", r"<code>\1</code>", html.escape(text))


def to_html(title: str, blocks: list) -> str:
    parts = []
    for block in blocks:
        if isinstance(block, Heading):
            parts.append(f"<h{block.level}>{html.escape(block.text)}</h{block.level}>")
        elif isinstance(block, Paragraph):
            parts.append(f"<p>{inline_html(block.text)}</p>")
        elif isinstance(block, Table):
            parts.append(html_table(block.frame))
        elif isinstance(block, Image):
            data = base64.b64encode(block.path.read_bytes()).decode("ascii")
            parts.append(
                f'<figure><img alt="{html.escape(block.caption)}" src="data:image/png;base64,{data}">'
            )
            parts.append(f"<figcaption>{html.escape(block.caption)}</figcaption></figure>")
        elif isinstance(block, Code):
            parts.append(f"<pre>{html.escape(block.text)}</pre>")
    head = f'<meta charset="utf-8"><title>{html.escape(title)}</title><style>{STYLE}</style>'
    return (
        f"<!DOCTYPE html>\n<html><head>{head}</head><body>\n<h1>{html.escape(title)}</h1>\n"
        + "\n".join(parts)
        + "\n</body></html>\n"
    )


def render_report(
    result_dirs: Path | str | list,
    out: Path | str,
    recursive: bool = False,
    versus: str | None = None,
    presses: list[str] | None = None,
    every_state: bool = False,
) -> Path:
    """Write README.md, index.html and the PNG plots of the results in `result_dirs` (one folder or a
    list; with `recursive`, the folders below them too) into `out`; the folder written. `versus`: a press,
    as the leaderboard names it, that every other press is compared to, paired by sample. `presses`: only
    these presses (as the leaderboard names them) and the reference; None: every press of the results.
    `every_state`: rows of a learned press's older states as presses of their own (PRESS@STATE)."""
    if isinstance(result_dirs, (str, Path)):
        result_dirs = [result_dirs]
    collected = collect(result_dirs, recursive, every_state)
    if presses:
        collected = only_presses(collected, presses)
    perplexity = is_perplexity(collected.rows)  # NLLs, not scores: a section of their own
    boards = build_leaderboards(collected.rows[~perplexity], collected.runs, versus)
    names = sorted(
        {press for board in boards for press in board.average.index}
        | {press for board in boards if board.memory_view for press in board.memory_view.average.index}
    )
    if versus and versus not in names:
        raise BadInput(f"--versus {versus!r} is not a press of these results (they hold {', '.join(names)})")
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    blocks = [Paragraph("Results folders: " + ", ".join(f"`{d}`" for d in collected.dirs))]
    blocks += [Paragraph(note) for note in collected.notes]
    styles = press_styles(sorted(set(collected.rows["press"]) - {REFERENCE_PRESS}))
    for board in boards:
        blocks += leaderboard_blocks(board, out_dir, styles)
    blocks += perplexity_blocks(collected.rows[perplexity], out_dir, styles)
    title = "kvbench report"
    (out_dir / "README.md").write_text(to_markdown(title, blocks))
    (out_dir / "index.html").write_text(to_html(title, blocks))
    return out_dir
