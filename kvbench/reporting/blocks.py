"""The report as one list of document blocks (headings, paragraphs, tables of cells, images, code), built
from the leaderboards; rendered to markdown and to HTML from the same blocks by reporting.render.
"""

import hashlib
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import ClassVar

import pandas as pd

from kvbench.core.config import DEFAULT_PROTOCOL
from kvbench.reporting.boards import Leaderboard, ScoreView, pairs_as_dict
from kvbench.reporting.plots import (
    Style,
    breakdown,
    budget_figure,
    heatmap_figure,
    memory_figure,
    save,
    scores_figure,
)
from kvbench.reporting.read import REFERENCE_PRESS, Run, config_label
from kvbench.reporting.stats import EXACT_UNITS, RESAMPLES, significant

# ---- document: one list of blocks rendered to markdown and to HTML --------------------------------------


@dataclass(frozen=True)
class Cell:
    """A table cell: its value, what a reader needs beside it (`note`: a sample count, the bytes stored),
    and whether it stands out (`strong`: a difference called significant, `stats.significant`). Markdown
    writes `**value** (note)`; HTML puts the value in <strong> and the note in a span of its own, so that a
    narrow column breaks between the two, never inside a number."""

    text: str
    note: str = ""
    strong: bool = False

    @property
    def numeric(self) -> bool:
        """A number (a score, an interval, a count): HTML never breaks it across lines; a name may break."""
        return re.match(r"[+-]?\d", self.text) is not None

    def markdown(self) -> str:
        if not self.text:
            return ""
        text = f"**{self.text}**" if self.strong else self.text
        return f"{text} ({self.note})" if self.note else text


def as_cell(value) -> Cell:
    """A frame's value as a cell; a missing value is an empty cell, never `None` or `nan`."""
    if isinstance(value, Cell):
        return value
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return Cell("")
    return Cell(str(value))


@dataclass
class Heading:
    kind: ClassVar[str] = "heading"
    text: str
    level: int = 2


@dataclass
class Paragraph:
    kind: ClassVar[str] = "paragraph"
    text: str  # may hold `code` spans


@dataclass
class Table:
    """A table: the frame's index is the first column (its name heads it), each value a Cell or text."""

    kind: ClassVar[str] = "table"
    frame: pd.DataFrame

    @property
    def header(self) -> list[str]:
        return [str(self.frame.index.name or "")] + [as_cell(column).text for column in self.frame.columns]

    @property
    def rows(self) -> list[tuple[str, list[Cell]]]:
        return [(as_cell(index).text, [as_cell(v) for v in row]) for index, row in self.frame.iterrows()]


@dataclass
class Image:
    kind: ClassVar[str] = "image"
    path: Path
    caption: str


@dataclass
class Code:
    kind: ClassVar[str] = "code"
    text: str


def fmt_score(value: float) -> str:
    return "" if pd.isna(value) else f"{value:.1f}"


def fmt_delta(value: float) -> str:
    return "" if pd.isna(value) else f"{value:+.1f}"


def fmt_interval(value: float, low: float, high: float, signed: bool = False) -> str:
    """`58.2 [54.0, 62.4]`: the value and its 95 % interval; the value alone without an interval.
    `signed`: a difference, every number with its sign (`+3.1 [-0.4, +6.6]`)."""
    if pd.isna(value):
        return ""
    number = fmt_delta if signed else fmt_score
    if pd.isna(low) or pd.isna(high):
        return number(value)
    return f"{number(value)} [{number(low)}, {number(high)}]"


def fmt_p(value: float) -> str:
    """A p-value: `0.125`, `<0.001`; empty where there is none."""
    if pd.isna(value):
        return ""
    return "<0.001" if value < 0.001 else f"{value:.3f}"


SIGNIFICANCE = (
    "a sign-flip test of the paired differences (each unit's sign flipped: all 2^n assignments up to "
    f"{EXACT_UNITS} units, {RESAMPLES:,} seeded random ones beyond) gives p < 0.05. The interval is the same "
    "test inverted (the differences it does not reject), so it excludes 0 exactly where the difference is "
    "significant; with 5 pairs or fewer nothing can be, and the interval is the whole range"
)


def fmt_fraction(value: float) -> str:
    """A fraction as the tables and tick labels write it: 0.248, 0.5, 1."""
    return "" if pd.isna(value) else f"{value:.3f}".rstrip("0").rstrip(".")


