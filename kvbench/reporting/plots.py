"""The report's plots: score against ratio and against memory, per press in a fixed style, and
heatmaps of per-task scores.
"""

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from kvbench.reporting.boards import Leaderboard
from kvbench.reporting.read import REFERENCE_PRESS
from kvbench.reporting.stats import Z95

# ---- plots ---------------------------------------------------------------------------------------------

# Okabe and Ito's colours (without black and the pale yellow), told apart under the common colour-vision
# deficiencies, then Paul Tol's wine, olive and indigo; a marker per press on top. The no-compression
# reference is black and dashed: no press looks like it.
PALETTE = (
    *("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00"),
    *("#882255", "#999933", "#332288"),
)
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "h", "<", ">", "p")


@dataclass(frozen=True)
class Style:
    """How one press is drawn, the same in every plot of a report."""

    color: str
    marker: str
    linestyle: str


def press_styles(presses: list[str]) -> dict[str, Style]:
    """A colour and a marker per press; past the palette, colours repeat with another marker and dashes."""
    return {
        press: Style(PALETTE[i % len(PALETTE)], MARKERS[i % len(MARKERS)], "-" if i < len(PALETTE) else "--")
        for i, press in enumerate(presses)
    }


def new_figure(width: float, height: float):
    # A bare Figure on the Agg canvas: no pyplot global state, nothing to close, works headless.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def plain_ticks(axis) -> None:
    """Tick labels as the tables write numbers: 0.9, not 0.90."""
    from matplotlib.ticker import FuncFormatter

    axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))


def draw_press(ax, x: pd.Series, score: pd.Series, half_width: pd.Series, label: str, style: Style) -> None:
    """One press: its line and markers, and its 95 % interval as a band (a bar for a lone point)."""
    ax.plot(
        x, score, color=style.color, marker=style.marker, linestyle=style.linestyle, label=label, markersize=6
    )
    if len(x) > 1:
        ax.fill_between(x, score - half_width, score + half_width, color=style.color, alpha=0.15, linewidth=0)
    else:
        ax.errorbar(x, score, yerr=half_width, color=style.color, capsize=3, linestyle="none")


def finish_score_axes(ax, board: Leaderboard, title: str) -> None:
    if board.reference is not None:
        reference = board.reference.mean()
        ax.axhline(reference, linestyle="--", color="black", label=f"none (no compression): {reference:.1f}")
    ax.set_ylim(-3, 103)  # the full score range, so plots of different sweeps compare at a glance
    plain_ticks(ax.yaxis)
    ax.set_ylabel("average score (mean of task means)")
    ax.set_title(f"{board.title}\n{title}; shaded: 95 % interval", fontsize="medium")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))


def plot_scores(board: Leaderboard, styles: dict[str, Style], path: Path) -> Path:
    """Average score vs compression ratio, one line per press with its 95 % band, dashed line at no
    compression."""
    figure = new_figure(8, 4.8)
    ax = figure.subplots()
    for press in board.average.index:
        score = board.average.loc[press].dropna()
        half_width = Z95 * board.stderr.loc[press, score.index]
        draw_press(ax, score.index, score, half_width, press, styles[press])
    ax.set_xticks(list(board.average.columns))
    plain_ticks(ax.xaxis)
    ax.set_xlabel("compression ratio (fraction of KV entries removed)")
    finish_score_axes(ax, board, "average score vs compression ratio")
    figure.savefig(path, dpi=110)
    return path


def plot_memory(board: Leaderboard, styles: dict[str, Style], path: Path) -> Path:
    """Average score vs measured memory fraction: evictors and codecs on one axis."""
    figure = new_figure(8, 4.8)
    ax = figure.subplots()
    points = board.memory_view.points
    best_first = points.groupby("press")["average"].max().sort_values(ascending=False).index
    for press in best_first:
        mine = points[points["press"] == press].sort_values("memory")
        draw_press(ax, mine["memory"], mine["average"], Z95 * mine["stderr"], press, styles[press])
    ax.set_xlim(0, 1.05)
    plain_ticks(ax.xaxis)
    ax.set_xlabel("memory fraction (KV bytes stored / uncompressed 16-bit cache)")
    finish_score_axes(ax, board, "average score vs memory")
    figure.savefig(path, dpi=110)
    return path


def breakdown(board: Leaderboard, ratio: float, table: pd.DataFrame | None = None) -> pd.DataFrame:
    """Task x press values of `table` (default the mean scores) at one ratio, the no-compression reference
    first when there is one."""
    table = board.task_scores if table is None else table
    presses_at_ratio = board.average.index[board.average[ratio].notna()]
    at_ratio = table.xs(ratio, level="ratio").loc[presses_at_ratio]
    if board.reference is not None:
        at_ratio = pd.concat([table.loc[[(REFERENCE_PRESS, 0.0)]].droplevel("ratio"), at_ratio])
    return at_ratio.T.rename_axis(index="task", columns="press")


def plot_heatmap(table: pd.DataFrame, title: str, path: Path) -> Path:
    import seaborn as sns

    figure = new_figure(2.8 + 0.95 * table.shape[1], 2.0 + 0.42 * table.shape[0])
    ax = figure.subplots()
    sns.heatmap(
        table,
        annot=True,
        fmt=".1f",
        vmin=0,
        vmax=100,
        cmap="viridis",
        ax=ax,
        cbar_kws={"label": "mean score (0-100)"},
    )
    ax.tick_params(axis="y", labelrotation=0)  # task names read across, whatever the table's height
    ax.tick_params(axis="x", labelrotation=30)
    for label in ax.get_xticklabels():
        label.set_horizontalalignment("right")
        label.set_rotation_mode("anchor")
    ax.set_title(title, fontsize="medium")
    figure.savefig(path, dpi=100)
    return path
