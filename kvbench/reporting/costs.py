"""The report's accuracy-against-cost view (`kvbench report ... --costs DIR`): each press's score at one
budget set beside what it costs when it runs for real, as `kvbench speed` measured it in DIR (prefill
overhead against no press, decoding tokens per second on the compressed cache, allocated bytes).

Choices:
- A cost joins a leaderboard's score at the same press (and arguments) and budget: a memory budget against
  the memory view, a ratio against the ratio view. Costs record no task, so one cost serves every task.
- A leaderboard takes the costs measured at its own context length when there are any (time grows with
  length, and so may a press's overhead), else those of the shortest length measured, and says which.
- The model: `kvbench speed` records it in its run records; costs of another model than a leaderboard's are
  not set beside it (a press's cost depends on the model's shape).
"""

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from kvbench.core.errors import BadInput
from kvbench.core.validation import parse_json, read_text
from kvbench.reporting.blocks import Heading, Image, Paragraph, Table, file_stem, fmt_interval
from kvbench.reporting.boards import Leaderboard
from kvbench.reporting.plots import Style, error_bars, new_figure, plain_ticks, save, wrapped_title
from kvbench.reporting.read import config_label
from kvbench.store.costs import Cost, load_costs


@dataclass
class Costs:
    """What `--costs DIR` holds: its costs, and the model they were measured on (None if unrecorded)."""

    folder: Path
    costs: list[Cost]
    model: str | None


def read_costs(folder: Path) -> Costs:
    """The costs of a `kvbench speed` folder, checked against their schema before any row is read."""
    folder = Path(folder)
    if not folder.is_dir():
        raise BadInput(f"--costs {folder} is not a folder (give the --out folder of kvbench speed)")
    costs = list(load_costs(folder).values())
    if not costs:
        raise BadInput(f"--costs {folder} holds no costs.jsonl lines (run kvbench speed --out {folder})")
    models = set()
    for record in sorted((folder / "runs").glob("speed-*.json")):
        try:
            models.add(parse_json(read_text(record, ValueError))["config"].get("model"))
        except (OSError, ValueError, KeyError, AttributeError, TypeError):
            continue  # a damaged record says nothing of the model; the costs themselves were checked
    models.discard(None)
    if len(models) > 1:
        raise BadInput(f"--costs {folder} mixes models ({', '.join(sorted(models))}): one model per folder")
    return Costs(folder, costs, models.pop() if models else None)


def cost_points(board: Leaderboard, costs: Costs) -> tuple[pd.DataFrame, int | None]:
    """One row per press and budget that has both a score on `board` and a cost: press, budget, axis,
    average, low, high and the cost's measures; and the context length the costs were taken at."""
    if costs.model is not None and costs.model != board.model:
        return pd.DataFrame(), None
    lengths = sorted({cost.tokens for cost in costs.costs})
    length = board.length if board.length in lengths else lengths[0]
    points = []
    for cost in costs.costs:
        if cost.tokens != length:
            continue
        axis, value = ("memory", cost.memory) if cost.memory is not None else ("ratio", cost.ratio)
        view = getattr(board, axis)
        press = config_label(cost.press, cost.press_args)
        if view is None or press not in view.average.index or value not in view.average.columns:
            continue
        average = view.average.at[press, value]
        if pd.isna(average):
            continue
        points.append(
            {
                "press": press,
                "axis": axis,
                "budget": value,
                "average": average,
                "low": view.low.at[press, value],
                "high": view.high.at[press, value],
                "prefill_overhead": cost.prefill_overhead,
                "decode_speed": cost.decode_tokens_per_s / cost.decode_none_tokens_per_s,
                "decode_tokens_per_s": cost.decode_tokens_per_s,
                "allocated": cost.allocated_bytes / cost.allocated_bytes_full,
                "accounted": cost.accounted_bytes / cost.accounted_bytes_full,
                "device": cost.device,
            }
        )
    frame = pd.DataFrame(points)
    if not frame.empty:
        frame = frame.sort_values(["axis", "budget", "average"], ascending=[True, True, False])
        frame["frontier"] = on_frontier(frame)
    return frame, length


def on_frontier(points: pd.DataFrame) -> list[bool]:
    """Per point, whether it is on the accuracy-against-prefill frontier of its budget: no other press at the
    same axis and budget scores higher at no more prefill overhead."""
    rows = points.to_dict("records")
    return [
        not any(
            other["axis"] == row["axis"]
            and other["budget"] == row["budget"]
            and other["average"] > row["average"]
            and other["prefill_overhead"] <= row["prefill_overhead"]
            for other in rows
        )
        for row in rows
    ]


