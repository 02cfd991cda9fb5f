"""The report's plots: score against ratio, against memory and against absolute budget, each press in the
look it has in every report, and heatmaps of per-task scores. Titles are wrapped to their figure's width.
"""

import hashlib
import textwrap
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd

from kvbench.reporting.boards import Leaderboard, ScoreView
from kvbench.reporting.read import REFERENCE_PRESS

# Okabe and Ito's colours (without black and the pale yellow), told apart under the common colour-vision
# deficiencies, then Paul Tol's; a marker per press on top. The no-compression reference is black and
# dashed: no press looks like it.
BLUE, ORANGE, GREEN, PINK, SKY, VERMILLION = "#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00"
WINE, OLIVE, INDIGO, TEAL, GREY, BROWN = "#882255", "#999933", "#332288", "#44AA99", "#888888", "#661100"
PALETTE = (BLUE, ORANGE, GREEN, PINK, SKY, VERMILLION, WINE, OLIVE, INDIGO, TEAL, GREY, BROWN)
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "h", "<", ">", "p")
# One look per press in every report, so that kvp is blue circles wherever a reader meets it. The presses
# the committed reports hold each get their own (colour, marker); presses that reports show together
# (the reference set; kvpress's other presses beside kvp, streaming_llm and knorm; the codecs of the
# memory study) differ in colour.
PRESS_LOOKS = {
    "kvp": (BLUE, "o"),
    "streaming_llm": (ORANGE, "s"),
    "tova": (GREEN, "^"),
    "distillcache": (PINK, "D"),
    "h2o": (SKY, "v"),
    "snapkv": (VERMILLION, "P"),
    "knorm": (WINE, "X"),
    "expected_attention": (OLIVE, "*"),
    "random": (GREY, "h"),
    "memdecay": (INDIGO, "<"),
    "qevict": (TEAL, ">"),
    "quant": (BROWN, "p"),
    "compactor": (GREEN, "D"),
    "leverage": (PINK, "^"),
    "cap": (SKY, "s"),
    "kvzip": (VERMILLION, "o"),
    "lagkv": (OLIVE, "v"),
    "non_causal_attention": (GREY, "P"),
    "keydiff": (INDIGO, "X"),
    "pyramidkv": (TEAL, "*"),
    "cur": (BROWN, "h"),
    "andpro": (OLIVE, "s"),
    "lowrank": (INDIGO, "o"),
    "varrate": (SKY, "D"),
}


@dataclass(frozen=True)
class Style:
    """How one press is drawn, the same in every plot of every report."""

    color: str
    marker: str
    linestyle: str
    linewidth: float = 1.5  # matplotlib's default


def press_style(press: str) -> Style:
    """A press's look: its own from PRESS_LOOKS; any other press, and any variant of one (a label with
    arguments, `kvp(agents=...)`, or an older learned state, `kvp@58260c05679a`), a colour and a marker
    from a stable hash of its label, dashed for a variant. Two such presses may share a colour (12 x 12
    looks), never a press of PRESS_LOOKS its exact look."""
    if press in PRESS_LOOKS:
        return Style(*PRESS_LOOKS[press], "-")
    digest = int.from_bytes(hashlib.sha1(press.encode()).digest()[:8], "big")
    taken = set(PRESS_LOOKS.values())
    looks = [(color, marker) for color in PALETTE for marker in MARKERS if (color, marker) not in taken]
    variant = "(" in press or "@" in press
    return Style(*looks[digest % len(looks)], "--" if variant else "-")


# The press a report is about (`report --versus`): a colour no other press has, solid and thick, on top.
HIGHLIGHT = Style("#E8000B", "o", "-", 3.0)


def press_styles(presses: list[str], highlight: str | None = None) -> dict[str, Style]:
    """Each press's look (`press_style`); `highlight` drawn prominent (`HIGHLIGHT`, its own marker kept)."""
    styles = {press: press_style(press) for press in presses}
    if highlight in styles:
        styles[highlight] = replace(HIGHLIGHT, marker=styles[highlight].marker)
    return styles


def wrapped_title(text: str, width_inches: float, points: float = 10) -> str:
    """`text` broken into lines that fit `width_inches` at `points` (a character is about 0.6 em wide in
    the default sans-serif), each of its own lines kept apart."""
    characters = max(20, int(width_inches * 72 / (0.6 * points)))
    return "\n".join(textwrap.fill(line, characters) for line in text.split("\n"))


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


def draw_press(ax, x: pd.Series, score: pd.Series, low: pd.Series, high: pd.Series, label: str, style: Style):
    """One press: its line and markers, and its 95 % interval as a band (a bar for a lone point)."""
    ax.plot(
        x,
        score,
        color=style.color,
        marker=style.marker,
        linestyle=style.linestyle,
        linewidth=style.linewidth,
        label=label,
        markersize=6,
        zorder=3 if style.linewidth > Style.linewidth else 2,
    )
    if len(x) > 1:
        ax.fill_between(x, low, high, color=style.color, alpha=0.15, linewidth=0)
    else:
        error = error_bars(score, low, high)
        ax.errorbar(x, score, yerr=error, color=style.color, capsize=3, linestyle="none")


