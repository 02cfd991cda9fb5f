"""Run a grid of (press, ratio) configs over tasks, resumably, into a results store."""

import platform
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pandas as pd
from tqdm.auto import tqdm

from kvbench import tasks
from kvbench.engine import Config, evaluate_sample
from kvbench.models import model_name
from kvbench.resources import checkout_root
from kvbench.results import ResultsStore, config_id, load_rows, row_key

PACKAGES = ("kvbench", "torch", "transformers", "kvpress", "datasets", "lm-eval", "accelerate", "flash-attn")


@dataclass
class Plan:
    """What a `run` or `sweep` evaluates: every config on every sample of every task."""

    configs: list[Config]
    tasks: list[str]
    length: int | None  # as asked (--length or the suite's); None: each task's default for the model
    samples: int
    seed: int = 0
    suite: str | None = None
    data_dir: Path | None = None
    batch_configs: int = 16
    force: bool = False
    extra: dict = field(default_factory=dict)  # model/device/dtype as given, recorded in the run record
    lengths: dict[str, int] = field(default_factory=dict)  # per task, where it differs from `length`

    def task_length(self, task: str) -> int:
        return self.lengths.get(task, self.length)


def package_versions() -> dict:
    versions = {"python": platform.python_version()}
    for package in PACKAGES:
        try:
            versions[package] = version(package)
        except PackageNotFoundError:
            pass
    return versions


def git_commit() -> str | None:
    """The checkout's commit (-dirty with uncommitted changes); None for an installed wheel."""
    root = checkout_root()
    if root is None:
        return None
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return commit + ("-dirty" if dirty else "")


def base_row(model, config: Config, sample: tasks.Sample, plan: Plan) -> dict:
    name = model_name(model)
    press_args, protocol_args = dict(config.press_args), dict(config.protocol_args)
    identity = (config.press_state, config.memory, config.protocol, protocol_args)
    return {
        "config_id": config_id(name, config.press, config.ratio, press_args, *identity),
        "model": name,
        "press": config.press,
        "ratio": config.ratio,
        "memory": config.memory,
        "protocol": config.protocol,
        "protocol_args": protocol_args,
        "press_args": press_args,
        "press_state": config.press_state,
        "task": sample.task,
        "length": plan.task_length(sample.task),
        "seed": plan.seed,
        "sample_id": sample.id,
    }


def sample_rows(model, tokenizer, sample: tasks.Sample, configs: list[Config], plan: Plan) -> list[dict]:
    """The scored rows of one sample under `configs`: one unit of a sweep's work, wherever it runs."""
    outputs = evaluate_sample(model, tokenizer, sample, configs, batch_configs=plan.batch_configs)
    rows = []
    for config, output in zip(configs, outputs, strict=True):
        row = base_row(model, config, sample, plan)
        row.update(
            output,
            references=sample.references,
            meta=sample.meta,
            score=tasks.score_sample(sample, output["prediction"]),
        )
        rows.append(row)
    return rows


# Computes the rows of (sample, configs) units, yielding each unit's rows as they are ready, in any order.
Executor = Callable[[list[tuple[tasks.Sample, list[Config]]], Plan], Iterable[list[dict]]]


def run_plan(
    model, tokenizer, plan: Plan, store: ResultsStore, progress: bool = True, executor: Executor | None = None
) -> pd.DataFrame:
    """Evaluate what `store` lacks, appending each row once scored; return all rows of this plan.

    The rows are computed here, one sample at a time, or by `executor` (kvbench.ray_sweep's spreads them
    over Ray workers); either way this process alone writes them.
    """
    started = datetime.now(timezone.utc).isoformat()
    samples = [
        sample
        for task in plan.tasks
        for sample in tasks.load_samples(
            task,
            length=plan.task_length(task),
            samples=plan.samples,
            seed=plan.seed,
            tokenizer=tokenizer,
            data_dir=plan.data_dir,
        )
    ]
    # Written first, so that a killed run still says what it asked for; rewritten with scores at the end.
    record_path = store.write_run(run_record(model, plan, None, started))
    keys, units = set(), []
    for sample in samples:
        rows = [(config, base_row(model, config, sample, plan)) for config in plan.configs]
        keys.update(row_key(row) for _, row in rows)
        todo = [config for config, row in rows if plan.force or not store.has(row)]
        if todo:
            units.append((sample, todo))

    def here(units, plan):  # one sample at a time, in this process
        return (sample_rows(model, tokenizer, sample, configs, plan) for sample, configs in units)

    total = sum(len(configs) for _, configs in units)
    with tqdm(total=total, desc="rows", unit="row", disable=not progress, file=sys.stderr) as bar:
        for rows in (executor or here)(units, plan):
            for row in rows:
                store.append(row)
            bar.update(len(rows))
            bar.set_postfix_str(rows[-1]["task"])
    frame = load_rows([store.rows_path])
    frame = frame[[row_key(row) in keys for row in frame.to_dict("records")]]
    store.write_run(run_record(model, plan, frame, started), path=record_path)
    return frame


def summarize(frame: pd.DataFrame) -> pd.DataFrame:
    """Score per task (columns) for each (press, budget), plus the average over tasks; the budget is the
    ratio, or `memory=M` for configs given a memory budget."""
    if frame.empty:
        return pd.DataFrame()
    memory = frame["memory"] if "memory" in frame else pd.Series(None, index=frame.index, dtype=object)
    budget = [
        str(ratio) if pd.isna(m) else f"memory={m}" for ratio, m in zip(frame["ratio"], memory, strict=True)
    ]
    frame = frame.assign(budget=budget)
    table = frame.pivot_table(index=["press", "budget"], columns="task", values="score", aggfunc="mean")
    table["average"] = table.mean(axis=1)
    return table


def run_record(model, plan: Plan, frame: pd.DataFrame | None, started: str) -> dict:
    """The run's full config, versions and commit; with `frame`, its scores and finish time too."""
    table = summarize(frame) if frame is not None else pd.DataFrame()
    return {
        "command": " ".join(["kvbench", *sys.argv[1:]]),
        "config": {
            "model": model_name(model),
            "configs": [asdict(config) for config in plan.configs],
            "tasks": plan.tasks,
            "suite": plan.suite,
            "length": plan.length,
            **({"lengths": plan.lengths} if plan.lengths else {}),
            "samples": plan.samples,
            "seed": plan.seed,
            "data_dir": str(plan.data_dir) if plan.data_dir else None,
            **plan.extra,
        },
        "summary": {
            f"{press}@{budget}": {task: round(score, 2) for task, score in scores.items()}
            for (press, budget), scores in table.iterrows()
        },
        "versions": package_versions(),
        "git_commit": git_commit(),
        "started": started,
        "finished": datetime.now(timezone.utc).isoformat() if frame is not None else None,
    }
