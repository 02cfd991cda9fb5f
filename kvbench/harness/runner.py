"""Run configs over tasks, resumably, into a results store: the library behind `kvbench run`/`sweep`.

`run` and `sweep` are the Python API (`kvbench.run`, `kvbench.sweep`): they plan exactly as the command line
does (kvbench.harness.planning), load the model, key learned presses by their state (`prepare_plan`), and
score what the results folder lacks (`run_plan`: `QAEvaluator` under kvbench.harness.evaluation's runner,
which live-cache perplexity shares). Work is cut into units (`Unit`: one sample under up to
`batch_configs` configs, which share one prefill); `evaluate_unit` computes a unit's rows without touching
any store, so that a scheduler can spread units over workers and write their rows from one place
(`ResultsStore.claim`, then `append`): `run_plan` does so with an `Executor` (kvbench.harness.ray_sweep's
computes units on Ray actors).
"""

from __future__ import annotations

import functools
import typing
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from kvbench.bridge import models
from kvbench.core import provenance
from kvbench.core.config import (
    DEFAULT_PROTOCOL,
    PROTOCOLS,
    RECORDED_PROTOCOLS,
    Config,
    Protocol,
    protocol_by_option,
    protocol_of,
)
from kvbench.core.errors import BadInput, KvbenchWarning, ModelNotFound
from kvbench.core.validation import as_path, parse_int
from kvbench.harness.evaluation import run_evaluator
from kvbench.harness.planning import (
    check_configs,
    check_learned_state,
    configs_for_run,
    configs_for_sweep,
    key_by_learned_state,
    plan_tasks,
    task_lengths,
)
from kvbench.presses import press_of
from kvbench.store.results import ResultsStore, Row, check_writable, config_id_of
from kvbench.tasks import (
    Sample,
    check_combinable,
    check_data,
    jsonl,
    load_combined_samples,
    load_samples,
    reads_data_dir,
    score_sample,
    sized_by_tokenizer,
    user_metrics,
)

if TYPE_CHECKING:  # pandas is imported where frames are made: its import takes a second or two
    import pandas as pd


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
    model: str = models.EMBEDDED  # as the user named it: what rows record (`models.model_name`)
    device: str = "cpu"
    dtype: str = "float32"
    lengths: dict[str, int] = field(default_factory=dict)  # per task, where it differs from `length`
    tokenizer: str | None = None  # what sizes the samples, as the user named it; None: the model's own
    out: Path = Path("results")  # the results folder
    # Users' metrics (target -> target), registered again by Ray workers, which score. (The configs carry
    # their presses resolved: a user's press travels with them, `ResolvedPress`.)
    user_metrics: dict[str, str] = field(default_factory=dict)
    # Protocols the configs name that are not kvbench's own (plugins', registered): registered by workers.
    user_protocols: dict[str, Protocol] = field(default_factory=dict)
    data_tasks: dict[str, dict] = field(default_factory=dict)  # the user's data tasks: `data_task_record`
    # Every unit of the plan, where `held_plan` found all their rows held: the run reads them back without
    # making the samples a second time.
    held_units: list[Unit] | None = field(default=None, repr=False)

    def task_length(self, task: str) -> int | None:
        return self.lengths.get(task, self.length)


@dataclass(frozen=True)
class Unit:
    """One piece of work: one sample under some configs (at most the plan's `batch_configs`), computed
    together: the configs that compress inside kvpress's hook share one prefill and one batched decoding."""

    sample: Sample
    configs: tuple[Config, ...]


class Executor(typing.Protocol):
    """Computes units away from the process that plans and writes them (ray_sweep.RayExecutor)."""

    def start(self) -> int:
        """Check that it can serve a plan (e.g. reach its cluster), before the model loads; its workers."""
        ...

    def __call__(self, units: list[Unit], plan: Plan) -> Iterator[list[Row]]:
        """The scored rows of each unit (`evaluate_unit`'s), yielded as each is ready, in any order."""
        ...


