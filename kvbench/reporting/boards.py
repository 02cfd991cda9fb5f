"""Leaderboards: one per (model, length, protocol), each with its ratio view and, where rows record bytes
or memory budgets, its memory view; which configs were asked for and are missing.
"""

from dataclasses import dataclass

import pandas as pd

from kvbench.config import RECORDED_PROTOCOLS
from kvbench.reporting.read import REFERENCE_PRESS, Run, config_label, protocol_label, with_report_columns
from kvbench.reporting.stats import config_stats, paired_lead, paired_versus
from kvbench.tasks.longbench import longbench_average, longbench_e_buckets

CODEC_GAP = 0.01  # a config whose memory fraction differs from its kept-entry fraction by more is a codec


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
        RECORDED_PROTOCOLS.index(p) if p in RECORDED_PROTOCOLS else len(RECORDED_PROTOCOLS)
        for p in rows["protocol"]
    ]
    keys = ["model", "length", "protocol_order", "protocol_label"]
    return [
        build_leaderboard(group, runs_for(group, runs), versus) for _, group in rows.groupby(keys, sort=True)
    ]
