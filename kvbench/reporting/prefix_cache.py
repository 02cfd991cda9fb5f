"""The summary of a `kvbench prefix-cache` folder, rendered beside its rows: summary.md (the table, then the
plots) and three plots, one line or point per run (a policy, its press, a budget):

- ttft.png: the distribution of time to first token over the trace's requests (ECDF), per run;
- hit_rate.png: hit rate against store size, one line per policy and press;
- accuracy.png: accuracy against TTFT: the mean first-token logit error and the share of answers equal to
  the full recompute's, against total TTFT relative to no reuse.

A policy keeps its colour everywhere; its compressed runs are dashed (lines) or hollow (points).
"""

from pathlib import Path

from kvbench.core.validation import MIB, jsonl_lines, parse_json, read_text
from kvbench.reporting.plots import MARKERS, PALETTE, new_figure, save, wrapped_title

PLOTS = {
    "ttft.png": "TTFT distribution per run",
    "hit_rate.png": "hit rate vs store size",
    "accuracy.png": "accuracy vs TTFT",
}


def run_key(row: dict) -> tuple:
    return (row["policy"], row["press"], row["budget"])


def run_label(policy: str, press: str, budget: int | None = None) -> str:
    label = policy if press == "none" else f"{policy} + {press}"
    return label if budget is None or policy == "none" else f"{label}, {budget / MIB:.3g} MiB"


def policy_look(policies: list[str], policy: str, press: str) -> dict:
    """Colour and marker by policy (in the order the run lists them), dashed or hollow when compressed."""
    i = policies.index(policy)
    compressed = press != "none"
    return {"color": PALETTE[i % len(PALETTE)], "marker": MARKERS[i % len(MARKERS)], "compressed": compressed}


def ttft_figure(rows: list[dict], policies: list[str]):
    """ECDF of TTFT (ms, log scale) over the requests, one step line per run."""
    figure = new_figure(8, 4.8)
    ax = figure.subplots()
    runs: dict[tuple, list[float]] = {}
    for row in rows:
        runs.setdefault(run_key(row), []).append(row["ttft_s"] * 1e3)
    budgets = sorted({key[2] for key in runs})
    for (policy, press, budget), ttft in runs.items():
        look = policy_look(policies, policy, press)
        ordered = sorted(ttft)
        shares = [(i + 1) / len(ordered) for i in range(len(ordered))]
        # line width tells budgets apart (thicker: larger store); dashed: compressed entries
        width = 1.0 + budgets.index(budget) if policy != "none" else 2.0
        ax.step(
            ordered,
            shares,
            where="post",
            color="black" if policy == "none" else look["color"],
            linestyle="--" if look["compressed"] else "-",
            linewidth=width,
            label=run_label(policy, press, budget),
        )
    ax.set_xscale("log")
    ax.set_xlabel("time to first token (ms, log scale)")
    ax.set_ylabel("share of requests served within")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    figure.suptitle(
        wrapped_title("TTFT distribution per run (ECDF over the trace's requests)", 8), fontsize=10
    )
    return figure