def run(
    press,
    ratio: float | str | None = None,
    *,
    memory: float | str | None = None,
    budget: int | str | None = None,
    press_args: dict | None = None,
    protocol: str = DEFAULT_PROTOCOL,
    **setup,
) -> pd.DataFrame:
    """Score one press at one compression ratio (fraction of KV entries removed), memory budget (fraction
    of the 16-bit full cache) or absolute budget (KV entries kept per head) on a suite or tasks; the rows of
    this run, as `kvbench run` scores them. `setup`: the protocol's argument by its option name
    (`interval`, `chunk`, `questions`, `turns`: `config.protocol_by_option`) and the keywords of
    `prepare_plan` (tasks, suite, length, samples, out, model, ...)."""
    protocol_args = {name: setup.pop(name, None) for name in protocol_by_option()}
    configs = configs_for_run(press, ratio, memory, press_args, protocol, budget, **protocol_args)
    return run_configs(configs, **setup)


def sweep(
    presses,
    ratios: Sequence[float | str] | str | None = None,
    *,
    memory: Sequence[float | str] | str | None = None,
    budget: Sequence[int | str] | str | int | None = None,
    protocol: str = DEFAULT_PROTOCOL,
    press_args: dict | None = None,
    **setup,
) -> pd.DataFrame:
    """Score every press at every ratio (or memory budget, or absolute budget), plus no compression, as
    `kvbench sweep` does; the rows of this sweep. `presses`: names, users' presses, or a mapping name ->
    press (`planning.press_names`). `press_args` go to every press but `none` (`PRESS.KEY` to one).
    `setup`: the protocol's argument by its option name, and the keywords of `prepare_plan`."""
    protocol_args = {name: setup.pop(name, None) for name in protocol_by_option()}
    configs = configs_for_sweep(presses, ratios, memory, protocol, press_args, budget, **protocol_args)
    return run_configs(configs, **setup)


def run_configs(
    configs: list[Config], *, progress: bool = True, executor: Executor | None = None, **setup
) -> pd.DataFrame:
    """Score `configs` on a suite (default ruler-smoke) or `tasks`, appending what `out` lacks; the rows of
    this run, computed here or by `executor`. `setup`: the keywords of `prepare_plan`."""
    plan, llm, tokenizer = prepare_plan(configs, executor=executor, **setup)
    with ResultsStore(plan.out) as store:
        return run_plan(llm, tokenizer, plan, store, progress=progress, executor=executor)