BYTE_UNITS = ("B", "KiB", "MiB", "GiB")


def byte_unit(values) -> int:
    """The power of 1024 one table writes all its bytes in: that of its largest value."""
    largest = max((value for value in values if pd.notna(value)), default=0)
    power = 0
    while largest >= 1024 and power < len(BYTE_UNITS) - 1:
        largest, power = largest / 1024, power + 1
    return power


def fmt_bytes(value: float, power: int) -> str:
    if pd.isna(value):
        return ""
    return f"{value:.0f} B" if power == 0 else f"{value / 1024**power:.1f} {BYTE_UNITS[power]}"


def fmt_time(stamp: str) -> str:
    """An ISO time stamp to the second, in UTC when it says so."""
    try:
        time = datetime.fromisoformat(stamp)
    except (TypeError, ValueError):
        return stamp or "unknown"
    if time.utcoffset() is not None and time.utcoffset().total_seconds() == 0:
        return time.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    return time.isoformat(sep=" ", timespec="seconds")


def typical_count(counts: pd.DataFrame) -> int | None:
    """The most common sample count of a table's cells (None when it has none)."""
    values = counts.stack()
    values = values[values > 0]
    return int(values.mode().min()) if len(values) else None


def with_counts(
    cells: pd.DataFrame,
    counts: pd.DataFrame,
    extra: pd.DataFrame | None = None,
    typical: pd.Series | None = None,
) -> pd.DataFrame:
    """Cells of the formatted values, each noting what a reader needs besides its value: `extra` text (when
    given) and its sample count where that differs from the typical count, said once above the table
    (`typical`: per row; default the table's most common count)."""
    if typical is None:
        typical = pd.Series(typical_count(counts), index=cells.index)
    out = pd.DataFrame(index=cells.index, columns=cells.columns, dtype=object)
    for row in cells.index:
        for column in cells.columns:
            text = cells.at[row, column]
            count = counts.at[row, column] if row in counts.index and column in counts.columns else None
            notes = [extra.at[row, column]] if text and extra is not None and extra.at[row, column] else []
            if text and count is not None and not pd.isna(count) and int(count) != typical.get(row):
                notes.append(f"n={int(count)}")
            out.at[row, column] = Cell(text, ", ".join(notes))
    return out


def samples_sentence(counts: pd.DataFrame, what: str = "samples") -> str:
    typical = typical_count(counts)
    if typical is None:
        return ""
    return f"Each cell averages {typical} {what} unless it says otherwise (n=...)."


def value_label(axis: str, value: float) -> str:
    """A view's column as the tables name it: `0.5` (a ratio), `budget 0.5` (a memory budget),
    `budget=128` (entries per head)."""
    return {"ratio": f"{value:g}", "memory": f"budget {value:g}", "budget": f"budget={value:.0f}"}[axis]


def setting_label(axis: str, value: float) -> str:
    """How a config is set, as `boards.setting_labels` names it: `ratio 0.5`, `memory 0.5`, `budget=128`."""
    return {"ratio": f"ratio {value:g}", "memory": f"memory {value:g}", "budget": f"budget={value:.0f}"}[axis]


def view_columns(frame: pd.DataFrame, axis: str) -> pd.DataFrame:
    return frame.rename(columns=lambda value: value_label(axis, value)).rename_axis(
        index="press", columns=None
    )


MAX_STEM = 96  # characters of a plot file's stem before its hash: a file name holds 255 bytes


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-")


def file_stem(board: Leaderboard) -> str:
    """Plot file names: model and length, and the protocol when it is not the default one (`board.stem`
    where `unique_stems` had to tell it apart)."""
    if board.stem:
        return board.stem
    stem = slug(board.model) + ("" if board.length is None else f"-{board.length}")
    return stem if board.protocol == DEFAULT_PROTOCOL else f"{stem}-{slug(board.protocol)}"


