"""The report's perplexity section: the rows of `kvbench perplexity` (protocol "perplexity"), which measure
a negative log-likelihood, not a score, so they get boards of their own and never enter the leaderboards.

One board per (model, length, protocol with its arguments, text source): perplexity by press and budget
(exp of the mean NLL per token over the texts: the texts of a board have one length, so this is the pooled
perplexity), perplexity against the measured memory (kv_bytes / kv_bytes_full at the end of the text) and
against the absolute budget (entries per head), and the NLL by position for each budget.
"""

from pathlib import Path

import numpy as np
import pandas as pd

from kvbench.core.config import budget_label
from kvbench.reporting.blocks import Heading, Image, Paragraph, Table, provenance_blocks, slug, unique_stems
from kvbench.reporting.boards import press_sources, runs_for
from kvbench.reporting.plots import Style, new_figure, plain_ticks
from kvbench.reporting.read import REFERENCE_PRESS, Run, with_report_columns

PROTOCOL = "perplexity"


def is_perplexity(rows: pd.DataFrame) -> pd.Series:
    return rows["protocol"].eq(PROTOCOL) if "protocol" in rows else pd.Series(False, index=rows.index)


def budget_order(label: str) -> tuple:
    """Budgets from the largest cache to the smallest: absolute budgets, memories, then ratios."""
    kind, _, value = label.rpartition("=")
    return {"budget": (0, -float(value)), "memory": (1, -float(value))}.get(kind, (2, float(value)))