def prepare_plan(
    configs: list[Config],
    *,
    tasks: Sequence[str] = (),
    suite: str | None = None,
    length: int | None = None,
    samples: int | None = None,
    seed: int = 0,
    data: Sequence[str | Path] | str | Path = (),
    metric: str | None = None,
    include_path: Sequence[str | Path] | str | Path = (),
    data_dir: Path | str | None = None,
    out: Path | str = "results",
    force: bool = False,
    batch_configs: int = 16,
    model: str = models.EMBEDDED,
    device: str = "cpu",
    dtype: str = "float32",
    tokenizer: str | None = None,
    executor: Executor | None = None,
):
    """(plan, model, tokenizer): everything checked before the model loads, cheap checks first (names,
    numbers, files, the device, the lengths against the model's context: no torch yet), then the press
    arguments, the model loaded and the configs keyed by their presses' learned state (errors are one-line
    KvbenchErrors). `force` recomputes rows `out` already holds. When `out` already holds every row of the
    plan, the model is None and the tokenizer is read from its files (`held_plan`).

    `tokenizer` (else the suite's `tokenizer:`) names what sizes and generates the samples instead of the
    model's tokenizer (a hub id, a folder or the embedded alias; `models.resolve_tokenizer`): loaded before
    the model, refused where no task of the plan is sized by a tokenizer (`tasks.sized_by_tokenizer`). The
    model still reads the samples with its own.

    With an `executor`, `device` is its workers' (checked by them): it is started before the model loads,
    and the model loads here on the CPU, only to plan (context lengths, learned state)."""
    configs = [replace(config, resolved=press_of(config)) for config in configs]  # a worker's too
    task_plan = plan_tasks(suite, tasks, length, samples, data, metric, include_path, tokenizer)
    if task_plan.tokenizer is not None and not any(sized_by_tokenizer(name) for name in task_plan.tasks):
        raise BadInput(
            f"--tokenizer sizes the samples of tasks cut or filled to a length in tokens; none of "
            f"{', '.join(task_plan.tasks)} is"
        )
    data_dir = as_path(data_dir, "data_dir") if data_dir is not None else None
    out = as_path(out, "out")
    if data_dir is not None and not data_dir.is_dir():
        raise BadInput(f"--data-dir {str(data_dir)!r} is not a folder")
    if data_dir is not None and not any(reads_data_dir(name) for name in task_plan.tasks):
        raise BadInput(
            "--data-dir applies to tasks that read local files (LongBench, RULER's qa_1 and qa_2); "
            f"none of {', '.join(task_plan.tasks)} does (your own files: --data)"
        )
    for name in task_plan.tasks:  # local data files are read now: a malformed line fails before the model
        check_data(name, data_dir)
    seed = parse_int(seed, "--seed")
    batch_configs = parse_int(batch_configs, "--batch-configs", 1)
    if dtype not in models.DTYPES:
        raise BadInput(f"unknown dtype {dtype!r}: choose one of {', '.join(models.DTYPES)}")
    check_writable(Path(out))
    if executor is None:
        models.check_device(device)
    models.check_model(model)  # a GGUF converts later, once; a cache that cannot take it is refused now
    if task_plan.tokenizer not in (None, models.EMBEDDED):
        models.resolve_tokenizer(task_plan.tokenizer)
    limit = models.context_limit(model)
    names, asked = task_plan.tasks, task_plan.length
    lengths = task_lengths(names, asked, limit, model) if limit is not None or asked is not None else None
    if lengths is not None:
        check_lengths(configs, lengths)
    plan = Plan(  # its configs keyed by learned state, and its lengths, below
        configs=configs,
        tasks=names,
        length=asked,
        samples=task_plan.samples,
        seed=seed,
        suite=task_plan.suite,
        data_dir=data_dir,
        batch_configs=batch_configs,
        force=force,
        model=model,
        device=device,
        dtype=dtype,
        out=Path(out),
        user_metrics=user_metrics(),
        user_protocols={
            c.protocol: PROTOCOLS[c.protocol] for c in configs if c.protocol not in RECORDED_PROTOCOLS
        },
        data_tasks={name: data_task_record(name) for name in names if name in jsonl.DATA_TASKS},
        tokenizer=task_plan.tokenizer,
    )
    if not force and lengths is not None and (held := held_plan(plan, lengths)) is not None:
        return held
    if plan.tokenizer is not None:
        sizing_tokenizer(plan.tokenizer)  # one that does not load fails here, before the model
    presses = check_configs(configs, task_plan.length)  # bad press arguments fail here; imports torch
    models.resolve(model)
    check_learned_state(presses, model)  # agents for another model fail here, not after the model loads
    if executor is not None:
        executor.start()  # e.g. a Ray cluster joined (or started) and checked before the model loads
    # The engine switches to eager attention itself for the configs that need attention weights.
    llm, tokenizer = models.load_model(model, device="cpu" if executor else device, dtype=dtype)
    if lengths is None:  # a hub model whose config was not at hand: its context is known now
        lengths = task_lengths(names, asked, llm.config.get_text_config().max_position_embeddings, model)
        check_lengths(configs, lengths)
    configs = key_by_learned_state(llm, configs, presses)
    return replace(plan, configs=configs, lengths=lengths_apart(lengths, asked)), llm, tokenizer


