"""`kvbench report`: leaderboards, tables and plots (markdown + self-contained HTML) from results folders.

A results folder holds `rows.jsonl` (one row per config and sample, see kvbench.results) and `runs/*.json`
(one record per invocation: command, config, versions, git commit). Reports never average across models,
context lengths or protocols: there is one leaderboard per (model, length, protocol with its arguments).

Each leaderboard has two views. The ratio view ranks evictors by compression ratio (fraction of KV
entries removed, kvpress's meaning). The memory view, shown whenever rows record bytes (`kv_bytes`) or were
run with a memory budget, puts evictors and codecs on one axis, the memory fraction kv_bytes / kv_bytes_full
(for rows without bytes, kv_kept / kv_total). A codec press (quantisation, low rank, ...) keeps entries at
fewer bits, so its ratio says nothing about the entries it removed: a config run with a ratio whose memory
fraction differs from its kept-entry fraction is a codec config, left out of the ratio view and shown in the
memory view at the budget its press was built with (1 - ratio, as the press registry builds it).
"""

import base64
import html
import re
import warnings
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

import click
import pandas as pd

from kvbench.errors import BadInput, NoResults
from kvbench.results import load_rows, load_runs, results_files
from kvbench.tasks.longbench import longbench_average, longbench_e_buckets

REFERENCE_PRESS = "none"  # ratio 0.0: the no-compression reference
DEFAULT_PROTOCOL = "query-agnostic"  # rows written before protocols were recorded
PROTOCOLS = ("query-agnostic", "decode-time", "streaming")  # the order of the report's sections
CODEC_GAP = 0.01  # a config whose memory fraction differs from its kept-entry fraction by more is a codec
Z95 = 1.96  # 95 % confidence half-width = Z95 x standard error


@dataclass
class Run:
    """One invocation recorded in `runs/*.json` of a results folder."""

    results_dir: str  # the folder, as the rows' `source` column names it
    command: str
    config: dict
    versions: dict
    hardware: dict  # machine, cpus and, on CUDA, gpu: what the timings ran on
    git_commit: str
    started: str
    finished: str  # "" while the run goes on, or when it was interrupted


@dataclass
class MemoryView:
    """Scores by memory: the configs run with a memory budget (or codecs run with a ratio), by budget."""

    average: pd.DataFrame  # press x budget asked: mean over tasks of the per-task means
    stderr: pd.DataFrame  # press x budget: standard error of `average` (NaN below 2 samples in a task)
    samples: pd.DataFrame  # press x budget: samples behind each cell
    measured: pd.DataFrame  # press x budget: mean over samples of kv_bytes / kv_bytes_full
    rank: pd.DataFrame  # press x budget: 1 = best average at that budget
    mean_rank: pd.Series
    lead: pd.DataFrame  # per budget: the leader's paired lead over the runner-up (`paired_lead`)
    points: (
        pd.DataFrame
    )  # every compressed config of the leaderboard: press, memory (measured), average, stderr
    missing: dict[tuple[str, float], list[str]]  # (press, budget) -> ["task have/expected", ...]
    versus: pd.DataFrame | None = None  # with `report --versus`: each press's paired difference to it


@dataclass
class Leaderboard:
    """Everything the report says about one (model, length, protocol)."""

    model: str
    length: int
    protocol: str  # the protocol and its arguments, e.g. "decode-time (interval=16)"
    suite: str  # the suites the runs named, or the number of tasks
    task_scores: pd.DataFrame  # index (press, ratio), columns task: mean score per task
    sample_counts: pd.DataFrame  # same shape: number of samples behind each mean (0 where missing)
    reference: pd.Series | None  # per-task mean score of press "none"; None when not run
    average: pd.DataFrame  # press x ratio: mean over tasks of the per-task means
    stderr: pd.DataFrame  # press x ratio: standard error of `average` over samples (NaN below 2 per task)
    samples: pd.DataFrame  # press x ratio: samples behind each average
    delta: pd.DataFrame | None  # press x ratio: mean over tasks of (task mean - reference task mean)
    rank: pd.DataFrame  # press x ratio: 1 = best average at that ratio
    mean_rank: pd.Series  # press: mean of its ranks over ratios
    lead: pd.DataFrame  # per ratio: the leader's paired lead over the runner-up (`paired_lead`)
    kept: pd.DataFrame  # index (press, ratio), columns kept_fraction, kept_bytes, memory
    context_tokens: pd.Series  # task: mean context length in tokens
    missing: dict[tuple[str, float], list[str]]  # (press, ratio) -> ["task have/expected", ...]
    runs: list[Run]
    longbench: dict[str, pd.DataFrame]  # "longbench" / "longbench-e" -> (press, ratio) x category averages
    longbench_e_buckets: pd.DataFrame | None  # (press, ratio) x length bucket; None without LongBench-E meta
    codecs: list[str]  # presses run with a ratio that store fewer bytes than their kept entries
    has_bytes: bool  # rows record kv_bytes, or ran with a memory budget: the memory view is shown
    memory_view: MemoryView | None  # None without configs in the memory view
    versus: pd.DataFrame | None = None  # with `report --versus`: each press's paired difference to it
    baseline: str | None = None  # the press `versus` compares to

    @property
    def title(self) -> str:
        return f"{self.model}, {self.suite}, length {self.length}, {self.protocol}"