def perplexity_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Compressed press x budget label: exp of the mean NLL over the texts, presses by name."""
    compressed = rows[rows["press"] != REFERENCE_PRESS]
    table = np.exp(compressed.pivot_table(index="press", columns="label", values="nll", aggfunc="mean"))
    return table[sorted(table.columns, key=budget_order)].sort_index()


def config_points(rows: pd.DataFrame) -> pd.DataFrame:
    """One point per compressed config: press, label, budget, memory fraction measured, perplexity."""
    compressed = rows[rows["press"] != REFERENCE_PRESS]
    points = compressed.groupby(["press", "label"], dropna=False).agg(
        budget=("budget", "first"), memory=("memory_ratio", "mean"), nll=("nll", "mean")
    )
    return points.assign(perplexity=np.exp(points["nll"])).reset_index()


def plot_against(
    points: pd.DataFrame, x: str, reference: float | None, styles, title: str, path: Path
) -> Path:
    figure = new_figure(8, 4.8)
    ax = figure.subplots()
    for press, mine in points.groupby("press"):
        mine = mine.sort_values(x)
        style = styles[press]
        ax.plot(
            mine[x],
            mine["perplexity"],
            color=style.color,
            marker=style.marker,
            linestyle=style.linestyle,
            linewidth=style.linewidth,
            label=press,
        )
    if reference is not None:
        ax.axhline(reference, linestyle="--", color="black", label=f"none (no compression): {reference:.2f}")
    ax.set_yscale("log")
    if x == "budget":
        ax.set_xscale("log", base=2)
        ax.set_xlabel("budget (KV entries kept per head and layer)")
    else:
        ax.set_xlim(0, 1.05)
        ax.set_xlabel("memory fraction at the end of the text (KV bytes stored / uncompressed 16-bit cache)")
    plain_ticks(ax.xaxis)
    plain_ticks(ax.yaxis)
    ax.yaxis.set_minor_formatter(ax.yaxis.get_major_formatter())  # a log axis labels its minor ticks too
    ax.set_ylabel("perplexity (log scale)")
    ax.set_title(title, fontsize="medium")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    figure.savefig(path, dpi=110)
    return path


def plot_by_position(rows: pd.DataFrame, labels: list[str], styles, title: str, path: Path) -> Path:
    """Mean NLL per span against the span's last position, a panel per budget, the reference in each."""
    columns = min(len(labels), 3)
    height = -(-len(labels) // columns)
    figure = new_figure(4.2 * columns + 1.8, 3.2 * height)
    axes = np.atleast_1d(figure.subplots(height, columns, sharey=True, squeeze=False)).flatten()
    reference = rows[rows["press"] == REFERENCE_PRESS]
    for ax, label in zip(axes, labels, strict=False):
        for press, mine in rows[rows["label"] == label].groupby("press"):
            draw_spans(ax, mine, press, styles[press])
        if not reference.empty:
            draw_spans(ax, reference, "none (no compression)", Style("black", "", "--"))
        ax.set_title(label, fontsize="small")
        ax.set_xlabel("position (tokens)")
        ax.grid(alpha=0.3)
    for ax in axes[len(labels) :]:
        ax.set_visible(False)
    axes[0].set_ylabel("mean NLL per token (nats)")
    handles = {line.get_label(): line for ax in axes for line in ax.lines}
    figure.legend(handles.values(), handles.keys(), fontsize="small", loc="outside right upper")
    figure.suptitle(title, fontsize="medium")
    figure.savefig(path, dpi=100)
    return path


def draw_spans(ax, rows: pd.DataFrame, label: str, style: Style) -> None:
    spans = [meta["span_nll"] for meta in rows["meta"]]
    span = rows["meta"].iloc[0]["span"]
    mean = np.mean([values[: min(map(len, spans))] for values in spans], axis=0)
    ends = [min((k + 1) * span + 1, rows["length"].iloc[0]) for k in range(len(mean))]
    width = 1.2 if style.linewidth == Style.linewidth else style.linewidth
    ax.plot(ends, mean, color=style.color, linestyle=style.linestyle, label=label, linewidth=width)


def perplexity_blocks(rows: pd.DataFrame, out_dir: Path, styles: dict[str, Style], runs: list[Run]) -> list:
    """The section's blocks for the perplexity rows of a report (none: no section), its presses' sources and
    the runs of its rows last."""
    if rows.empty:
        return []
    rows = with_report_columns(rows)
    keys = ["model", "length", "protocol_label"]
    matched = [run for _, group in rows.groupby(keys, dropna=False) for run in runs_for(group, runs)]
    shown = [run for index, run in enumerate(matched) if all(run is not seen for seen in matched[:index])]
    rows["label"] = [
        budget_label(r, m, b) for r, m, b in zip(rows["ratio"], rows["memory"], rows["budget"], strict=True)
    ]
    blocks = [
        Heading("Perplexity with a live cache"),
        Paragraph(
            "Rows of `kvbench perplexity`: each text is read with every config's cache compressed back to "
            "its budget every `every` tokens; a cell is exp of the mean NLL per token over the texts (lower "
            "is better). A ratio is of the text read so far, a memory and a budget of the whole text."
        ),
    ]
    keys = ["model", "length", "protocol_label", "task"]
    groups = [(tuple(key), group) for key, group in rows.groupby(keys, sort=True)]
    names = [f"perplexity-{slug(m)}-{n}-{slug(p)}-{slug(t)}" for (m, n, p, t), _ in groups]
    for (key, group), stem in zip(groups, unique_stems(names, [key for key, _ in groups]), strict=True):
        model, length, protocol, task = key
        title = f"{model}, {task}, length {length}, {protocol}"
        full = group.loc[group["press"] == REFERENCE_PRESS, "nll"]
        reference = float(np.exp(full.mean())) if len(full) else None
        texts = group["sample_id"].nunique()
        blocks += [
            Heading(title, 3),
            Paragraph(
                f"{texts} text{'s' if texts > 1 else ''} of {length} tokens. No compression "
                + (
                    f"(`{REFERENCE_PRESS}`): {reference:.2f}."
                    if reference
                    else f"(`{REFERENCE_PRESS}`): not run."
                )
            ),
        ]
        points = config_points(group)
        if points.empty:
            continue
        table = perplexity_table(group)
        blocks.append(
            Table(table.map(lambda value: "" if pd.isna(value) else f"{value:.2f}").rename_axis("press"))
        )
        path = plot_against(
            points,
            "memory",
            reference,
            styles,
            f"{title}\nperplexity vs memory",
            out_dir / f"{stem}-memory.png",
        )
        blocks.append(Image(path, "perplexity vs memory fraction at the end of the text"))
        budgets = points[points["budget"].notna()]
        if not budgets.empty:
            path = plot_against(
                budgets,
                "budget",
                reference,
                styles,
                f"{title}\nperplexity vs budget",
                out_dir / f"{stem}-budget.png",
            )
            blocks.append(Image(path, "perplexity vs absolute budget (entries per head)"))
        labels = sorted(points["label"].unique(), key=budget_order)
        path = plot_by_position(
            group, labels, styles, f"{title}: NLL by position", out_dir / f"{stem}-position.png"
        )
        blocks.append(Image(path, "mean NLL per span of tokens against position, a panel per budget"))
    return blocks + provenance_blocks(shown, press_sources(rows))
