"""The report as one list of document blocks (headings, paragraphs, tables, images, code), built from
the leaderboards; rendered to markdown and to HTML by reporting.render.
"""

import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from kvbench.config import DEFAULT_PROTOCOL
from kvbench.reporting.boards import Leaderboard
from kvbench.reporting.plots import Style, breakdown, plot_heatmap, plot_memory, plot_scores
from kvbench.reporting.read import REFERENCE_PRESS, Run
from kvbench.reporting.stats import Z95

# ---- document: one list of blocks rendered to markdown and to HTML --------------------------------------


@dataclass
class Heading:
    text: str
    level: int = 2


@dataclass
class Paragraph:
    text: str  # may hold `code` spans


@dataclass
class Table:
    frame: pd.DataFrame  # cells already formatted as strings; the index is the first column


@dataclass
class Image:
    path: Path
    caption: str


@dataclass
class Code:
    text: str


def fmt_score(value: float) -> str:
    return "" if pd.isna(value) else f"{value:.1f}"


def fmt_delta(value: float) -> str:
    return "" if pd.isna(value) else f"{value:+.1f}"


def fmt_interval(value: float, stderr: float) -> str:
    """`58.2 ± 4.2`: the score and its 95 % half-width; the score alone without an interval."""
    if pd.isna(value):
        return ""
    return fmt_score(value) if pd.isna(stderr) else f"{value:.1f} ± {Z95 * stderr:.1f}"


def fmt_fraction(value: float) -> str:
    """A fraction as the tables and tick labels write it: 0.248, 0.5, 1."""
    return "" if pd.isna(value) else f"{value:.3f}".rstrip("0").rstrip(".")


def fmt_bytes(value: float) -> str:
    units = ["B", "KiB", "MiB", "GiB"]
    power = 0
    while value >= 1024 and power < len(units) - 1:
        value, power = value / 1024, power + 1
    return f"{value:.0f} B" if power == 0 else f"{value:.1f} {units[power]}"


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
    """Formatted cells, each followed by what a reader needs besides its value: `extra` text (when given) and
    its sample count where that differs from the typical count, said once above the table (`typical`: per
    row; default the table's most common count)."""
    if typical is None:
        typical = pd.Series(typical_count(counts), index=cells.index)
    out = cells.copy()
    for row in cells.index:
        for column in cells.columns:
            text = cells.at[row, column]
            if not text:
                continue
            count = counts.at[row, column] if row in counts.index and column in counts.columns else None
            notes = [extra.at[row, column]] if extra is not None and extra.at[row, column] else []
            if count is not None and not pd.isna(count) and int(count) != typical.get(row):
                notes.append(f"n={int(count)}")
            out.at[row, column] = text + (f" ({', '.join(notes)})" if notes else "")
    return out


def samples_sentence(counts: pd.DataFrame) -> str:
    typical = typical_count(counts)
    if typical is None:
        return ""
    return f"Each cell averages {typical} samples unless it says otherwise (n=...)."


def ratio_columns(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.rename(columns=lambda ratio: f"{ratio:g}").rename_axis(index="press", columns=None)


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-")


def file_stem(board: Leaderboard) -> str:
    """Plot file names: model and length, and the protocol when it is not the default one."""
    stem = f"{slug(board.model)}-{board.length}"
    return stem if board.protocol == DEFAULT_PROTOCOL else f"{stem}-{slug(board.protocol)}"


def leaderboard_blocks(board: Leaderboard, out_dir: Path, styles: dict[str, Style]) -> list:
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
    if board.average.empty:
        blocks.append(Paragraph("No compressed configs run with a ratio: nothing to rank by ratio."))
    else:
        blocks += ratio_leaderboard_blocks(board, out_dir / f"{stem}-scores.png", styles)
    if board.has_bytes and board.memory_view is not None:
        blocks += memory_blocks(board, out_dir / f"{stem}-memory.png", styles)
    if not board.average.empty:
        blocks += detail_blocks(board, out_dir, stem)
    blocks += kept_blocks(board)
    blocks += longbench_blocks(board)
    missing = {(p, f"ratio {v:g}"): gaps for (p, v), gaps in board.missing.items()}
    if board.memory_view is not None:
        missing |= {(p, f"memory {v:g}"): gaps for (p, v), gaps in board.memory_view.missing.items()}
    if missing:
        blocks += [
            Heading("Missing results", 3),
            Paragraph(
                "Configs x tasks with fewer samples than the fullest config of the task or than runs/*.json "
                "requested (have/expected):"
            ),
            Code("\n".join(f"{p} @ {at}: " + ", ".join(gaps) for (p, at), gaps in missing.items())),
        ]
    return blocks + provenance_blocks(board.runs)


def interval_cells(average: pd.DataFrame, stderr: pd.DataFrame, missing) -> pd.DataFrame:
    """Each (press, budget) cell as "mean ± half-width", starred where some of its samples are missing."""
    return pd.DataFrame(
        {
            budget: [
                fmt_interval(average.at[press, budget], stderr.at[press, budget])
                + ("*" if (press, budget) in missing and pd.notna(average.at[press, budget]) else "")
                for press in average.index
            ]
            for budget in average.columns
        },
        index=average.index,
    )


def ratio_leaderboard_blocks(board: Leaderboard, plot: Path, styles: dict[str, Style]) -> list:
    """The leaderboard by compression ratio and its plot."""
    scores = interval_cells(board.average, board.stderr, board.missing)
    scores = ratio_columns(with_counts(scores, board.samples))
    scores["mean rank"] = board.mean_rank.map(lambda r: f"{r:.2f}")
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
            "Average score (0-100) ± its 95 % confidence half-width, per press and compression ratio "
            "(fraction of the KV entries removed). The average over tasks is the mean of the per-task means, "
            "so every task weighs the same whatever its number of samples; the half-width is 1.96 x its "
            "standard error over samples, tasks taken as independent (none with fewer than 2 samples in a "
            "task). Two presses whose averages differ by less than this are not told apart by these samples. "
            "Presses are sorted by mean rank. "
            + samples_sentence(board.samples)
            + (" `*`: incomplete, see Missing results." if board.missing else "")
            + codecs
        ),
        Table(scores),
        *lead_blocks(board.lead, "ratio"),
        *versus_blocks(board.versus, "ratio", board.baseline, board.average.index),
        Image(
            plot_scores(board, styles, plot),
            "Average score vs compression ratio; shaded: 95 % confidence interval",
        ),
    ]