def config_label(press: str, press_args: dict | None) -> str:
    """The press name, plus its arguments when any: two configs of one press stay apart."""
    if not press_args:
        return press
    args = ", ".join(f"{key}={value}" for key, value in sorted(press_args.items()))
    return f"{press}({args})"


def protocol_label(protocol: str | None, protocol_args: dict | None) -> str:
    """The protocol, plus its arguments when any; rows written before protocols were recorded are
    query-agnostic."""
    protocol = protocol if isinstance(protocol, str) and protocol else DEFAULT_PROTOCOL
    if not isinstance(protocol_args, dict) or not protocol_args:
        return protocol
    return f"{protocol} ({', '.join(f'{key}={value}' for key, value in sorted(protocol_args.items()))})"


def result_files(paths: list[Path], recursive: bool = False) -> list[Path]:
    """The rows.jsonl of each given folder (and of every folder below it when `recursive`); a path without any
    is bad input."""
    files = []
    for path in paths:
        found = results_files([path], recursive=recursive)
        if not found:
            nested = results_files([path], recursive=True)
            if nested:
                raise NoResults(
                    f"{path} holds no rows.jsonl itself; {len(nested)} folder(s) below it do "
                    f"(e.g. {nested[0].parent}): pass --recursive to read them"
                )
            raise NoResults(f"{path} holds no results (no rows.jsonl in it or below it)")
        files += [file for file in found if file not in files]
    return files


def read_runs(rows_file: Path) -> list[Run]:
    """The run records next to one rows.jsonl."""
    return [
        Run(
            results_dir=str(rows_file.parent),
            command=record.get("command") or "",
            config=record.get("config") or {},
            versions=record.get("versions") or {},
            hardware=record.get("hardware") or {},
            git_commit=record.get("git_commit") or "unknown",
            started=record.get("started") or "",
            finished=record.get("finished") or "",
        )
        for record in load_runs([rows_file])
    ]


def requested_configs(runs: list[Run], view: str, codecs: set[str]) -> list[tuple[str, float]]:
    """The configs the runs asked for that belong to one view: ("memory") those given a memory budget and
    codec presses given a ratio (at budget 1 - ratio), ("ratio") the others, by ratio."""
    configs = []
    for run in runs:
        for config in run.config.get("configs", []):
            press = config_label(config["press"], dict(config.get("press_args") or []))
            memory = config.get("memory")
            if memory is None and press in codecs:
                memory = 1 - float(config["ratio"])
            if view == "memory" and memory is not None:
                configs.append((press, float(memory)))
            elif view == "ratio" and memory is None:
                configs.append((press, float(config["ratio"])))
    return configs


def find_missing(
    counts: pd.DataFrame, runs: list[Run], requested: list[tuple[str, float]]
) -> dict[tuple[str, float], list[str]]:
    """Configs x tasks holding fewer samples than the fullest config of that task or than a run requested."""
    expected_configs = set(counts.index) | set(requested)
    expected = counts.max(axis=0).to_dict()  # task -> most samples any config has
    for run in runs:
        wanted = run.config.get("samples")
        for task in run.config.get("tasks", []):
            expected[task] = max(expected.get(task, 0), wanted if isinstance(wanted, int) else 0)
    missing = {}
    for config in sorted(expected_configs):
        have = counts.loc[config] if config in counts.index else pd.Series(dtype=int)
        gaps = [
            f"{task} {have.get(task, 0)}/{want}"
            for task, want in sorted(expected.items())
            if have.get(task, 0) < want
        ]
        if gaps:
            missing[config] = gaps
    return missing