def unique_stems(stems: list[str], keys: list) -> list[str]:
    """The plot file stems of one report, each still naming one thing: a stem that another thing's shares
    (`org/m` and `org-m` both slug to `org-m`; case aside, as some file systems ignore it), or that runs
    past MAX_STEM characters (cut), ends in a short hash of its thing's key (`org-m-1a2b3c4d`). Stems
    that are unique already stay as they are, so a report's file names do not change for nothing."""
    counts: dict[str, int] = {}
    for stem in stems:
        counts[stem.casefold()] = counts.get(stem.casefold(), 0) + 1
    unique = []
    for stem, key in zip(stems, keys, strict=True):
        if counts[stem.casefold()] > 1 or len(stem) > MAX_STEM:
            digest = hashlib.sha1(repr(key).encode()).hexdigest()[:8]
            stem = f"{stem[:MAX_STEM].rstrip('-')}-{digest}"
        unique.append(stem)
    return unique


INTERVALS = (
    "The 95 % interval is Student's t over samples (Welch-Satterthwaite degrees of freedom across tasks; "
    "none where a task holds fewer than 2 samples), or Wilson's score interval where every score of the "
    "config is 0 or 100, clipped to 0-100 (see kvbench/reporting/stats.py)."
)


def views(board: Leaderboard) -> list[ScoreView]:
    return [view for view in (board.ratio, board.budget, board.memory) if view is not None]


def leaderboard_blocks(
    board: Leaderboard, out_dir: Path, styles: dict[str, Style], cost_blocks: tuple | list = ()
) -> list:
    """The board's sections; `cost_blocks` (the accuracy-against-cost view) go after the memory view."""
    blocks = [Heading(board.title)]
    if board.protocol != DEFAULT_PROTOCOL:
        blocks.append(
            Paragraph(
                f"Protocol `{board.protocol}`: these scores are not comparable to those of other protocols, "
                "and are never averaged with them."
            )
        )
    if board.reference is not None:
        blocks.append(Paragraph(f"No compression (`{REFERENCE_PRESS}`): {board.reference.mean():.1f}"))
    else:
        blocks.append(Paragraph(f"No `{REFERENCE_PRESS}` rows: no no-compression reference, no deltas."))
    stem = file_stem(board)
    if not board.presses:
        blocks.append(Paragraph("No compressed configs: nothing to rank."))
    if board.ratio is not None and not board.ratio.average.empty:
        blocks += ratio_leaderboard_blocks(board, out_dir / f"{stem}-scores.png", styles)
    if board.budget is not None:
        blocks += budget_blocks(board, out_dir / f"{stem}-budget.png", styles)
    if board.has_bytes and not board.memory_points.empty:
        blocks += memory_blocks(board, out_dir / f"{stem}-memory.png", styles)
    blocks += cost_blocks
    blocks += part_blocks(board)
    if board.ratio is not None and not board.ratio.average.empty:
        blocks += detail_blocks(board, out_dir, stem)
    if board.ratio is not None:
        blocks += kept_blocks(board.ratio, board.has_bytes, "KV cache kept")
    if board.budget is not None:
        blocks += kept_blocks(board.budget, board.has_bytes, "KV cache kept at each budget")
    blocks += samples_blocks(board)
    blocks += longbench_blocks(board)
    missing = {
        (press, setting_label(view.axis, value)): gaps
        for view in views(board)
        for (press, value), gaps in view.missing.items()
    }
    if missing:
        blocks += [
            Heading("Missing results", 3),
            Paragraph(
                "Configs x tasks with fewer samples than the fullest config of the task or than runs/*.json "
                "requested (have/expected):"
            ),
            Code("\n".join(f"{p} @ {at}: " + ", ".join(gaps) for (p, at), gaps in missing.items())),
        ]
    return blocks + provenance_blocks(board.runs, board.sources)


def interval_cells(view: ScoreView) -> pd.DataFrame:
    """Each (press, value) cell as "mean [low, high]", starred where some of its samples are missing."""
    return pd.DataFrame(
        {
            value: [
                fmt_interval(
                    view.average.at[press, value], view.low.at[press, value], view.high.at[press, value]
                )
                + ("*" if (press, value) in view.missing and pd.notna(view.average.at[press, value]) else "")
                for press in view.average.index
            ]
            for value in view.average.columns
        },
        index=view.average.index,
        dtype=object,
    )


def score_table(view: ScoreView, extra: pd.DataFrame | None = None) -> Table:
    table = view_columns(with_counts(interval_cells(view), view.samples, extra), view.axis)
    table["mean rank"] = view.mean_rank.map(lambda r: f"{r:.2f}")
    return Table(table)