def versus_blocks(versus: pd.DataFrame | None, key: str, baseline: str | None, order: pd.Index) -> list:
    """With `report --versus`: each press minus the baseline, paired by sample, per ratio or budget, in the
    leaderboard's order; bold where the difference is beyond its 95 % interval."""
    if versus is None or versus.empty:
        return []

    def cell(difference: float, stderr: float) -> str:
        text = ("+" if difference >= 0 else "") + fmt_interval(difference, stderr)
        return f"**{text}**" if pd.notna(stderr) and abs(difference) - Z95 * stderr > 0 else text

    cells = [cell(d, e) for d, e in zip(versus["difference"], versus["stderr"], strict=True)]
    table = versus.assign(cell=cells).pivot(index="press", columns=key, values="cell").fillna("")
    table = table.reindex([press for press in order if press in table.index])
    table = table[sorted(table.columns, reverse=key == "budget")]  # as the leaderboard: most memory first
    table.columns = [f"{column:g}" for column in table.columns]
    return [
        Paragraph(
            f"Each press minus `{baseline}`, paired by sample (same task and sample), averaged as the "
            "leaderboard averages ± 95 % half-width; bold: beyond the interval."
        ),
        Table(table),
    ]


def lead_blocks(lead: pd.DataFrame, key: str) -> list:
    """The leader's paired lead over the runner-up at each ratio or budget, and whether it is beyond noise."""
    if lead.empty:
        return []
    table = pd.DataFrame(
        {
            key: lead[key].map(lambda value: f"{value:g}"),
            "leader": lead["best"],
            "runner-up": lead["runner-up"],
            "lead (paired)": [
                ("+" if value >= 0 else "") + fmt_interval(value, stderr)
                for value, stderr in zip(lead["lead"], lead["stderr"], strict=True)
            ],
            "beyond the 95 % interval": [
                "" if pd.isna(stderr) else ("yes" if value - Z95 * stderr > 0 else "no")
                for value, stderr in zip(lead["lead"], lead["stderr"], strict=True)
            ],
            "pairs": lead["pairs"],
        }
    )
    return [
        Paragraph(
            "The leader's lead over the runner-up, paired: score differences on the samples both scored "
            "(same task and sample), averaged as the leaderboard averages (mean of the per-task means) ± "
            "95 % half-width. Pairing takes out what the two share (how hard each sample is), so it can "
            "tell two presses apart where their intervals above overlap."
        ),
        Table(table.set_index(key)),
    ]


