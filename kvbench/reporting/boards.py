"""Leaderboards: one per (model, length, protocol), never averaged across them, each with its views (by
compression ratio, by memory budget, by absolute budget), the score by question or turn under the
protocols that ask several, and which configs were asked for and are missing.
"""

from dataclasses import dataclass

import pandas as pd

from kvbench.core.config import RECORDED_PROTOCOLS, usable_protocols
from kvbench.reporting.read import REFERENCE_PRESS, Run, config_label, protocol_label, with_report_columns
from kvbench.reporting.stats import config_stats, paired_lead, paired_versus
from kvbench.tasks.longbench import longbench_average, longbench_e_buckets

# A length whose tasks' contexts all stay below this share of it is a cap, not their length (a user's
# --data contexts are cut to it, never filled): the title says what they measured.
CAP_SHARE = 0.9
CODEC_GAP = 0.01  # a config whose memory fraction differs from its kept-entry fraction by more is a codec
# The rows' column each view's configs are keyed by, and whether its columns go least compressed first by
# ascending value (ratios) or by descending value (memory fractions, entries per head).
AXES = {"ratio": True, "memory": False, "budget": False}


@dataclass
class ScoreView:
    """A leaderboard's configs along one axis: by compression ratio, by memory budget (fraction of the
    16-bit cache's bytes) or by absolute budget (KV entries kept per head and layer)."""

    axis: str  # "ratio", "memory" or "budget": the rows' column the configs are keyed by
    average: pd.DataFrame  # press x value: mean over tasks of the per-task means (the reference left out)
    low: pd.DataFrame  # press x value: the 95 % interval of `average` (NaN where undefined; see stats)
    high: pd.DataFrame
    samples: pd.DataFrame  # press x value: samples behind each cell
    measured: pd.DataFrame  # press x value: mean over samples of kv_bytes / kv_bytes_full
    rank: pd.DataFrame  # press x value: 1 = best average at that value
    mean_rank: pd.Series  # press: mean of its ranks over the values
    lead: pd.DataFrame  # per value: the leader's paired lead over the runner-up (`paired_lead`)
    kept: pd.DataFrame  # index (press, value), the reference included: kept_fraction, kept_bytes, memory
    missing: dict[tuple[str, float], list[str]]  # (press, value) -> ["task have/expected", ...]
    versus: pd.DataFrame | None = None  # with `report --versus`: each press's paired difference to it


@dataclass
class Leaderboard:
    """Everything the report says about one (model, length, protocol)."""

    model: str
    length: int | None  # None: rows of lm-eval tasks, which size their own samples
    protocol: str  # the protocol and its arguments, e.g. "decode-time (interval=16)"
    suite: str  # the suites the runs named, or the number of tasks
    task_scores: pd.DataFrame  # ratio view: index (press, ratio), columns task: mean score per task
    sample_counts: pd.DataFrame  # same shape: number of samples behind each mean (0 where missing)
    reference: pd.Series | None  # per-task mean score of press "none"; None when not run
    ratio: ScoreView | None  # configs run with a compression ratio (codecs left out); None without any
    delta: pd.DataFrame | None  # press x ratio: mean over tasks of (task mean - reference task mean)
    memory: ScoreView | None  # configs run with a memory budget, and codecs run with a ratio
    memory_points: pd.DataFrame  # every compressed config: press, memory (measured), average, low, high
    budget: ScoreView | None  # configs run with an absolute budget (`--budget`)
    parts: pd.DataFrame | None  # (press, setting) x question or turn: mean score; None for other protocols
    part_counts: pd.DataFrame | None  # same shape: samples behind each mean
    part_name: str  # "question" or "turn"
    context_tokens: pd.Series  # task: mean context length in tokens
    context_range: tuple[float, float]  # the shortest and longest context of its rows, in tokens (NaN: none)
    runs: list[Run]
    longbench: dict[str, pd.DataFrame]  # "longbench" / "longbench-e" -> (press, ratio) x category averages
    longbench_e_buckets: pd.DataFrame | None  # (press, ratio) x length bucket; None without LongBench-E meta
    codecs: list[str]  # presses run with a ratio that store fewer bytes than their kept entries
    has_bytes: bool  # rows record kv_bytes, or ran with a memory budget: the memory view is shown
    sources: dict[str, list[dict]] | None = None  # press -> where its code comes from (`press_sources`)
    baseline: str | None = None  # with `report --versus`: the press every view compares to
    stem: str = ""  # its plots' file stem where another board's would be the same (`blocks.unique_stems`)

    @property
    def title(self) -> str:
        length = "each task's own length" if self.length is None else f"length {self.length}"
        shortest, longest = self.context_range
        if self.length is not None and longest < CAP_SHARE * self.length:
            length += f" (a cap: contexts of {shortest:.0f}-{longest:.0f} tokens)"
        return f"{self.model}, {self.suite}, {length}, {self.protocol}"

    @property
    def presses(self) -> list[str]:
        """Every compressed press of its views."""
        views = [view for view in (self.ratio, self.memory, self.budget) if view is not None]
        return sorted({press for view in views for press in view.average.index})