def error_bars(score, low, high) -> list[list[float]]:
    """Matplotlib's [below, above] lengths of the intervals [low, high] around `score` (series or lists),
    each at least 0: a bound that misses its estimate by rounding (a Wilson lower bound of 5.6e-15 at a
    score of 0) or a missing interval draws no bar, where a negative length would make matplotlib raise."""
    below = (pd.Series(score, dtype=float) - pd.Series(low, dtype=float)).fillna(0).clip(lower=0)
    above = (pd.Series(high, dtype=float) - pd.Series(score, dtype=float)).fillna(0).clip(lower=0)
    return [below.tolist(), above.tolist()]


def finish_score_axes(ax, board: Leaderboard, title: str) -> None:
    if board.reference is not None:
        reference = board.reference.mean()
        ax.axhline(reference, linestyle="--", color="black", label=f"none (no compression): {reference:.1f}")
    ax.set_ylim(-3, 103)  # the full score range, so plots of different sweeps compare at a glance
    plain_ticks(ax.yaxis)
    ax.set_ylabel("average score (mean of task means)")
    width = ax.figure.get_figwidth()
    ax.figure.suptitle(wrapped_title(f"{board.title}\n{title}; shaded: 95 % interval", width), fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))


def view_lines(ax, view: ScoreView, styles: dict[str, Style]) -> None:
    """One line per press of a view, in its order, over the view's values."""
    for press in view.average.index:
        score = view.average.loc[press].dropna()
        low, high = (frame.loc[press, score.index] for frame in (view.low, view.high))
        draw_press(ax, pd.Series(score.index, index=score.index), score, low, high, press, styles[press])


def scores_figure(board: Leaderboard, styles: dict[str, Style]):
    """Average score vs compression ratio, one line per press with its 95 % band, dashed line at no
    compression."""
    figure = new_figure(8, 4.8)
    ax = figure.subplots()
    view_lines(ax, board.ratio, styles)
    ax.set_xticks(list(board.ratio.average.columns))
    plain_ticks(ax.xaxis)
    ax.set_xlabel("compression ratio (fraction of KV entries removed)")
    finish_score_axes(ax, board, "average score vs compression ratio")
    return figure


def budget_figure(board: Leaderboard, styles: dict[str, Style]):
    """Average score vs absolute budget (KV entries kept per head and layer) on a log2 axis, as KVP's paper
    draws accuracy against KV cache size (its Figure 2)."""
    figure = new_figure(8, 4.8)
    ax = figure.subplots()
    view_lines(ax, board.budget, styles)
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(board.budget.average.columns))
    plain_ticks(ax.xaxis)
    ax.minorticks_off()
    ax.set_xlabel("budget (KV entries kept per head and layer, log scale)")
    finish_score_axes(ax, board, "average score vs absolute budget")
    return figure


def memory_figure(board: Leaderboard, styles: dict[str, Style]):
    """Average score vs measured memory fraction: evictors and codecs on one axis."""
    figure = new_figure(8, 4.8)
    ax = figure.subplots()
    points = board.memory_points
    best_first = points.groupby("press")["average"].max().sort_values(ascending=False).index
    for press in best_first:
        mine = points[points["press"] == press].sort_values("memory")
        draw_press(ax, mine["memory"], mine["average"], mine["low"], mine["high"], press, styles[press])
    ax.set_xlim(0, 1.05)
    plain_ticks(ax.xaxis)
    ax.set_xlabel("memory fraction (KV bytes stored / uncompressed 16-bit cache)")
    finish_score_axes(ax, board, "average score vs memory")
    return figure


def breakdown(board: Leaderboard, ratio: float, table: pd.DataFrame | None = None) -> pd.DataFrame:
    """Task x press values of `table` (default the mean scores) at one ratio, the no-compression reference
    first when there is one."""
    table = board.task_scores if table is None else table
    average = board.ratio.average
    at_ratio = table.xs(ratio, level="ratio").loc[average.index[average[ratio].notna()]]
    if board.reference is not None:
        at_ratio = pd.concat([table.loc[[(REFERENCE_PRESS, 0.0)]].droplevel("ratio"), at_ratio])
    return at_ratio.T.rename_axis(index="task", columns="press")


def heatmap_figure(table: pd.DataFrame, title: str):
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
    # Over the whole figure (the colour bar's width included), wrapped to it: a title over the heatmap's
    # axes alone ran past a narrow figure's edges and was cut.
    figure.suptitle(wrapped_title(title, figure.get_figwidth()), fontsize=10)
    return figure


def save(figure, path: Path, dpi: int = 110) -> Path:
    figure.savefig(path, dpi=dpi)
    return path