def memory_blocks(board: Leaderboard, plot: Path, styles: dict[str, Style]) -> list:
    """The leaderboard by memory budget and the plot of every config at its measured memory fraction."""
    view = board.memory_view
    blocks = [Heading("Leaderboard by memory", 3)]
    if not view.average.empty:
        cells = interval_cells(view.average, view.stderr, view.missing)
        stored = view.measured.map(lambda m: "" if pd.isna(m) else f"stores {fmt_fraction(m)}")
        table = with_counts(cells, view.samples, stored).rename(columns=lambda budget: f"budget {budget:g}")
        table = table.rename_axis(index="press", columns=None)
        table["mean rank"] = view.mean_rank.map(lambda r: f"{r:.2f}")
        blocks += [
            Paragraph(
                "Average score ± 95 % half-width per press and memory budget asked (columns: fraction of the "
                "uncompressed 16-bit cache's bytes; codecs run with a ratio sit at budget 1 - ratio). "
                "`stores`: the memory fraction the press measured, mean over samples of kv_bytes / "
                "kv_bytes_full; below the budget, the press stored less than it was allowed. "
                + samples_sentence(view.samples)
                + (" `*`: incomplete, see Missing results." if view.missing else "")
            ),
            Table(table),
            *lead_blocks(view.lead, "budget"),
            *versus_blocks(view.versus, "budget", board.baseline, view.average.index),
        ]
    blocks += [
        Paragraph(
            "Every compressed config at the memory fraction it measured (configs run with a ratio included), "
            "evictors and codecs on one axis."
        ),
        Image(plot_memory(board, styles, plot), "Average score vs memory fraction; shaded: 95 % interval"),
    ]
    return blocks


def detail_blocks(board: Leaderboard, out_dir: Path, stem: str) -> list:
    """Deltas, ranks and per-task tables of the configs run with a ratio."""
    blocks = []
    if board.delta is not None:
        blocks += [
            Heading("Delta to no compression", 3),
            Paragraph("Mean over tasks of (task mean - no-compression task mean), on the tasks both ran."),
            Table(ratio_columns(board.delta.map(fmt_delta))),
        ]
    blocks += [
        Heading("Rank at each ratio", 3),
        Table(ratio_columns(board.rank.map(lambda r: "" if pd.isna(r) else f"{r:.0f}"))),
        Heading("Per-task scores", 3),
    ]
    for ratio in board.average.columns:
        table = breakdown(board, ratio)
        counts = breakdown(board, ratio, board.sample_counts)
        title = f"{board.title}\nratio {ratio:g}: mean score per task"
        heatmap = plot_heatmap(table, title, out_dir / f"{stem}-tasks-{ratio:g}.png")
        blocks += [
            Paragraph(
                f"Ratio {ratio:g}: mean score per task. Each cell averages the task's samples (see Samples "
                "per task) unless it says otherwise (n=...)."
            ),
            Table(with_counts(table.map(fmt_score), counts, typical=board.sample_counts.max(axis=0))),
            Image(heatmap, f"Task x press scores at ratio {ratio:g}"),
        ]
    return blocks


def kept_blocks(board: Leaderboard) -> list:
    if board.kept.empty:
        return []
    kept = board.kept.apply(
        lambda row: (
            f"{row['kept_fraction']:.1%}"
            + (f", memory {fmt_fraction(row['memory'])}" if board.has_bytes else "")
            + f" ({fmt_bytes(row['kept_bytes'])})"
        ),
        axis=1,
    ).unstack("ratio")
    kept = kept.reindex([p for p in [REFERENCE_PRESS, *board.average.index] if p in kept.index])
    return [
        Heading("KV cache kept", 3),
        Paragraph(
            "Mean over samples of kv_kept / kv_total (entries kept)"
            + (", of kv_bytes / kv_bytes_full (memory fraction)" if board.has_bytes else "")
            + ", and mean KV bytes kept per sample"
            + (
                " (kv_bytes, a 16-bit store, where rows record it; else the tensors in the compute dtype)."
                if board.has_bytes
                else " (the tensors in the compute dtype)."
            )
        ),
        Table(ratio_columns(kept.fillna(""))),
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
    order = [(REFERENCE_PRESS, 0.0)] + [(p, r) for r in board.average.columns for p in board.average.index]
    table = table.reindex([config for config in order if config in table.index])
    labels = [f"{p} @ {r:g}" + ("*" if (p, r) in board.missing else "") for p, r in table.index]
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


def provenance_blocks(runs: list[Run]) -> list:
    if not runs:
        return [
            Heading("Provenance", 3),
            Paragraph(
                "No runs/*.json (a run still going, or interrupted?): the commands, versions and "
                "requested sample counts are unknown."
            ),
        ]
    blocks = [Heading("Provenance", 3), Paragraph("The runs that produced these results:")]
    for run in runs:
        ended = (
            f"finished {fmt_time(run.finished)}"
            if run.finished
            else "unfinished (no end time recorded: still running, or interrupted)"
        )
        blocks += [  # when and where first, then the command it describes
            Paragraph(
                f"`{run.results_dir}`, git `{run.git_commit}`{describe_hardware(run.hardware)}, "
                f"started {fmt_time(run.started)}, {ended}:"
            ),
            Code(wrap_command(run.command) if run.command else "(command not recorded)"),
        ]
    packages = sorted({name for run in runs for name in run.versions})
    versions = pd.DataFrame(
        {"version": [" / ".join(sorted({str(run.versions.get(p, "?")) for run in runs})) for p in packages]},
        index=pd.Index(packages, name="package"),
    )
    return blocks + [Paragraph("Versions (several when runs differ):"), Table(versions)]