@functools.cache
def sizing_tokenizer(name: str):
    """The tokenizer a plan names to size its samples (`Plan.tokenizer`), loaded once per process: it only
    counts and cuts tokens, nothing changes it (`models.load_tokenizer_only`)."""
    return models.load_tokenizer_only(name)


def data_task_record(name: str) -> dict:
    """What a run record says of a user's data task: its file or folder, the file's sha256, its metric, the
    fields and templates it reads records with."""
    import hashlib

    task = jsonl.DATA_TASKS[name]
    digest = hashlib.sha256(task.path.read_bytes()).hexdigest() if task.path.is_file() else None
    return {
        "path": str(task.path),
        **({"sha256": digest} if digest else {}),
        "metric": task.metric,
        **({"fields": dict(task.fields)} if task.fields else {}),
        **({"templates": dict(task.templates)} if task.templates else {}),
    }


def press_sources(configs: list[Config]) -> dict[str, dict]:
    """The users' presses `configs` run, as press or as the `inner` press they name: name -> where it comes
    from (`registry.Source`)."""
    sources = {}
    for config in configs:
        resolved = press_of(config)
        while resolved is not None:
            if resolved.spec.source is not None:
                sources[resolved.spec.name] = resolved.spec.source.as_dict()
            resolved = resolved.inner
    return sources


def lengths_apart(lengths: dict[str, int], asked: int | None) -> dict[str, int]:
    """The tasks' lengths that differ from the one asked for (Plan.lengths)."""
    return {name: value for name, value in lengths.items() if value != asked}


def held_plan(plan: Plan, lengths: dict[str, int]) -> tuple[Plan, None, object] | None:
    """(plan, None, tokenizer) when `plan.out` already holds every row of the plan, else None: a rerun with
    nothing to compute loads no model and imports no kvpress (measured: a cached `kvbench run` took 11-15 s,
    nearly all of it importing kvpress, transformers and torch to build presses and load the model).

    The rows' keys need the samples, sized by the tokenizer: read here from its files without transformers
    (`models.TokenizerFiles`: importing transformers, and torch with it, took 10 of the 14 s left), and the
    learned presses' state digests, read from their files (`ResolvedPress.state_from_files`). A press whose
    files are missing, a tokenizer those files do not give, or a folder without rows takes the full path,
    whose checks say what is wrong. The press arguments are not checked here: rows exist only for configs that
    were built. The tokenizer returned is that reader: it gave the samples whose rows are held, so run_plan
    finds them again with it."""
    if not plan.out.is_dir():
        return None
    try:
        configs = [
            replace(config, press_state=press_of(config).state_from_files(plan.model))
            for config in plan.configs
        ]
    except LookupError:
        return None
    plan = replace(plan, configs=configs, lengths=lengths_apart(lengths, plan.length))
    try:
        tokenizer = models.TokenizerFiles.open(plan.tokenizer or plan.model)
    except ModelNotFound:  # a hub tokenizer whose files transformers finds (without a config.json)
        return None
    if tokenizer is None:
        return None
    try:
        units = plan_units(plan, plan_samples(plan, tokenizer))
    except Exception:  # e.g. a template this renderer lacks a function for: the full path says what is wrong
        return None
    with warnings.catch_warnings():  # a look: the store that the run opens next says what it skips
        warnings.simplefilter("ignore", KvbenchWarning)
        store = ResultsStore(plan.out, read_only=True)
    if all(store.is_done(row) for unit in units for row in unit_rows(plan, unit)):
        return replace(plan, held_units=units), None, tokenizer
    return None


def questions_per_context(configs: list[Config]) -> int | None:
    """How many questions each context of a plan carries under its multi-question or multi-turn configs
    (a plan's configs must agree: they share its samples); None for the one-question protocols."""
    counts = {
        dict(c.protocol_args)[protocol_of(c).option] if protocol_of(c).several_questions else None
        for c in configs
    }
    if len(counts) > 1:
        raise BadInput("configs of one run must ask the same number of questions per context")
    return counts.pop() if counts else None


