"""`kvbench report`: leaderboards, tables and plots (markdown + self-contained HTML) from results folders.

A results folder holds `rows.jsonl` (one row per config and sample, see kvbench.results) and `runs/*.json`
(one record per invocation: command, config, versions, git commit). Reports never average across models or
context lengths: there is one leaderboard per (model, length).
"""

import base64
import html
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

import click
import pandas as pd

from kvbench.results import load_rows, load_runs, results_files
from kvbench.tasks.longbench import longbench_average, longbench_e_buckets

REFERENCE_PRESS = "none"  # ratio 0.0: the no-compression reference


class NoResults(ValueError):
    """A path given to the report holds no results."""


@dataclass
class Run:
    """One invocation recorded in `runs/*.json` of a results folder."""

    results_dir: str  # the folder, as the rows' `source` column names it
    command: str
    config: dict
    versions: dict
    git_commit: str
    started: str
    finished: str


@dataclass
class Leaderboard:
    """Everything the report says about one (model, length)."""

    model: str
    length: int
    task_scores: pd.DataFrame  # index (press, ratio), columns task: mean score per task
    sample_counts: pd.DataFrame  # same shape: number of samples behind each mean (0 where missing)
    reference: pd.Series | None  # per-task mean score of press "none"; None when not run
    average: pd.DataFrame  # press x ratio: mean over tasks of the per-task means
    stderr: pd.DataFrame  # press x ratio: standard error of `average` over samples (NaN below 2 per task)
    delta: pd.DataFrame | None  # press x ratio: mean over tasks of (task mean - reference task mean)
    rank: pd.DataFrame  # press x ratio: 1 = best average at that ratio
    mean_rank: pd.Series  # press: mean of its ranks over ratios
    memory: pd.DataFrame  # index (press, ratio), columns kept_fraction, kept_bytes
    context_tokens: pd.Series  # task: mean context length in tokens
    missing: dict[tuple[str, float], list[str]]  # (press, ratio) -> ["task have/expected", ...]
    runs: list[Run]
    longbench: dict[str, pd.DataFrame]  # "longbench" / "longbench-e" -> (press, ratio) x category averages
    longbench_e_buckets: pd.DataFrame | None  # (press, ratio) x length bucket; None without LongBench-E meta


def config_label(press: str, press_args: dict | None) -> str:
    """The press name, plus its arguments when any: two configs of one press stay apart."""
    if not press_args:
        return press
    args = ", ".join(f"{key}={value}" for key, value in sorted(press_args.items()))
    return f"{press}({args})"


def result_files(paths: list[Path]) -> list[Path]:
    """Every rows.jsonl at or below the given paths; a path without any is bad input."""
    files = []
    for path in paths:
        found = results_files([path])
        if not found:
            raise NoResults(f"{path} holds no results (no rows.jsonl in it or below it)")
        files += [file for file in found if file not in files]
    return files


def read_runs(rows_file: Path) -> list[Run]:
    """The run records next to one rows.jsonl."""
    return [
        Run(
            results_dir=str(rows_file.parent),
            command=record.get("command", ""),
            config=record.get("config", {}),
            versions=record.get("versions", {}),
            git_commit=record.get("git_commit") or "unknown",
            started=record.get("started", ""),
            finished=record.get("finished", ""),
        )
        for record in load_runs([rows_file])
    ]


def requested_configs(config: dict) -> list[tuple[str, float]]:
    return [
        (config_label(c["press"], dict(c.get("press_args") or [])), float(c["ratio"]))
        for c in config.get("configs", [])
    ]


def find_missing(counts: pd.DataFrame, runs: list[Run]) -> dict[tuple[str, float], list[str]]:
    """Configs x tasks holding fewer samples than the fullest config of that task or than a run requested."""
    expected_configs = set(counts.index)
    expected = counts.max(axis=0).to_dict()  # task -> most samples any config has
    for run in runs:
        expected_configs.update(requested_configs(run.config))
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