def cost_table(points: pd.DataFrame) -> Table:
    table = pd.DataFrame(
        {
            "budget": [
                f"{axis} {budget:g}" for axis, budget in zip(points["axis"], points["budget"], strict=True)
            ],
            "score": [
                fmt_interval(a, lo, hi)
                for a, lo, hi in zip(points["average"], points["low"], points["high"], strict=True)
            ],
            "prefill vs none": [f"{value:+.1%}" for value in points["prefill_overhead"]],
            "decode tokens/s": [f"{value:.1f}" for value in points["decode_tokens_per_s"]],
            "decode vs none": [f"{value:.2f}x" for value in points["decode_speed"]],
            "allocated / full": [f"{value:.2f}" for value in points["allocated"]],
            "accounted / full": [f"{value:.2f}" for value in points["accounted"]],
            "on the frontier": ["yes" if value else "" for value in points["frontier"]],
        },
        index=pd.Index(points["press"], name="press"),
    )
    return Table(table)


def cost_figure(board: Leaderboard, points: pd.DataFrame, styles: dict[str, Style], length: int):
    """Score against prefill overhead and against decoding speed, one point per press and budget."""
    figure = new_figure(10, 4.4)
    prefill_ax, decode_ax = figure.subplots(1, 2, sharey=True)
    for point in points.to_dict("records"):  # one per press and budget
        style = styles[point["press"]]
        error = error_bars([point["average"]], [point["low"]], [point["high"]])
        for ax, x in ((prefill_ax, 100 * point["prefill_overhead"]), (decode_ax, point["decode_speed"])):
            ax.errorbar(
                [x],
                [point["average"]],
                yerr=error,
                color=style.color,
                marker=style.marker,
                capsize=3,
                linestyle="none",
                markersize=7 if style.linewidth == Style.linewidth else 11,
                label=f"{point['press']} ({point['axis']} {point['budget']:g})",
            )
    for _, group in points[points["frontier"]].groupby(["axis", "budget"]):
        group = group.sort_values("prefill_overhead")
        prefill_ax.plot(
            100 * group["prefill_overhead"],
            group["average"],
            drawstyle="steps-post",
            color="grey",
            linewidth=1,
            zorder=0,
        )
    if board.reference is not None:
        for ax in (prefill_ax, decode_ax):
            ax.axhline(board.reference.mean(), linestyle="--", color="black", label="none (no compression)")
    prefill_ax.axvline(0, color="black", linewidth=0.8)
    decode_ax.axvline(1, color="black", linewidth=0.8)
    prefill_ax.set_xlabel("prefill time vs no press (%)")
    decode_ax.set_xlabel("decoding tokens/s vs no press (x)")
    prefill_ax.set_ylabel("average score (mean of task means)")
    for ax in (prefill_ax, decode_ax):
        ax.set_ylim(-3, 103)
        plain_ticks(ax.yaxis)
        ax.grid(alpha=0.3)
    decode_ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    title = f"{board.title}\nscore against cost (costs at {length} tokens); bars: 95 % interval"
    figure.suptitle(wrapped_title(title, figure.get_figwidth()), fontsize=10)
    return figure


def cost_blocks(board: Leaderboard, costs: Costs, out_dir: Path, styles: dict[str, Style]) -> list:
    points, length = cost_points(board, costs)
    blocks = [Heading("Accuracy against cost", 3)]
    if points.empty:
        why = (
            f"they were measured on {costs.model}"
            if costs.model is not None and costs.model != board.model
            else "none is of a press and budget this leaderboard scored"
        )
        return [
            *blocks,
            Paragraph(f"The costs in `{costs.folder}` are not set beside this leaderboard: {why}."),
        ]
    devices = ", ".join(sorted(set(points["device"])))
    taken = "this leaderboard's length" if length == board.length else "the shortest length measured"
    blocks += [
        Paragraph(
            f"Each press's score at a budget beside its cost as `kvbench speed` measured it in "
            f"`{costs.folder}` ({length} tokens, {taken}; on {devices}): the prefill with compression "
            "against the same prefill without, greedy decoding on the compressed cache against the full "
            "cache (each the fastest of interleaved repeats), and the cache's allocated storage beside "
            "kvbench's 16-bit accounting, each as a fraction of the full cache's. A codec whose allocated "
            "fraction is far above its accounted one hands attention dequantised tensors: its saving needs "
            "a kernel that reads the codes. A press is on the frontier where no other press at its budget "
            "scores higher at no more prefill overhead (the grey steps in the plot)."
        ),
        cost_table(points),
        Image(
            save(cost_figure(board, points, styles, length), out_dir / f"{file_stem(board)}-costs.png"),
            "Average score against prefill overhead and against decoding speed",
        ),
    ]
    return blocks