def questions_asked(config: Config, sample: Sample) -> list[Sample]:
    """The samples whose questions `config` answers of `sample`'s context: its parts under the
    multi-question protocols, else the sample itself."""
    return sample.questions() if protocol_of(config).several_questions else [sample]


def check_lengths(configs: list[Config], lengths: dict[str, int]) -> None:
    """Fail before any work if an absolute budget keeps every entry of a task's context, or if the tasks
    cannot share the contexts of a multi-question protocol."""
    for config in configs:
        for task, length in lengths.items():
            if config.budget is not None and config.budget >= length:
                raise BadInput(
                    f"--budget {config.budget} is not below the {length}-token context of task {task!r}: "
                    "nothing would be evicted"
                )
    questions = questions_per_context(configs)
    if questions is not None:
        turns = any(protocol_of(config).answers_stay for config in configs)
        check_combinable(list(lengths), max(lengths.values()), questions, turns=turns)


def plan_samples(plan: Plan, tokenizer) -> list[Sample]:
    """Every sample of the plan, task by task, sized with `tokenizer` (the plan's `tokenizer` when it names
    one, else the model's); under the multi-question protocols, contexts combining K samples of the plan's
    tasks (`load_combined_samples`)."""
    questions = questions_per_context(plan.configs)
    if questions is not None:
        return load_combined_samples(
            plan.tasks,
            length=plan.task_length(plan.tasks[0]),
            samples=plan.samples,
            questions=questions,
            seed=plan.seed,
            tokenizer=tokenizer,
            data_dir=plan.data_dir,
        )
    return [
        sample
        for task in plan.tasks
        for sample in load_samples(
            task,
            length=plan.task_length(task),
            samples=plan.samples,
            seed=plan.seed,
            tokenizer=tokenizer,
            data_dir=plan.data_dir,
        )
    ]


def plan_units(plan: Plan, samples: list[Sample]) -> list[Unit]:
    """Each sample under the plan's configs, `batch_configs` at a time."""
    step = plan.batch_configs
    return [
        Unit(sample, tuple(plan.configs[start : start + step]))
        for sample in samples
        for start in range(0, len(plan.configs), step)
    ]


def unit_rows(plan: Plan, unit: Unit) -> list[Row]:
    """The rows of a unit before scoring: which config on which sample (and its content), one per config
    and question. A question of a multi-question context is a row of its own task, with sample id
    "<context id>/<j>" and meta {"question" (or "turn"): j, "context": the context's id, "part": the
    sample's own id}."""
    sample, content = unit.sample, unit.sample.content_hash()
    rows = []
    for config in unit.configs:
        identity = config_id_of(plan.model, config)
        for j, part in enumerate(questions_asked(config, sample)):
            several = protocol_of(config).several_questions
            place = {"turn" if protocol_of(config).answers_stay else "question": j, "context": sample.id}
            place["part"] = part.id  # the sample's own id, as a one-question run of its task names it
            rows.append(
                Row(
                    config_id=identity,
                    model=plan.model,
                    press=config.press,
                    ratio=config.ratio,
                    task=part.task,
                    length=plan.task_length(part.task),
                    seed=plan.seed,
                    sample_id=f"{sample.id}/{j}" if several else sample.id,
                    press_args=dict(config.press_args),
                    press_state=config.press_state,
                    press_source=press_source(config),
                    memory=config.memory,
                    budget=config.budget,
                    protocol=config.protocol,
                    protocol_args=dict(config.protocol_args),
                    content_hash=content,
                    question=part.question,
                    answer_prefix=part.answer_prefix,
                    references=list(part.references),
                    meta={**part.meta, **place} if several else part.meta,
                )
            )
    return rows


def press_source(config: Config) -> dict | None:
    """Where a config's press comes from if it is a user's (`registry.Source`), as its rows record it; None
    for kvbench's."""
    source = press_of(config).spec.source
    return source.as_dict() if source is not None else None