def build_leaderboard(rows: pd.DataFrame, runs: list[Run]) -> Leaderboard:
    """Leaderboard of the rows of one (model, length)."""
    cells = rows.groupby(["press", "ratio", "task"])["score"].agg(["mean", "count", "var"])
    task_scores = cells["mean"].unstack("task")
    counts = cells["count"].unstack("task").fillna(0).astype(int)
    reference_key = (REFERENCE_PRESS, 0.0)
    reference = task_scores.loc[reference_key] if reference_key in task_scores.index else None

    compressed = task_scores.drop(index=REFERENCE_PRESS, level="press", errors="ignore")
    average = compressed.mean(axis=1).unstack("ratio")
    # The average is a mean of independent task means: its variance is sum(var_t / n_t) / tasks^2.
    mean_variance = (cells["var"] / cells["count"]).unstack("task")
    mean_variance = mean_variance.drop(index=REFERENCE_PRESS, level="press", errors="ignore")
    stderr = (mean_variance.sum(axis=1, min_count=1) ** 0.5 / mean_variance.shape[1]).unstack("ratio")
    stderr = stderr.where(mean_variance.notna().all(axis=1).unstack("ratio"))
    rank = average.rank(axis=0, ascending=False, method="min")  # NaN where a press lacks that ratio
    mean_rank = rank.mean(axis=1)
    order = sorted(average.index, key=lambda press: (mean_rank[press], -average.loc[press].mean()))
    delta = None
    if reference is not None:
        delta = compressed.sub(reference, axis=1).mean(axis=1).unstack("ratio").loc[order]

    # kv_kept / kv_total count KV entries (tokens x layers x KV heads); kv_bytes_kept: the tensors' bytes.
    kept = rows.assign(kept_fraction=rows["kv_kept"] / rows["kv_total"], kept_bytes=rows["kv_bytes_kept"])
    memory = kept.groupby(["press", "ratio"])[["kept_fraction", "kept_bytes"]].mean()
    return Leaderboard(
        model=rows["model"].iloc[0],
        length=rows["length"].iloc[0],
        task_scores=task_scores,
        sample_counts=counts,
        reference=reference,
        average=average.loc[order],
        stderr=stderr.loc[order],
        delta=delta,
        rank=rank.loc[order],
        mean_rank=mean_rank.loc[order],
        memory=memory,
        context_tokens=rows.groupby("task")["context_tokens"].mean(),
        missing=find_missing(counts, runs),
        runs=runs,
        longbench=longbench_tables(task_scores),
        longbench_e_buckets=bucket_means(rows),
    )


def runs_for(rows: pd.DataFrame, runs: list[Run]) -> list[Run]:
    """The runs recorded next to these rows that ran their model at their length."""
    model, length = rows["model"].iloc[0], rows["length"].iloc[0]
    sources = set(rows["source"])
    return [
        run
        for run in runs
        if run.results_dir in sources
        and run.config.get("model") == model
        and run.config.get("length") == length
    ]


def build_leaderboards(rows: pd.DataFrame, runs: list[Run]) -> list[Leaderboard]:
    return [
        build_leaderboard(group, runs_for(group, runs))
        for _, group in rows.groupby(["model", "length"], sort=True, dropna=False)
    ]


# ---- plots ---------------------------------------------------------------------------------------------


def new_figure(width: float, height: float):
    # A bare Figure on the Agg canvas: no pyplot global state, nothing to close, works headless.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def plot_scores(board: Leaderboard, path: Path) -> Path:
    """Average score vs compression ratio, one line per press, dashed line at no compression."""
    import seaborn as sns

    long = board.average.rename_axis(index="press", columns="ratio").stack().rename("score").reset_index()
    figure = new_figure(7, 4.5)
    ax = figure.subplots()
    sns.lineplot(
        data=long, x="ratio", y="score", hue="press", style="press", markers=True, dashes=False, ax=ax
    )
    if board.reference is not None:
        ax.axhline(board.reference.mean(), linestyle="--", color="gray", label="none (no compression)")
    ax.set_xticks(sorted(long["ratio"].unique()))
    ax.set_ylim(-3, 103)  # the full score range, so plots of different sweeps compare at a glance
    ax.set_xlabel("compression ratio (fraction of KV removed)")
    ax.set_ylabel("average score (mean of task means)")
    ax.set_title(f"{board.model}, length {board.length}")
    ax.legend(fontsize="small", loc="center left", bbox_to_anchor=(1.01, 0.5))
    figure.savefig(path, dpi=100)
    return path


def breakdown(board: Leaderboard, ratio: float) -> pd.DataFrame:
    """Task x press mean scores at one ratio, the no-compression reference first when there is one."""
    presses_at_ratio = board.average.index[board.average[ratio].notna()]
    at_ratio = board.task_scores.xs(ratio, level="ratio").loc[presses_at_ratio]
    if board.reference is not None:
        at_ratio = pd.concat([board.reference.to_frame(REFERENCE_PRESS).T, at_ratio])
    return at_ratio.T.rename_axis(index="task", columns="press")


def plot_heatmap(table: pd.DataFrame, title: str, path: Path) -> Path:
    import seaborn as sns

    figure = new_figure(1.8 + 1.1 * table.shape[1], 1.2 + 0.45 * table.shape[0])
    ax = figure.subplots()
    sns.heatmap(table, annot=True, fmt=".1f", vmin=0, vmax=100, cmap="viridis", ax=ax)
    ax.set_title(title)
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