def view_blocks(view: ScoreView, board: Leaderboard) -> list:
    """The paired lead of each column's leader, and the paired differences to the `--versus` press."""
    return [*lead_blocks(view), *versus_blocks(view, board.baseline)]


def ratio_leaderboard_blocks(board: Leaderboard, plot: Path, styles: dict[str, Style]) -> list:
    """The leaderboard by compression ratio and its plot."""
    view = board.ratio
    codecs = ""
    if board.codecs:
        codecs = (
            f" Codecs left out here: {', '.join(f'`{c}`' for c in board.codecs)}. They store their entries "
            "in fewer bytes (their memory fraction is not their kept-entry fraction), so a ratio does not "
            "say what they removed; see the leaderboard by memory."
        )
    return [
        Heading("Leaderboard by compression ratio", 3),
        Paragraph(
            "Average score (0-100) [95 % interval], per press and compression ratio (fraction of the KV "
            "entries removed). The average over tasks is the mean of the per-task means, so every task "
            "weighs the same whatever its number of samples. "
            + INTERVALS
            + " Two presses whose intervals overlap may still differ: see the paired comparisons below. "
            "Presses are sorted by mean rank. "
            + samples_sentence(view.samples)
            + (" `*`: incomplete, see Missing results." if view.missing else "")
            + codecs
        ),
        score_table(view),
        *view_blocks(view, board),
        Image(
            save(scores_figure(board, styles), plot),
            "Average score vs compression ratio; shaded: 95 % interval",
        ),
    ]


def budget_blocks(board: Leaderboard, plot: Path, styles: dict[str, Style]) -> list:
    """The leaderboard by absolute budget (entries per head) and its plot, KVP's paper's Figure 2 form."""
    view = board.budget
    if view.average.empty:
        return []
    return [
        Heading("Leaderboard by budget (KV entries per head)", 3),
        Paragraph(
            "Average score (0-100) [95 % interval] per press and absolute budget: `budget=N` keeps N KV "
            "entries per head in every layer, whatever the context's length (the ratio then differs from "
            "sample to sample; see KV cache kept). Averaged as the leaderboard by ratio. "
            + INTERVALS
            + " "
            + samples_sentence(view.samples)
            + (" `*`: incomplete, see Missing results." if view.missing else "")
        ),
        score_table(view),
        *view_blocks(view, board),
        Image(save(budget_figure(board, styles), plot), "Average score vs budget; shaded: 95 % interval"),
    ]


def versus_blocks(view: ScoreView, named: str | None) -> list:
    """With `report --versus`: the named press minus each other press, paired by sample, per column of the
    view, in its order; strong where significant (`stats.significant`)."""
    versus = view.versus
    if versus is None or versus.empty:
        return []
    cells = [
        Cell(fmt_interval(d, low, high, signed=True), strong=significant(p))
        for d, low, high, p in zip(
            versus["difference"], versus["low"], versus["high"], versus["p"], strict=True
        )
    ]
    axis = view.axis
    table = versus.assign(cell=cells).pivot(index="press", columns=axis, values="cell")
    pairs = versus.pivot(index="press", columns=axis, values="pairs")
    table = table.reindex(index=[press for press in view.average.index if press in table.index])
    table = table[[value for value in view.average.columns if value in table.columns]]
    typical = typical_count(pairs)
    table = table.apply(
        lambda column: [
            Cell(cell.text, f"n={pairs.at[press, column.name]:.0f}", cell.strong)
            if isinstance(cell, Cell) and pairs.at[press, column.name] != typical
            else cell
            for press, cell in column.items()
        ]
    )
    return [
        Paragraph(
            f"`{named}` minus each press, paired by sample (same task and sample), averaged as the "
            f"leaderboard averages, [95 % interval]: above 0, `{named}` scored higher. In bold where "
            + SIGNIFICANCE
            + ". "
            + (f"Each cell holds {typical} pairs unless it says otherwise (n=...)." if typical else "")
        ),
        Table(view_columns(table, axis).rename_axis(index=f"{named} minus")),
    ]