def hit_rate_figure(summaries: list[dict], policies: list[str]):
    """Hit rate against the store's budget, one line per (policy, press); no reuse has no store."""
    figure = new_figure(7, 4.5)
    ax = figure.subplots()
    lines: dict[tuple, list[dict]] = {}
    for summary in summaries:
        if summary["policy"] != "none":
            lines.setdefault((summary["policy"], summary["press"]), []).append(summary)
    for (policy, press), points in lines.items():
        look = policy_look(policies, policy, press)
        points = sorted(points, key=lambda s: s["budget"])
        ax.plot(
            [s["budget"] / MIB for s in points],
            [s["hit_rate"] for s in points],
            color=look["color"],
            marker=look["marker"],
            linestyle="--" if look["compressed"] else "-",
            markerfacecolor="none" if look["compressed"] else look["color"],
            label=run_label(policy, press),
        )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("store budget (MiB of 16-bit KV, log scale)")
    ax.set_ylabel("hit rate (entries hit / entries asked)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    figure.suptitle("hit rate vs store size", fontsize=10)
    return figure


def accuracy_figure(summaries: list[dict], policies: list[str]):
    """Per run, the mean first-token logit error (left) and the share of answers equal to the full
    recompute's (right) against total TTFT relative to no reuse; one point per run."""
    figure = new_figure(10, 4.5)
    error_ax, same_ax = figure.subplots(1, 2, sharex=True)
    base = next(s for s in summaries if s["policy"] == "none")
    for summary in summaries:
        look = policy_look(policies, summary["policy"], summary["press"])
        x = summary["ttft_total_s"] / base["ttft_total_s"]
        label = run_label(summary["policy"], summary["press"], summary["budget"])
        for ax, y in ((error_ax, summary["logit_error_mean"]), (same_ax, summary["answer_same"])):
            ax.scatter(
                [x],
                [y],
                color=look["color"],
                marker=look["marker"],
                s=30 + 30 * (summary["budget"] / max(s["budget"] for s in summaries)),
                facecolors="none" if look["compressed"] else look["color"],
                label=label,
            )
    error_ax.set_yscale("symlog", linthresh=1e-4)
    error_ax.set_ylabel("mean first-token logit error vs full recompute")
    same_ax.set_ylabel("answers equal to the full recompute's")
    same_ax.set_ylim(-0.03, 1.03)
    for ax in (error_ax, same_ax):
        ax.set_xlabel("total TTFT / no reuse's (lower is faster)")
        ax.grid(alpha=0.3)
    same_ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    figure.suptitle("accuracy vs TTFT (hollow: compressed entries; larger: larger store)", fontsize=10)
    return figure


def table(summaries: list[dict]) -> str:
    """Markdown: one row per policy, press and budget, TTFT and throughput as ratios to no reuse."""
    base = next(s for s in summaries if s["policy"] == "none")
    lines = [
        "| policy | press | budget MiB | TTFT p50 ms | TTFT p90 ms | TTFT vs none | throughput vs none "
        "| hit rate | reused | KiB per entry | max logit error | answers same |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        budget = "-" if s["policy"] == "none" else f"{s['budget'] / MIB:g}"
        press = "-" if s["press"] == "none" else s["press"]
        lines.append(
            f"| {s['policy']} | {press} | {budget} "
            f"| {s['ttft_p50_s'] * 1e3:.1f} | {s['ttft_p90_s'] * 1e3:.1f} "
            f"| {s['ttft_total_s'] / base['ttft_total_s']:.2f} "
            f"| {s['throughput_rps'] / base['throughput_rps']:.2f} "
            f"| {s['hit_rate']:.2f} | {s['reused_fraction']:.2f} | {s['bytes_per_entry'] / 1024:.1f} "
            f"| {s['logit_error_max']:.3g} | {s['answer_same']:.2f} |"
        )
    return "\n".join(lines)


def render(folder: Path | str) -> list[Path]:
    """summary.md (table and plots) and the plots of a prefix-cache folder, from its summary.json and
    requests.jsonl; the plots' paths."""
    folder = Path(folder)
    record = parse_json(read_text(folder / "summary.json"))
    summaries = record["summary"]["policies"]
    rows = [parse_json(line) for line in jsonl_lines(read_text(folder / "requests.jsonl")) if line.strip()]
    policies = list(dict.fromkeys(s["policy"] for s in summaries))
    figures = {
        "ttft.png": ttft_figure(rows, policies),
        "hit_rate.png": hit_rate_figure(summaries, policies),
        "accuracy.png": accuracy_figure(summaries, policies),
    }
    paths = [save(figure, folder / name) for name, figure in figures.items()]
    images = "\n\n".join(f"![{PLOTS[path.name]}]({path.name})" for path in paths)
    (folder / "summary.md").write_text(table(summaries) + "\n\n" + images + "\n")
    return paths