def fmt_bytes(value: float) -> str:
    units = ["B", "KiB", "MiB", "GiB"]
    power = 0
    while value >= 1024 and power < len(units) - 1:
        value, power = value / 1024, power + 1
    return f"{value:.0f} B" if power == 0 else f"{value:.1f} {units[power]}"


def ratio_columns(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.rename(columns=lambda ratio: f"{ratio:g}").rename_axis(index="press", columns=None)


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-")


def leaderboard_blocks(board: Leaderboard, out_dir: Path) -> list:
    blocks = [Heading(f"{board.model}, length {board.length}")]
    if board.reference is not None:
        blocks.append(Paragraph(f"No compression (`{REFERENCE_PRESS}`): {board.reference.mean():.1f}"))
    else:
        blocks.append(Paragraph(f"No `{REFERENCE_PRESS}` rows: no no-compression reference, no deltas."))
    if board.average.empty:
        blocks.append(Paragraph("No compressed configs: nothing to rank."))
    else:
        blocks += comparison_blocks(board, out_dir, f"{slug(board.model)}-{board.length}")
    memory = board.memory.apply(
        lambda row: f"{row['kept_fraction']:.1%} ({fmt_bytes(row['kept_bytes'])})", axis=1
    ).unstack("ratio")
    memory = memory.reindex([p for p in [REFERENCE_PRESS, *board.average.index] if p in memory.index])
    blocks += [
        Heading("KV cache kept", 3),
        Paragraph("Mean over samples of kv_kept / kv_total, and mean KV bytes kept per sample."),
        Table(ratio_columns(memory.fillna(""))),
        Heading("Samples per task", 3),
        Table(
            pd.DataFrame(
                {
                    "samples": board.sample_counts.max(axis=0).astype(str),
                    "mean context tokens": board.context_tokens.map(lambda t: f"{t:.0f}"),
                }
            ).rename_axis(index="task")
        ),
    ]
    blocks += longbench_blocks(board)
    if board.missing:
        blocks += [
            Heading("Missing results", 3),
            Paragraph(
                "Configs x tasks with fewer samples than the fullest config of the task or than runs/*.json "
                "requested (have/expected):"
            ),
            Code("\n".join(f"{p} @ {r:g}: " + ", ".join(gaps) for (p, r), gaps in board.missing.items())),
        ]
    return blocks + provenance_blocks(board.runs)


def comparison_blocks(board: Leaderboard, out_dir: Path, name: str) -> list:
    """Leaderboard, deltas, ranks, per-task tables and plots of the compressed configs."""
    scores = board.average.copy().astype(object)
    for press in scores.index:
        for ratio in scores.columns:
            cell = fmt_score(board.average.at[press, ratio])
            scores.at[press, ratio] = cell + ("*" if cell and (press, ratio) in board.missing else "")
    scores = ratio_columns(scores)
    scores["mean rank"] = board.mean_rank.map(lambda r: f"{r:.2f}")
    blocks = [
        Heading("Leaderboard: average score", 3),
        Paragraph(
            "Average score (0-100) per press and compression ratio (fraction of the KV cache removed). "
            "The average over tasks is the mean of the per-task means, so every task weighs the same "
            "whatever its number of samples. Presses are sorted by mean rank."
            + (" `*`: incomplete, see Missing results." if board.missing else "")
        ),
        Table(scores),
        Paragraph(
            "95 % confidence half-width of each average (1.96 x its standard error over samples, tasks "
            "taken as independent; blank with fewer than 2 samples in a task). Two presses whose "
            "averages differ by less than this are not told apart by these samples."
        ),
        Table(ratio_columns(board.stderr.map(lambda se: "" if pd.isna(se) else f"±{1.96 * se:.1f}"))),
    ]
    if board.delta is not None:
        blocks += [
            Heading("Delta to no compression", 3),
            Paragraph("Mean over tasks of (task mean - no-compression task mean), on the tasks both ran."),
            Table(ratio_columns(board.delta.map(fmt_delta))),
        ]
    blocks += [
        Heading("Rank at each ratio", 3),
        Table(ratio_columns(board.rank.map(lambda r: "" if pd.isna(r) else f"{r:.0f}"))),
        Image(plot_scores(board, out_dir / f"{name}-scores.png"), "Average score vs compression ratio"),
        Heading("Per-task scores", 3),
    ]
    for ratio in board.average.columns:
        table = breakdown(board, ratio)
        heatmap = plot_heatmap(
            table, f"{board.model}, ratio {ratio:g}", out_dir / f"{name}-tasks-{ratio:g}.png"
        )
        blocks += [
            Paragraph(f"Ratio {ratio:g}: mean score per task"),
            Table(table.map(fmt_score)),
            Image(heatmap, f"Task x press scores at ratio {ratio:g}"),
        ]
    return blocks


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


def provenance_blocks(runs: list[Run]) -> list:
    if not runs:
        return [
            Heading("Provenance", 3),
            Paragraph(
                "No runs/*.json (a run still going, or interrupted?): the commands, versions and "
                "requested sample counts are unknown."
            ),
        ]
    blocks = [Heading("Provenance", 3), Paragraph("The commands that produced these results:")]
    for run in runs:
        blocks += [
            Code(run.command),
            Paragraph(f"`{run.results_dir}`, git `{run.git_commit}`, {run.started} to {run.finished}"),
        ]
    packages = sorted({name for run in runs for name in run.versions})
    versions = pd.DataFrame(
        {"version": [" / ".join(sorted({str(run.versions.get(p, "?")) for run in runs})) for p in packages]},
        index=pd.Index(packages, name="package"),
    )
    return blocks + [Paragraph("Versions (several when runs differ):"), Table(versions)]


def markdown_table(frame: pd.DataFrame) -> str:
    header = [frame.index.name or ""] + [str(c) for c in frame.columns]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for index, row in frame.iterrows():
        lines.append("| " + " | ".join([str(index)] + [str(v) for v in row]) + " |")
    return "\n".join(lines)


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
table { border-collapse: collapse; margin: 0.5em 0 1em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th:first-child, td:first-child { text-align: left; }
thead th { background: #f0f0f0; }
pre { background: #f6f6f6; padding: 0.6em; overflow-x: auto; }
img { max-width: 100%; }
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
            parts.append(block.frame.to_html(border=0))
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


def keep_latest_press_state(rows: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """Keep, for each model and press, the rows of the learned state (e.g. KVP agents) written last.

    Rows scored with older agents are other results; averaging them with the new ones would describe no
    agents at all. The reader is told what was set aside.
    """
    if "press_state" not in rows:
        return rows, []
    state = rows["press_state"].fillna("unrecorded")
    latest = state.groupby([rows["model"], rows["press"]]).transform("last")
    notes = [
        f"{press} on {model}: rows of {group.nunique()} versions of its learned state; the report uses the "
        f"latest ({latest[group.index[0]]}) and sets aside {int((group != latest[group.index]).sum())} rows "
        "of older ones."
        for (model, press), group in state.groupby([rows["model"], rows["press"]])
        if group.nunique() > 1
    ]
    return rows[state == latest].reset_index(drop=True), notes


def collect(paths: list[Path]) -> Collected:
    files = result_files([Path(p) for p in paths])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rows = load_rows(files)
        runs = [run for file in files for run in read_runs(file)]
    for caught_warning in caught:  # recorded for the report, still shown to the user
        warnings.warn(caught_warning.message, stacklevel=2)
    if rows.empty:
        raise NoResults(f"no result rows in {', '.join(str(file) for file in files)}")
    rows["press"] = [config_label(p, a) for p, a in zip(rows["press"], rows["press_args"], strict=True)]
    rows, notes = keep_latest_press_state(rows)
    models = sorted(rows["model"].unique())
    if len(models) > 1:
        notes.append(
            f"Warning: these results hold {len(models)} models ({', '.join(models)}); "
            "each gets its own leaderboard, scores are never averaged across models."
        )
    notes += [f"Skipped while reading: {w.message}" for w in caught]
    return Collected([str(file.parent) for file in files], rows, runs, notes)


def render_report(result_dirs: list[Path], out_dir: Path) -> Path:
    """Write README.md, index.html and the PNG plots of the results under `result_dirs` into `out_dir`."""
    collected = collect(result_dirs)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    blocks = [Paragraph("Results folders: " + ", ".join(f"`{d}`" for d in collected.dirs))]
    blocks += [Paragraph(note) for note in collected.notes]
    for board in build_leaderboards(collected.rows, collected.runs):
        blocks += leaderboard_blocks(board, out_dir)
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
def report(result_dirs: tuple[Path, ...], out: Path):
    """Leaderboards, per-task tables and plots from one or more results folders."""
    try:
        out_dir = render_report(list(result_dirs), out)
    except NoResults as error:
        raise click.UsageError(str(error)) from error
    click.echo(f"Report written to {out_dir / 'README.md'} and {out_dir / 'index.html'}")