def requested_configs(runs: list[Run], view: str, codecs: set[str]) -> list[tuple[str, float]]:
    """The configs the runs asked for that belong to one view: ("budget") those given an absolute budget,
    ("memory") those given a memory budget and codec presses given a ratio (at budget 1 - ratio),
    ("ratio") the others, by ratio."""
    configs = []
    for run in runs:
        for config in run.config.get("configs", []):
            press = config_label(config["press"], dict(config.get("press_args") or []))
            memory, budget = config.get("memory"), config.get("budget")
            if budget is not None:
                if view == "budget":
                    configs.append((press, float(budget)))
                continue
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
    protocols = usable_protocols()  # a plugin's that no longer loads counts as one question per sample
    for run in runs:
        configs = run.config.get("configs")
        if isinstance(configs, list) and any(
            isinstance(c, dict)
            and c.get("protocol") in protocols
            and protocols[c["protocol"]].several_questions
            for c in configs
        ):
            continue  # its `samples` counts contexts, each asking several tasks: not samples per task
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
    ratio_run = rows["memory"].isna() & rows["budget"].isna()
    gap = (rows["memory_ratio"] - rows["kept_fraction"]).abs()
    config_gap = gap.groupby([rows["press"], rows["ratio"], ratio_run]).transform("mean")
    return ratio_run & (config_gap > CODEC_GAP)


def compressed_rows(rows: pd.DataFrame) -> pd.DataFrame:
    return rows[rows["press"] != REFERENCE_PRESS]


def build_view(
    rows: pd.DataFrame, axis: str, runs: list[Run], codecs: set[str], versus: str | None = None
) -> ScoreView | None:
    """The view of `rows` (the reference's included, when it belongs to the view) along `axis`; None
    without rows."""
    if rows.empty:
        return None
    stats = config_stats(rows, axis)
    compressed = stats.drop(index=REFERENCE_PRESS, level="press", errors="ignore")
    columns = sorted(compressed.index.get_level_values(axis).unique(), reverse=not AXES[axis])
    frames = {
        name: compressed[name].unstack(axis).reindex(columns=columns)
        if len(compressed)
        else pd.DataFrame(columns=pd.Index([], dtype=float), index=pd.Index([], name="press"))
        for name in ("average", "low", "high", "samples", "memory")
    }
    rank, mean_rank, order = ranking(frames["average"])
    frames = {name: frame.loc[order] for name, frame in frames.items()}
    counts = rows.groupby(["press", axis, "task"]).size().unstack("task").fillna(0).astype(int)
    scored = compressed_rows(rows)
    return ScoreView(
        axis=axis,
        average=frames["average"],
        low=frames["low"],
        high=frames["high"],
        samples=frames["samples"],
        measured=frames["memory"],
        rank=rank,
        mean_rank=mean_rank,
        lead=paired_lead(scored, frames["average"], axis),
        kept=stats[["kept_fraction", "kept_bytes", "memory"]],
        missing=find_missing(counts, runs, requested_configs(runs, axis, codecs)),
        versus=paired_versus(scored, frames["average"], axis, versus) if versus else None,
    )


def memory_points(views: list[ScoreView | None]) -> pd.DataFrame:
    """Every compressed config of the views at the memory fraction it measured, for the plot that puts
    evictors and codecs on one axis."""
    frames = []
    for view in views:
        if view is None or view.average.empty:
            continue
        stacked = {name: getattr(view, name).stack(future_stack=True) for name in ("average", "low", "high")}
        frame = pd.DataFrame(stacked | {"memory": view.measured.stack(future_stack=True)})
        frames.append(frame.dropna(subset=["average"]).droplevel(1).reset_index())
    columns = ["press", "average", "low", "high", "memory"]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)