def lead_blocks(view: ScoreView) -> list:
    """The leader's paired lead over the runner-up at each column, and whether it is beyond noise."""
    lead = view.lead
    if lead.empty:
        return []
    table = pd.DataFrame(
        {
            view.axis: [value_label(view.axis, value) for value in lead[view.axis]],
            "leader": lead["best"],
            "runner-up": lead["runner-up"],
            "lead (paired)": [
                fmt_interval(value, low, high, signed=True)
                for value, low, high in zip(lead["lead"], lead["low"], lead["high"], strict=True)
            ],
            "p (sign-flip)": [fmt_p(p) for p in lead["p"]],
            "significant": ["" if pd.isna(p) else ("yes" if significant(p) else "no") for p in lead["p"]],
            "pairs": lead["pairs"].astype(str),
        }
    )
    return [
        Paragraph(
            "The leader's lead over the runner-up, paired: score differences on the samples both scored "
            "(same task and sample), averaged as the leaderboard averages (mean of the per-task means), "
            "[95 % interval]. Pairing takes out what the two share (how hard each sample is), so it can "
            "tell two presses apart where their intervals above overlap. It is significant where "
            + SIGNIFICANCE
            + "."
        ),
        Table(table.set_index(view.axis)),
    ]


def memory_blocks(board: Leaderboard, plot: Path, styles: dict[str, Style]) -> list:
    """The leaderboard by memory budget and the plot of every config at its measured memory fraction."""
    view = board.memory
    blocks = [Heading("Leaderboard by memory", 3)]
    if view is not None and not view.average.empty:
        stored = view.measured.map(lambda m: "" if pd.isna(m) else f"stores {fmt_fraction(m)}")
        blocks += [
            Paragraph(
                "Average score [95 % interval] per press and memory budget asked (columns: fraction of the "
                "uncompressed 16-bit cache's bytes; codecs run with a ratio sit at budget 1 - ratio). "
                "`stores`: the memory fraction the press measured, mean over samples of kv_bytes / "
                "kv_bytes_full; below the budget, the press stored less than it was allowed. "
                + INTERVALS
                + " "
                + samples_sentence(view.samples)
                + (" `*`: incomplete, see Missing results." if view.missing else "")
            ),
            score_table(view, stored),
            *view_blocks(view, board),
        ]
    blocks += [
        Paragraph(
            "Every compressed config at the memory fraction it measured (configs run with a ratio or a "
            "budget included), evictors and codecs on one axis."
        ),
        Image(
            save(memory_figure(board, styles), plot),
            "Average score vs memory fraction; shaded: 95 % interval",
        ),
    ]
    return blocks


def config_order(board: Leaderboard) -> list[tuple[str, str]]:
    """Every config as (press, setting), the reference first, then each view's columns in their order and
    the presses at each in leaderboard order."""
    order = [(REFERENCE_PRESS, setting_label("ratio", 0.0))]
    for view in views(board):
        order += [
            (press, setting_label(view.axis, value))
            for value in view.average.columns
            for press in view.average.index
        ]
    return order


def part_blocks(board: Leaderboard) -> list:
    """Under multi-question and multi-turn: each config's score at each question or turn."""
    if board.parts is None:
        return []
    name = board.part_name
    order = [config for config in config_order(board) if config in board.parts.index]
    labels = pd.Index([f"{press} @ {setting}" for press, setting in order], name="config")
    cells = board.parts.loc[order].map(fmt_score).set_axis(labels)
    counts = board.part_counts.loc[order].set_axis(labels)
    rename = {part: f"{name} {part + 1:.0f}" for part in board.parts.columns}
    explained = {
        "question": "every question of a context is answered from the same compressed cache, the previous "
        "answer removed",
        "turn": "each turn's question and answer stay in the cache, compressed back to its budget before the "
        "next turn",
    }[name]
    return [
        Heading(f"Score by {name}", 3),
        Paragraph(
            f"Mean score (mean of the per-task means) of each config at each {name} of a context, {name} 1 "
            f"asked first: {explained}. " + samples_sentence(board.part_counts)
        ),
        Table(with_counts(cells, counts).rename(columns=rename)),
    ]