def evaluate_sample(
    model, tokenizer, sample: Sample, configs: list[Config], *, batch_configs: int
) -> list[dict]:
    """The engine's (kvbench.engine.evaluate_sample: one dict per config and question), imported when a
    model first runs: planning, claiming and writing rows need no torch."""
    from kvbench import engine

    return engine.evaluate_sample(model, tokenizer, sample, configs, batch_configs=batch_configs)


def evaluate_unit(model, tokenizer, unit: Unit, plan: Plan) -> list[Row]:
    """The scored rows of `unit`, one per config in order; writes nothing. The model must be the plan's
    (`models.load_model(plan.model, ...)`)."""
    outputs = evaluate_sample(
        model, tokenizer, unit.sample, list(unit.configs), batch_configs=plan.batch_configs
    )
    parts = [part for config in unit.configs for part in questions_asked(config, unit.sample)]
    return [
        replace(row, **output, score=score_sample(part, output["prediction"]))
        for row, output, part in zip(unit_rows(plan, unit), outputs, parts, strict=True)
    ]


def run_plan(
    model,
    tokenizer,
    plan: Plan,
    store: ResultsStore,
    progress: bool = True,
    executor: Executor | None = None,
) -> pd.DataFrame:
    """Evaluate what `store` lacks, appending each row once scored; return all rows of this plan
    (`evaluation.run_evaluator`, with `QAEvaluator`).

    The units are computed here one at a time, or by `executor`, which is handed every unit this writer
    can claim at once; either way this process alone claims and writes their rows. `tokenizer` is the
    model's (or, without a model, what sized the held rows' samples)."""
    if model is not None and models.model_name(model) != plan.model:  # None: every row is held
        raise ValueError(f"the plan is for model {plan.model!r}, not {models.model_name(model)!r}")
    return run_evaluator(QAEvaluator(model, tokenizer, plan, executor), store, progress)


@dataclass
class QAEvaluator:
    """Questions answered on a compressed cache and scored by each task's metric (`evaluation.Evaluator`):
    a unit is one sample under some configs, sharing one prefill."""

    model: object
    tokenizer: object
    plan: Plan
    executor: Executor | None = None

    @property
    def force(self) -> bool:
        return self.plan.force

    @property
    def all_at_once(self) -> bool:
        return self.executor is not None

    def units(self) -> list[Unit]:
        """Sized with the plan's own tokenizer when it names one (`sizing_tokenizer`); without a model
        (every row held), the units `held_plan` made with `tokenizer`."""
        if self.model is None and self.plan.held_units is not None:
            return self.plan.held_units
        sizer = self.tokenizer
        if self.model is not None and self.plan.tokenizer is not None:
            sizer = sizing_tokenizer(self.plan.tokenizer)
        return plan_units(self.plan, plan_samples(self.plan, sizer))

    def unit_rows(self, unit: Unit) -> list[Row]:
        return unit_rows(self.plan, unit)

    def claimed_part(self, unit: Unit, claimed: set[tuple]) -> Unit | None:
        """A config's rows (one per question) are computed together: any of them claimed."""
        configs = tuple(
            config
            for config in unit.configs
            if any(row.key in claimed for row in unit_rows(self.plan, Unit(unit.sample, (config,))))
        )
        return Unit(unit.sample, configs) if configs else None

    def evaluate(self, units: list[Unit]) -> Iterable[list[Row]]:
        if self.executor is not None:
            return self.executor(units, self.plan)
        return (evaluate_unit(self.model, self.tokenizer, unit, self.plan) for unit in units)

    def run_record(self, frame: pd.DataFrame | None, started: str) -> dict:
        return run_record(self.plan, frame, started)


# What a config may be given beside its ratio (Row's memory and budget), in the summary's column order.
BUDGET_COLUMNS = ("memory", "budget")