def setting_labels(rows: pd.DataFrame) -> list[str]:
    """How a row's config is set, as the tables name it: `ratio 0.5`, `memory 0.5`, `budget=128`."""
    return [
        f"budget={budget:.0f}"
        if pd.notna(budget)
        else f"memory {memory:g}"
        if pd.notna(memory)
        else f"ratio {ratio:g}"
        for ratio, memory, budget in zip(rows["ratio"], rows["memory"], rows["budget"], strict=True)
    ]


def part_tables(rows: pd.DataFrame) -> tuple[pd.DataFrame | None, pd.DataFrame | None]:
    """Under the protocols that ask one context several questions: each config's mean score (mean of the
    per-task means) at each question or turn (0-based, as rows record it), and the samples behind each."""
    parted = rows[rows["part"].notna()]
    if parted.empty:
        return None, None
    keys = ["press", "setting", "part"]
    cells = parted.groupby([*keys, "task"])["score"].mean()
    scores = cells.groupby(level=keys).mean().unstack("part")
    counts = parted.groupby(keys).size().unstack("part").fillna(0).astype(int)
    return scores, counts


def suite_of(rows: pd.DataFrame, runs: list[Run]) -> str:
    suites = sorted({run.config["suite"] for run in runs if run.config.get("suite")})
    tasks = rows["task"].nunique()
    return ", ".join(suites) if suites else f"{tasks} task{'s' if tasks > 1 else ''}"


def press_sources(rows: pd.DataFrame) -> dict[str, list[dict]]:
    """Per press of the rows (the reference left out): each source its rows record, a user's press's target,
    file, sha256 and package (`registry.Source`), and its learned state's digest where it loads one; an
    empty dict for a press of kvbench's registry that loads none."""
    sources = {}
    states = rows["press_state"] if "press_state" in rows else pd.Series(None, index=rows.index)
    found = rows["press_source"] if "press_source" in rows else pd.Series(None, index=rows.index)
    for press, source, state in zip(rows["press"], found, states, strict=True):
        if press == REFERENCE_PRESS:
            continue
        entry = dict(source) if isinstance(source, dict) else {}
        if isinstance(state, str) and state:
            entry["state"] = state
        if entry not in sources.setdefault(press, []):
            sources[press].append(entry)
    return dict(sorted(sources.items()))


def build_leaderboard(rows: pd.DataFrame, runs: list[Run], versus: str | None = None) -> Leaderboard:
    """Leaderboard of the scored rows of one (model, length, protocol), which carry the columns
    `with_report_columns` adds."""
    rows = rows.assign(setting=setting_labels(rows))
    budget_rows = rows[rows["budget"].notna()]
    codec = codec_rows(rows)
    codecs = set(rows.loc[codec, "press"])
    memory_rows = pd.concat(
        [rows[rows["memory"].notna()], rows[codec].assign(memory=1 - rows.loc[codec, "ratio"])]
    )
    ratio_rows = rows[rows["memory"].isna() & rows["budget"].isna() & ~codec]

    cells = ratio_rows.groupby(["press", "ratio", "task"])["score"].agg(["mean", "count"])
    task_scores = cells["mean"].unstack("task")
    counts = cells["count"].unstack("task").fillna(0).astype(int)
    reference_key = (REFERENCE_PRESS, 0.0)
    reference = task_scores.loc[reference_key] if reference_key in task_scores.index else None

    ratio = build_view(ratio_rows, "ratio", runs, codecs, versus)
    memory = build_view(memory_rows, "memory", runs, codecs, versus)
    budget = build_view(budget_rows, "budget", runs, codecs, versus)
    delta = None
    if reference is not None and ratio is not None and not ratio.average.empty:
        others = task_scores.drop(index=REFERENCE_PRESS, level="press", errors="ignore")
        delta = others.sub(reference, axis=1).mean(axis=1).unstack("ratio").loc[ratio.average.index]
    parts, part_counts = part_tables(rows)
    metas = rows["meta"] if "meta" in rows else []
    turns = any(isinstance(meta, dict) and "turn" in meta for meta in metas)
    return Leaderboard(
        model=rows["model"].iloc[0],
        length=None if pd.isna(rows["length"].iloc[0]) else int(rows["length"].iloc[0]),
        protocol=rows["protocol_label"].iloc[0],
        suite=suite_of(rows, runs),
        task_scores=task_scores,
        sample_counts=counts,
        reference=reference,
        ratio=ratio,
        delta=delta,
        memory=memory,
        memory_points=memory_points([ratio, memory, budget]),
        budget=budget,
        parts=parts,
        part_counts=part_counts,
        part_name="turn" if turns else "question",
        context_tokens=rows.groupby("task")["context_tokens"].mean(),
        context_range=(rows["context_tokens"].min(), rows["context_tokens"].max()),
        runs=runs,
        longbench=longbench_tables(task_scores),
        longbench_e_buckets=bucket_means(ratio_rows),
        codecs=sorted(codecs),
        has_bytes=bool(len(memory_rows)) or bool(rows["kv_bytes"].notna().any()),
        sources=press_sources(rows),
        baseline=versus,
    )