def detail_blocks(board: Leaderboard, out_dir: Path, stem: str) -> list:
    """Deltas, ranks and per-task tables of the configs run with a ratio."""
    view = board.ratio
    blocks = []
    if board.delta is not None:
        blocks += [
            Heading("Delta to no compression", 3),
            Paragraph("Mean over tasks of (task mean - no-compression task mean), on the tasks both ran."),
            Table(view_columns(board.delta.map(fmt_delta), "ratio")),
        ]
    blocks += [
        Heading("Rank at each ratio", 3),
        Table(view_columns(view.rank.map(lambda r: "" if pd.isna(r) else f"{r:.0f}"), "ratio")),
        Heading("Per-task scores", 3),
    ]
    for ratio in view.average.columns:
        table = breakdown(board, ratio)
        counts = breakdown(board, ratio, board.sample_counts)
        title = f"{board.title}\nratio {ratio:g}: mean score per task"
        path = out_dir / f"{stem}-tasks-{ratio:.10g}.png"  # ratios 10 digits apart are two files
        heatmap = save(heatmap_figure(table, title), path, dpi=100)
        blocks += [
            Paragraph(
                f"Ratio {ratio:g}: mean score per task. Each cell averages the task's samples (see Samples "
                "per task) unless it says otherwise (n=...)."
            ),
            Table(with_counts(table.map(fmt_score), counts, typical=board.sample_counts.max(axis=0))),
            Image(heatmap, f"Task x press scores at ratio {ratio:g}"),
        ]
    return blocks


def kept_blocks(view: ScoreView, has_bytes: bool, heading: str) -> list:
    """Each config's kept-entry fraction, memory fraction and bytes kept, the bytes in one unit."""
    kept = view.kept
    if kept.empty:
        return []
    power = byte_unit(kept["kept_bytes"])
    cells = kept.apply(
        lambda row: Cell(
            f"{row['kept_fraction']:.1%}",
            ", ".join(
                part
                for part in (
                    f"memory {fmt_fraction(row['memory'])}" if has_bytes else "",
                    fmt_bytes(row["kept_bytes"], power),
                )
                if part
            ),
        ),
        axis=1,
    ).unstack(view.axis)
    presses = [REFERENCE_PRESS, *view.average.index]
    values = [value for value in cells.columns if value not in view.average.columns]  # the reference's
    cells = cells.reindex(index=[press for press in presses if press in cells.index])
    cells = cells[values + list(view.average.columns)]  # in the view's order: most memory first
    return [
        Heading(heading, 3),
        Paragraph(
            "Mean over samples of kv_kept / kv_total (entries kept)"
            + (", of kv_bytes / kv_bytes_full (memory fraction)" if has_bytes else "")
            + f", and mean KV bytes kept per sample, in {BYTE_UNITS[power]}, as a 16-bit cache stores them "
            "(kv_bytes; for rows written before kvbench recorded it, the entries at the compute dtype their "
            "runs record, scaled to 16 bits)."
        ),
        Table(view_columns(cells, view.axis)),
    ]


def samples_blocks(board: Leaderboard) -> list:
    if board.sample_counts.empty:
        return []
    return [
        Heading("Samples per task", 3),
        Table(
            pd.DataFrame(
                {
                    "samples": board.sample_counts.max(axis=0).astype(str),
                    "mean context tokens": board.context_tokens.reindex(board.sample_counts.columns).map(
                        lambda t: f"{t:.0f}"
                    ),
                }
            ).rename_axis(index="task")
        ),
    ]


def config_rows(board: Leaderboard, table: pd.DataFrame) -> pd.DataFrame:
    """A (press, ratio)-indexed table of scores, formatted, reference first then by ratio in leaderboard
    order, one row per config named "press @ ratio" with `*` on incomplete configs."""
    view = board.ratio
    order = [(REFERENCE_PRESS, 0.0)] + [(p, r) for r in view.average.columns for p in view.average.index]
    table = table.reindex([config for config in order if config in table.index])
    labels = [f"{p} @ {r:g}" + ("*" if (p, r) in view.missing else "") for p, r in table.index]
    return table.map(fmt_score).set_axis(pd.Index(labels, name="config"))


def longbench_blocks(board: Leaderboard) -> list:
    blocks = []
    for family, table in board.longbench.items():
        blocks += [
            Heading(f"{'LongBench-E' if family == 'longbench-e' else 'LongBench'} by category", 3),
            Paragraph(
                "Mean of the per-task means in each LongBench category; Average is the plain mean over "
                "datasets, as LongBench reports it."
            ),
            Table(config_rows(board, table)),
        ]
    if board.longbench_e_buckets is not None:
        blocks += [
            Heading("LongBench-E by context length", 3),
            Paragraph(
                "Mean over LongBench-E tasks of the per-task mean score in each length bucket (words)."
            ),
            Table(config_rows(board, board.longbench_e_buckets)),
        ]
    return blocks