def longbench_tables(task_scores: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Per family, each config's LongBench category means and overall average (on the tasks it ran)."""
    tables = {}
    for family in ("longbench", "longbench-e"):
        tasks = [task for task in task_scores.columns if task.startswith(family + "/")]
        averages = {
            config: longbench_average(scores[tasks].dropna().to_dict())
            for config, scores in task_scores.iterrows()
            if scores[tasks].notna().any()
        }
        if averages:
            tables[family] = pd.DataFrame.from_dict(averages, orient="index").rename_axis(["press", "ratio"])
    return tables


def bucket_means(rows: pd.DataFrame) -> pd.DataFrame | None:
    """LongBench-E mean score per length bucket for each config: mean over tasks of the per-task means."""
    if "meta" not in rows or not rows["task"].str.startswith("longbench-e/").any():
        return None
    return longbench_e_buckets(rows).groupby(["press", "ratio"]).mean()


def config_stats(rows: pd.DataFrame, key: str) -> pd.DataFrame:
    """Per (press, `key`) config: the average (mean over tasks of the per-task means, so every task weighs the
    same whatever its samples), its standard error (a mean of independent task means has variance
    sum(var_t / n_t) / tasks^2; NaN unless every task holds 2+ samples), its samples, and the means over its
    samples of the memory fraction, the kept-entry fraction and the bytes kept."""
    cells = rows.groupby(["press", key, "task"])["score"].agg(["mean", "count", "var"])
    task_means = cells["mean"].unstack("task")
    variance = (cells["var"] / cells["count"]).unstack("task")
    stderr = variance.sum(axis=1) ** 0.5 / variance.shape[1]
    configs = rows.groupby(["press", key])
    return pd.DataFrame(
        {
            "average": task_means.mean(axis=1),
            "stderr": stderr.where(variance.notna().all(axis=1)),
            "samples": configs.size(),
            "memory": configs["memory_ratio"].mean(),
            "kept_fraction": configs["kept_fraction"].mean(),
            "kept_bytes": configs["kept_bytes"].mean(),
        }
    )


def paired_difference(cell: pd.DataFrame, press: str, other: str) -> tuple[float, float, int]:
    """`press` minus `other` on the samples both scored in `cell` (the rows of one ratio or budget), paired
    by (task, sample): the mean over tasks of the per-task mean difference, its standard error (as
    `config_stats` computes them; NaN below 2 pairs in a task) and the number of pairs."""
    scores = [
        cell[cell["press"] == name].groupby(["task", "sample_id"])["score"].mean() for name in (press, other)
    ]
    difference = (scores[0] - scores[1]).dropna()
    if difference.empty:
        return float("nan"), float("nan"), 0
    per_task = difference.groupby(level="task").agg(["mean", "count", "var"])
    stderr = (per_task["var"] / per_task["count"]).sum() ** 0.5 / len(per_task)
    return (
        per_task["mean"].mean(),
        stderr if (per_task["count"] >= 2).all() else float("nan"),
        len(difference),
    )


def paired_lead(rows: pd.DataFrame, average: pd.DataFrame, key: str) -> pd.DataFrame:
    """Per column of `average` (a ratio or a memory budget): the best press, the runner-up, and the best's
    lead on the samples both scored (`paired_difference`). Pairing removes what the two presses share (how
    hard a sample is), so a lead can be told apart from noise where the two intervals of the leaderboard
    overlap."""
    leads = []
    for column in average.columns:
        ranked = average[column].dropna().sort_values(ascending=False)
        if len(ranked) < 2:
            continue
        best, runner_up = ranked.index[:2]
        lead, stderr, pairs = paired_difference(rows[rows[key] == column], best, runner_up)
        leads.append(
            {
                key: column,
                "best": best,
                "runner-up": runner_up,
                "lead": lead,
                "stderr": stderr,
                "pairs": pairs,
            }
        )
    return pd.DataFrame(leads, columns=[key, "best", "runner-up", "lead", "stderr", "pairs"])


def paired_versus(rows: pd.DataFrame, average: pd.DataFrame, key: str, baseline: str) -> pd.DataFrame:
    """Every other press's paired difference to `baseline` (`paired_difference`) at each column of
    `average` both were scored at: columns press, `key`, difference, stderr, pairs."""
    found = []
    for column in average.columns:
        if pd.isna(average[column].get(baseline)):
            continue
        cell = rows[rows[key] == column]
        for press in average[column].dropna().index.drop(baseline):
            difference, stderr, pairs = paired_difference(cell, press, baseline)
            found.append(
                {key: column, "press": press, "difference": difference, "stderr": stderr, "pairs": pairs}
            )
    return pd.DataFrame(found, columns=["press", key, "difference", "stderr", "pairs"])


def ranking(average: pd.DataFrame) -> tuple[pd.DataFrame, pd.Series, list[str]]:
    """Rank at each column (1 = best; ties share), mean rank, and the presses by mean rank then by average."""
    rank = average.rank(axis=0, ascending=False, method="min")  # NaN where a press lacks that column
    mean_rank = rank.mean(axis=1)
    order = sorted(average.index, key=lambda press: (mean_rank[press], -average.loc[press].mean()))
    return rank.loc[order], mean_rank.loc[order], order


def codec_rows(rows: pd.DataFrame) -> pd.Series:
    """True on the rows of configs run with a ratio whose memory fraction differs from their kept-entry
    fraction (a codec stores its entries in fewer bytes): their ratio does not say what they removed."""
    ratio_run = rows["memory"].isna()
    gap = (rows["memory_ratio"] - rows["kept_fraction"]).abs()
    config_gap = gap.groupby([rows["press"], rows["ratio"], ratio_run]).transform("mean")
    return ratio_run & (config_gap > CODEC_GAP)


def build_memory_view(
    memory_rows: pd.DataFrame,
    ratio_stats: pd.DataFrame,
    runs: list[Run],
    codecs: set[str],
    versus: str | None = None,
) -> MemoryView | None:
    """The memory leaderboard (configs by budget asked) and every compressed config at its measured memory."""
    points = ratio_stats.drop(index=REFERENCE_PRESS, level="press", errors="ignore").reset_index()
    if memory_rows.empty and points.empty:
        return None
    frames = [points[["press", "memory", "average", "stderr"]]]
    empty = pd.DataFrame(columns=pd.Index([], dtype=float), index=pd.Index([], name="press"))
    average = stderr = samples = measured = rank = empty
    mean_rank, missing, lead = pd.Series(dtype=float), {}, paired_lead(memory_rows, empty, "budget")
    compared = None
    if not memory_rows.empty:
        stats = config_stats(memory_rows.rename(columns={"memory": "budget"}), "budget")
        frames.append(stats.reset_index()[["press", "memory", "average", "stderr"]])
        columns = sorted(stats.index.get_level_values("budget").unique(), reverse=True)  # most memory first
        average, stderr, samples, measured = (
            stats[column].unstack("budget")[columns] for column in ("average", "stderr", "samples", "memory")
        )
        rank, mean_rank, order = ranking(average)
        lead = paired_lead(memory_rows.rename(columns={"memory": "budget"}), average, "budget")
        if versus:
            compared = paired_versus(
                memory_rows.rename(columns={"memory": "budget"}), average, "budget", versus
            )
        average, stderr, samples, measured = (
            frame.loc[order] for frame in (average, stderr, samples, measured)
        )
        counts = memory_rows.groupby(["press", "memory", "task"]).size().unstack("task").fillna(0).astype(int)
        missing = find_missing(counts, runs, requested_configs(runs, "memory", codecs))
    return MemoryView(
        average=average,
        stderr=stderr,
        samples=samples,
        measured=measured,
        rank=rank,
        mean_rank=mean_rank,
        lead=lead,
        points=pd.concat([frame for frame in frames if not frame.empty], ignore_index=True),
        missing=missing,
        versus=compared,
    )


def suite_of(rows: pd.DataFrame, runs: list[Run]) -> str:
    suites = sorted({run.config["suite"] for run in runs if run.config.get("suite")})
    tasks = rows["task"].nunique()
    return ", ".join(suites) if suites else f"{tasks} task{'s' if tasks > 1 else ''}"


def compressed_rows(rows: pd.DataFrame) -> pd.DataFrame:
    return rows[rows["press"] != REFERENCE_PRESS]


def build_leaderboard(rows: pd.DataFrame, runs: list[Run], versus: str | None = None) -> Leaderboard:
    """Leaderboard of the rows of one (model, length, protocol), which carry the columns
    `with_report_columns` adds."""
    codec = codec_rows(rows)
    codecs = set(rows.loc[codec, "press"])
    memory_rows = pd.concat(
        [rows[rows["memory"].notna()], rows[codec].assign(memory=1 - rows.loc[codec, "ratio"])]
    )
    rows = rows[rows["memory"].isna() & ~codec]  # the ratio view

    cells = rows.groupby(["press", "ratio", "task"])["score"].agg(["mean", "count"])
    task_scores = cells["mean"].unstack("task")
    counts = cells["count"].unstack("task").fillna(0).astype(int)
    reference_key = (REFERENCE_PRESS, 0.0)
    reference = task_scores.loc[reference_key] if reference_key in task_scores.index else None

    stats = config_stats(rows, "ratio")
    compressed = stats.drop(index=REFERENCE_PRESS, level="press", errors="ignore")
    average = compressed["average"].unstack("ratio")
    rank, mean_rank, order = ranking(average)
    delta = None
    if reference is not None:
        others = task_scores.drop(index=REFERENCE_PRESS, level="press", errors="ignore")
        delta = others.sub(reference, axis=1).mean(axis=1).unstack("ratio").loc[order]
    return Leaderboard(
        model=rows["model"].iloc[0] if len(rows) else memory_rows["model"].iloc[0],
        length=(rows if len(rows) else memory_rows)["length"].iloc[0],
        protocol=(rows if len(rows) else memory_rows)["protocol_label"].iloc[0],
        suite=suite_of(pd.concat([rows, memory_rows]), runs),
        task_scores=task_scores,
        sample_counts=counts,
        reference=reference,
        average=average.loc[order],
        stderr=compressed["stderr"].unstack("ratio").loc[order],
        samples=compressed["samples"].unstack("ratio").loc[order],
        delta=delta,
        rank=rank,
        mean_rank=mean_rank,
        lead=paired_lead(compressed_rows(rows), average, "ratio"),
        kept=stats[["kept_fraction", "kept_bytes", "memory"]],
        context_tokens=pd.concat([rows, memory_rows]).groupby("task")["context_tokens"].mean(),
        missing=find_missing(counts, runs, requested_configs(runs, "ratio", codecs)),
        runs=runs,
        longbench=longbench_tables(task_scores),
        longbench_e_buckets=bucket_means(rows),
        codecs=sorted(codecs),
        has_bytes=bool(len(memory_rows)) or bool(pd.concat([rows, memory_rows])["kv_bytes"].notna().any()),
        memory_view=build_memory_view(memory_rows, stats, runs, codecs, versus),
        versus=paired_versus(compressed_rows(rows), average, "ratio", versus) if versus else None,
        baseline=versus,
    )


def runs_for(rows: pd.DataFrame, runs: list[Run]) -> list[Run]:
    """The runs recorded next to these rows that ran their model at their length with their protocol."""
    model, length, protocol = rows["model"].iloc[0], rows["length"].iloc[0], rows["protocol_label"].iloc[0]
    sources = set(rows["source"])
    return [
        run
        for run in runs
        if run.results_dir in sources
        and run.config.get("model") == model
        and run.config.get("length") == length
        and protocol_label(run.config.get("protocol"), run.config.get("protocol_args")) == protocol
    ]


def build_leaderboards(rows: pd.DataFrame, runs: list[Run], versus: str | None = None) -> list[Leaderboard]:
    """One leaderboard per (model, length, protocol): scores are never averaged across them. `versus`: a
    press (as the leaderboard names it) every other press is compared to, paired by sample."""
    rows = with_report_columns(rows)
    rows["protocol_order"] = [
        PROTOCOLS.index(p) if p in PROTOCOLS else len(PROTOCOLS) for p in rows["protocol"]
    ]
    keys = ["model", "length", "protocol_order", "protocol_label"]
    return [
        build_leaderboard(group, runs_for(group, runs), versus) for _, group in rows.groupby(keys, sort=True)
    ]


def with_report_columns(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows with the fields older rows lack filled in, and the fractions the report reads:
    protocol_label, memory (the budget asked, NaN for a ratio run), kept_fraction, memory_ratio (kv_bytes
    / kv_bytes_full, or kv_kept / kv_total without bytes) and kept_bytes (kv_bytes, else the legacy
    kv_bytes_kept)."""
    rows = rows.copy()
    missing = pd.Series([None] * len(rows), index=rows.index, dtype=object)
    protocol, args = rows.get("protocol", missing), rows.get("protocol_args", missing)
    rows["protocol"] = [p if isinstance(p, str) and p else DEFAULT_PROTOCOL for p in protocol]
    rows["protocol_label"] = [protocol_label(p, a) for p, a in zip(protocol, args, strict=True)]
    for column in ("memory", "kv_bytes", "kv_bytes_full", "kv_bytes_kept"):
        rows[column] = pd.to_numeric(rows.get(column, missing), errors="coerce")
    rows["kept_fraction"] = rows["kv_kept"] / rows["kv_total"]
    rows["memory_ratio"] = (rows["kv_bytes"] / rows["kv_bytes_full"]).fillna(rows["kept_fraction"])
    rows["kept_bytes"] = rows["kv_bytes"].fillna(rows["kv_bytes_kept"])
    return rows


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


def finish_score_axes(ax, board: "Leaderboard", title: str) -> None:
    if board.reference is not None:
        reference = board.reference.mean()
        ax.axhline(reference, linestyle="--", color="black", label=f"none (no compression): {reference:.1f}")
    ax.set_ylim(-3, 103)  # the full score range, so plots of different sweeps compare at a glance
    plain_ticks(ax.yaxis)
    ax.set_ylabel("average score (mean of task means)")
    ax.set_title(f"{board.title}\n{title}; shaded: 95 % interval", fontsize="medium")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))


def plot_scores(board: "Leaderboard", styles: dict[str, Style], path: Path) -> Path:
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


def plot_memory(board: "Leaderboard", styles: dict[str, Style], path: Path) -> Path:
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


def breakdown(board: "Leaderboard", ratio: float, table: pd.DataFrame | None = None) -> pd.DataFrame:
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


def ratio_leaderboard_blocks(board: Leaderboard, plot: Path, styles: dict[str, Style]) -> list:
    """The leaderboard by compression ratio and its plot."""
    scores = pd.DataFrame(
        {
            ratio: [
                fmt_interval(board.average.at[press, ratio], board.stderr.at[press, ratio])
                + (
                    "*"
                    if (press, ratio) in board.missing and pd.notna(board.average.at[press, ratio])
                    else ""
                )
                for press in board.average.index
            ]
            for ratio in board.average.columns
        },
        index=board.average.index,
    )
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
        cells = pd.DataFrame(
            {
                budget: [
                    fmt_interval(view.average.at[press, budget], view.stderr.at[press, budget])
                    + (
                        "*"
                        if (press, budget) in view.missing and pd.notna(view.average.at[press, budget])
                        else ""
                    )
                    for press in view.average.index
                ]
                for budget in view.average.columns
            },
            index=view.average.index,
        )
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


@dataclass
class Collected:
    """What a report reads: the rows under the given paths, their runs, and notes for the reader."""

    dirs: list[str]
    rows: pd.DataFrame
    runs: list[Run]
    notes: list[str]  # said at the top of the report: mixed models, skipped lines


def keep_latest_press_state(rows: pd.DataFrame, every_state: bool = False) -> tuple[pd.DataFrame, list[str]]:
    """Keep, for each model and press, the rows of the learned state (e.g. KVP agents) written last.

    Rows scored with older agents are other results; averaging them with the new ones would describe no
    agents at all. The reader is told what was set aside. With `every_state` they are kept instead, as a
    press of their own named PRESS@STATE, so agents before and after a retrain compare paired.
    """
    if "press_state" not in rows:
        return rows, []
    state = rows["press_state"].fillna("unrecorded")
    latest = state.groupby([rows["model"], rows["press"]]).transform("last")
    older = state != latest
    notes = [
        f"{press} on {model}: rows of {group.nunique()} versions of its learned state; the report uses the "
        f"latest ({latest[group.index[0]]}) and "
        + (
            f"reports the older ones as {press}@STATE."
            if every_state
            else f"sets aside {int(older[group.index].sum())} rows of older ones."
        )
        for (model, press), group in state.groupby([rows["model"], rows["press"]])
        if group.nunique() > 1
    ]
    if every_state:
        rows = rows.copy()
        rows.loc[older, "press"] = rows.loc[older, "press"] + "@" + state[older]
        return rows, notes
    return rows[~older].reset_index(drop=True), notes


def collect(paths: list[Path], recursive: bool = False, every_state: bool = False) -> Collected:
    files = result_files([Path(p) for p in paths], recursive)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rows = load_rows(files)
        runs = [run for file in files for run in read_runs(file)]
    # results.read_rows already says once per file what it skipped; each message once.
    summary = list(dict.fromkeys(str(w.message) for w in caught))
    for message in summary:  # recorded for the report, still shown to the user
        warnings.warn(message, stacklevel=2)
    if rows.empty:
        raise NoResults(f"no result rows in {', '.join(str(file) for file in files)}")
    rows["press"] = [config_label(p, a) for p, a in zip(rows["press"], rows["press_args"], strict=True)]
    rows, notes = keep_latest_press_state(rows, every_state)
    models = sorted(rows["model"].unique())
    if len(models) > 1:
        notes.append(
            f"Warning: these results hold {len(models)} models ({', '.join(models)}); "
            "each gets its own leaderboard, scores are never averaged across models."
        )
    notes += [f"Skipped while reading: {message}" for message in summary]
    return Collected([str(file.parent) for file in files], rows, runs, notes)


def split_press_labels(text: str) -> list[str]:
    """`a,b(x=1, y=2),c` -> ["a", "b(x=1, y=2)", "c"]: commas inside a label's parentheses stay."""
    return [label.strip() for label in re.split(r",(?![^()]*\))", text) if label.strip()]


def only_presses(collected: Collected, presses: list[str]) -> Collected:
    """`collected` with the rows of `presses` (as the leaderboard names them) and the reference only."""
    held = set(collected.rows["press"])
    unknown = [press for press in presses if press not in held]
    if unknown:
        raise BadInput(
            f"--presses {unknown[0]!r} is not a press of these results (they hold {', '.join(sorted(held))})"
        )
    rows = collected.rows[collected.rows["press"].isin([*presses, REFERENCE_PRESS])]
    return replace(collected, rows=rows.reset_index(drop=True))


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
    boards = build_leaderboards(collected.rows, collected.runs, versus)
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
    title = "kvbench report"
    (out_dir / "README.md").write_text(to_markdown(title, blocks))
    (out_dir / "index.html").write_text(to_html(title, blocks))
    return out_dir


@click.command()
@click.argument("result_dirs", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Folder to write README.md, index.html and the PNG plots into, e.g. reports/my-sweep.",
)
@click.option(
    "--recursive",
    is_flag=True,
    help="Also read the results folders below each RESULT_DIR (by default only RESULT_DIR/rows.jsonl).",
)
@click.option(
    "--versus",
    metavar="PRESS",
    help="Add a table of every press minus PRESS, paired by sample, e.g. --versus streaming_llm or --versus "
    "'kvp(agents=agents/old)' (as the leaderboard names it).",
)
@click.option(
    "--presses",
    metavar="LIST",
    help="Report only these presses, comma-separated as the leaderboard names them (and the no-compression "
    "reference), e.g. --presses kvp,streaming_llm,'kvp(agents=agents/old)'. Default: every press.",
)
@click.option(
    "--every-state",
    is_flag=True,
    help="Keep the rows a learned press scored with older agents or policies as a press of their own, named "
    "PRESS@STATE (the state digest its rows record), e.g. to compare agents before and after a retrain with "
    "--versus kvp@58260c05679a. Default: only each press's latest state, the others set aside.",
)
def report(
    result_dirs: tuple[Path, ...],
    out: Path,
    recursive: bool,
    versus: str | None,
    presses: str | None,
    every_state: bool,
):
    """Leaderboards, per-task tables and plots from one or more results folders."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            chosen = split_press_labels(presses) if presses else None
            out_dir = render_report(list(result_dirs), out, recursive, versus, chosen, every_state)
        except NoResults as error:
            out_dir = error
    for caught_warning in caught:  # one line each, not Python's two-line warning format
        click.echo(f"Warning: {caught_warning.message}", err=True)
    if isinstance(out_dir, NoResults):
        raise click.UsageError(str(out_dir)) from out_dir
    click.echo(f"Report written to {out_dir / 'README.md'} and {out_dir / 'index.html'}")