def summarize(frame: pd.DataFrame) -> pd.DataFrame:
    """Mean score per task (columns) and their average, one line per config. The index says what each config
    was given, one labelled column each: `ratio` (fraction of KV entries removed), then `memory` and
    `budget` (BUDGET_COLUMNS) when some config of the frame was given one ("-" for those that were not).
    `none` comes first, then the presses in the order the frame holds them, each from its least compressed
    config."""
    import pandas as pd

    if frame.empty:
        return pd.DataFrame()
    keys = ["press", "ratio"] + [
        name for name in BUDGET_COLUMNS if name in frame and frame[name].notna().any()
    ]
    shown = frame.assign(**{name: [setting_label(name, value) for value in frame[name]] for name in keys[1:]})
    table = shown.pivot_table(index=keys, columns="task", values="score", aggfunc="mean")
    table["average"] = table.mean(axis=1)
    first_seen = {press: index for index, press in enumerate(dict.fromkeys(shown["press"]))}

    def place(key: tuple) -> tuple:  # least compressed first: larger memory or budget, then smaller ratio
        settings = dict(zip(keys, key, strict=True))
        larger_first = [-float(settings[name]) for name in keys[2:] if settings[name] != "-"]
        return (key[0] != "none", first_seen[key[0]], *larger_first, float(settings["ratio"]))

    table = table.reindex(sorted(table.index, key=place))
    table.columns.name = None
    return table


def press_versions(frame: pd.DataFrame) -> list[str]:
    """Which version of each press the frame's rows show, one line each: a user's press by its file and
    sha256 (its source digest), a learned press by its state's digest; none for kvbench's other presses."""
    versions = []
    for press in dict.fromkeys(frame["press"]) if not frame.empty else ():
        mine = frame[frame["press"] == press]
        sources = [s for s in mine.get("press_source", ()) if isinstance(s, dict)]
        states = sorted({state for state in mine.get("press_state", ()) if isinstance(state, str) and state})
        if sources:
            source = sources[-1]
            where = source.get("file") or source.get("package") or source["target"]
            versions.append(f"{press}: {where}, sha256 {str(source.get('sha256') or '?')[:12]}")
        elif states:
            versions.append(f"{press}: learned state {', '.join(states)}")
    return versions


def setting_label(name: str, value) -> str:
    """A config's ratio, memory or budget as the summary shows it; "-" where it was not given."""
    if value is None or value != value:  # None or NaN
        return "-"
    return str(int(value)) if name == "budget" else str(float(value))


def run_record(plan: Plan, frame: pd.DataFrame | None, started: str) -> dict:
    """The run's full config, versions and commit; with `frame`, its scores and finish time too."""
    table = summarize(frame) if frame is not None else None
    config = {
        "model": plan.model,
        "configs": [config.as_record() for config in plan.configs],
        **({"press_sources": sources} if (sources := press_sources(plan.configs)) else {}),
        "tasks": plan.tasks,
        "suite": plan.suite,
        "length": plan.length,
        **({"lengths": plan.lengths} if plan.lengths else {}),
        "samples": plan.samples,
        "seed": plan.seed,
        "data_dir": str(plan.data_dir) if plan.data_dir else None,
        **({"data_tasks": plan.data_tasks} if plan.data_tasks else {}),
        **({"tokenizer": plan.tokenizer} if plan.tokenizer else {}),
        "device": plan.device,
        "dtype": plan.dtype,
    }
    summary = {
        config_key(dict(zip(table.index.names, key, strict=True))): {
            task: round(score, 2) for task, score in scores.items()
        }
        for key, scores in (table.iterrows() if table is not None else ())
    }
    return provenance.run_record(config, summary, plan.device, started, finished=frame is not None)


def config_key(settings: dict[str, str]) -> str:
    """A run record's name for a summary line: "knorm@0.5", "quant@memory=0.25", "kvp@budget=128"."""
    given = [f"{name}={settings[name]}" for name in BUDGET_COLUMNS if settings.get(name, "-") != "-"]
    return f"{settings['press']}@{given[0] if given else settings['ratio']}"