def wrap_command(command: str, width: int = 96) -> str:
    """A long shell command over several lines (` \\` continued), broken before options only, so that an
    option stays with its values and the command still pastes into a shell."""
    units = []  # an option with the words after it up to the next option
    for word in command.split(" "):
        if units and not word.startswith("-"):
            units[-1] += " " + word
        else:
            units.append(word)
    lines, line = [], ""
    for unit in units:
        if line and len(line) + 1 + len(unit) > width:
            lines.append(line + " \\")
            line = "    " + unit
        else:
            line = f"{line} {unit}" if line else unit
    return "\n".join([*lines, line])


def describe_hardware(hardware: dict) -> str:
    """ ", on NVIDIA H200 + 16 CPUs" or ", on 2 CPUs"; "" for runs recorded before kvbench noted it."""
    if "cpus" not in hardware:
        return ""
    gpu = f"{hardware['gpu']} + " if hardware.get("gpu") else ""
    return f", on {gpu}{hardware['cpus']} CPUs"


def ran_press(run: Run, press: str) -> bool:
    """Whether a run record's configs name `press` as the report labels it (`PRESS@STATE` as `PRESS`)."""
    configs = run.config.get("configs")
    return isinstance(configs, list) and any(
        isinstance(config, dict)
        and config_label(str(config.get("press")), pairs_as_dict(config.get("press_args")))
        == press.partition("@")[0]
        for config in configs
    )


def describe_source(source: dict) -> str:
    """Where a press's code comes from, as its rows record it: a user's target, file (or package) and
    sha256; kvbench's registry otherwise; and its learned state's digest, where it loads one."""
    if source.get("target"):
        where = [f"file {source['file']}"] if source.get("file") else []
        if source.get("package"):
            where.append(f"package {source['package']} {source.get('version') or ''}".strip())
        where.append(f"sha256 {source['sha256']}" if source.get("sha256") else "sha256 not recorded")
        text = f"{source['target']} ({', '.join(where)})"
    else:
        text = "kvbench's registry (see kvbench presses)"
    own = (source.get("sha256") or "")[:12]  # a user's press is keyed by its file's digest too
    states = [part for part in (source.get("state") or "").split("+") if part and part != own]
    return text + (f", learned state {'+'.join(states)}" if states else "")


def press_blocks(runs: list[Run], sources: dict[str, list[dict]]) -> list:
    """Each press's source, sha256 and the runs (numbered as Provenance numbers them) that ran it."""
    if not sources:
        return []
    lines = []
    for press, found in sources.items():
        numbers = [str(number) for number, run in enumerate(runs, 1) if ran_press(run, press)]
        ran = f"; run {', '.join(numbers)}" if numbers else "; no run record names it"
        lines += [f"{press}: {describe_source(source)}{ran}" for source in found]
    return [
        Paragraph("Presses: where each press's code comes from, and the runs below that ran it."),
        Code("\n".join(lines)),
    ]


def provenance_blocks(runs: list[Run], sources: dict[str, list[dict]] | None = None) -> list:
    presses = press_blocks(runs, sources or {})
    if not runs:
        return [
            Heading("Provenance", 3),
            *presses,
            Paragraph(
                "No runs/*.json (a run still going, or interrupted?): the commands, versions and "
                "requested sample counts are unknown."
            ),
        ]
    blocks = [Heading("Provenance", 3), *presses, Paragraph("The runs that produced these results:")]
    for number, run in enumerate(runs, 1):
        ended = (
            f"finished {fmt_time(run.finished)}"
            if run.finished
            else "unfinished (no end time recorded: still running, or interrupted)"
        )
        blocks += [  # when and where first, then the command it describes
            Paragraph(
                f"Run {number}: `{run.results_dir}`, git `{run.git_commit}`"
                f"{describe_hardware(run.hardware)}, started {fmt_time(run.started)}, {ended}:"
            ),
            Code(wrap_command(run.command) if run.command else "(command not recorded)"),
        ]
    packages = sorted({name for run in runs for name in run.versions})
    versions = pd.DataFrame(
        {"version": [" / ".join(sorted({str(run.versions.get(p, "?")) for run in runs})) for p in packages]},
        index=pd.Index(packages, name="package"),
    )
    return blocks + [Paragraph("Versions (several when runs differ):"), Table(versions)]