def runs_for(rows: pd.DataFrame, runs: list[Run]) -> list[Run]:
    """The runs recorded next to these rows that ran their model with their protocol on one of their tasks
    at their length (`ran_at`): what identifies a run's rows, whatever the run was asked (a `--data` task or
    a suite without a length records no `length`, only each task's own in `lengths`)."""
    model, length, protocol = rows["model"].iloc[0], rows["length"].iloc[0], rows["protocol_label"].iloc[0]
    length = None if pd.isna(length) else int(length)
    sources, tasks = set(rows["source"]), set(rows["task"])
    return [
        run
        for run in runs
        if run.results_dir in sources
        and run.config.get("model") == model
        and protocol in run_protocols(run.config)
        and ran_at(run.config, tasks, length)
    ]


def ran_at(config: dict, tasks: set[str], length: int | None) -> bool:
    """Whether a run record's config ran one of `tasks` at `length`: a task's length is its entry in
    `lengths`, else the run's `length`; a run that names no length for a task (lm-eval's tasks size their
    own) ran it at any. A record that names no tasks is matched on its length alone."""
    named = config.get("tasks")
    lengths = config.get("lengths") or {}
    candidates = [task for task in named if task in tasks] if isinstance(named, list) else [None]
    return any(
        (ran := lengths.get(task, config.get("length"))) is None or ran == length for task in candidates
    )


def run_protocols(config: dict) -> set[str]:
    """The protocol labels a run's configs ran under: a sweep records the protocol in each config; a run
    record that names one at the top (perplexity's) ran every config under it."""
    configs = config.get("configs")
    configs = configs if isinstance(configs, list) and configs and not config.get("protocol") else [config]
    return {
        protocol_label(c.get("protocol"), pairs_as_dict(c.get("protocol_args")))
        for c in configs
        if isinstance(c, dict)
    }


def pairs_as_dict(value) -> dict:
    """A run record's protocol arguments, [[key, value], ...] as written (or a dict); anything else, none:
    a hand-edited record names the run less exactly, it does not stop the report."""
    if isinstance(value, dict):
        return value
    if isinstance(value, list) and all(isinstance(p, list) and len(p) == 2 for p in value):
        return {str(key): item for key, item in value}
    return {}


def unscored_note(rows: pd.DataFrame) -> str | None:
    """What the leaderboards leave out: rows that record no score, by protocol (perplexity rows have a
    section of their own, and never reach here)."""
    unscored = rows[pd.to_numeric(rows["score"], errors="coerce").isna()]
    if unscored.empty:
        return None
    protocols = with_report_columns(unscored)["protocol_label"].value_counts().sort_index()
    counted = ", ".join(f"{count} under {protocol}" for protocol, count in protocols.items())
    return f"Rows without a score ({counted}) are on no leaderboard."


def build_leaderboards(rows: pd.DataFrame, runs: list[Run], versus: str | None = None) -> list[Leaderboard]:
    """One leaderboard per (model, length, protocol) of the rows that hold a score: scores are never
    averaged across them. `versus`: a press (as the leaderboard names it) every other press is compared
    to, paired by sample."""
    rows = with_report_columns(rows, runs)
    rows = rows[rows["score"].notna()].copy()
    rows["protocol_order"] = [
        RECORDED_PROTOCOLS.index(p) if p in RECORDED_PROTOCOLS else len(RECORDED_PROTOCOLS)
        for p in rows["protocol"]
    ]
    keys = ["model", "length", "protocol_order", "protocol_label"]
    groups = rows.groupby(keys, sort=True, dropna=False)  # rows of lm-eval tasks have no length: kept
    return [build_leaderboard(group, runs_for(group, runs), versus) for _, group in groups]
