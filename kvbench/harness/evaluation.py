"""One runner for every evaluator: what a results folder lacks, computed once, resumably, beside others.

An evaluator says what its work is and how to do it (`Evaluator`: QA in kvbench.harness.runner, live-cache
perplexity in kvbench.harness.perplexity); `run_evaluator` does the rest the same way for each. It writes
the run record first (so a killed run still says what it asked for), claims each unit's rows in the store
(`ResultsStore.claim`), has the evaluator compute only the configs with a claimed row, appends each row once
scored, waits for the units another live writer of the folder claimed (polled every `CLAIM_POLL_S`; should
that writer die, its claims lapse and this one computes them), and rewrites the run record with the scores.
A new evaluator is one module: a class with the five members of `Evaluator`.
"""

from __future__ import annotations

import json
import sys
import time
import warnings
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Protocol

from tqdm.auto import tqdm

from kvbench.store.results import SAMPLE_FIELDS, ResultsStore, Row, load_rows, rows_files

if TYPE_CHECKING:
    import pandas as pd

CLAIM_POLL_S = 1.0  # how often a writer looks again at units another writer is computing


class Evaluator(Protocol):
    """What `run_evaluator` needs of an evaluator. A unit is whatever the evaluator computes at once (one
    sample or text under some configs); its rows are one per config (and question), unscored, keyed as the
    store keys them. `all_at_once`: hand every claimable unit to `evaluate` in one call (an executor
    spreading them over workers) rather than one at a time. `force`: recompute rows already held."""

    force: bool
    all_at_once: bool

    def units(self) -> list[Any]: ...

    def unit_rows(self, unit: Any) -> list[Row]: ...

    def claimed_part(self, unit: Any, claimed: set[tuple]) -> Any | None:
        """The unit cut to the configs that have a claimed row; None when it has none."""
        ...

    def evaluate(self, units: list[Any]) -> Iterable[list[Row]]:
        """The scored rows of each unit, in order."""
        ...

    def run_record(self, frame: pd.DataFrame | None, started: str) -> dict:
        """The run record: the full config, versions and commit; with `frame`, its results too."""
        ...


def config_settings(row: Row) -> tuple:
    """A row's config without the digest of its press's state or source: what an edit to the press keeps."""
    return (row.model, row.press, json.dumps(row.press_args, sort_keys=True, default=str), row.ratio)


def why_computed(rows: list[Row], store: ResultsStore, force: bool) -> list[str]:
    """Why each row of `rows` (those `store` lacks) is computed: --force; changed samples (the store holds
    the sample under other content: its data edited); new samples of a config the store holds; an edited
    press (the store holds its config under another source or learned state); a new config."""
    samples, configs, settings = set(), set(), set()
    if rows and rows_files(store.folder):
        with warnings.catch_warnings():  # the store said what it skipped when it opened
            warnings.simplefilter("ignore")
            held = load_rows(rows_files(store.folder))
        samples = set(zip(*(held[name] for name in SAMPLE_FIELDS), strict=True))
        configs = set(held["config_id"])
        settings = {
            (model, press, json.dumps(args, sort_keys=True, default=str), ratio)
            for model, press, args, ratio in zip(
                held["model"], held["press"], held["press_args"], held["ratio"], strict=True
            )
        }
    return [
        "--force"
        if force
        else "changed samples"
        if row.sample_key in samples
        else "new samples"
        if row.config_id in configs
        else "edited press"
        if config_settings(row) in settings
        else "new config"
        for row in rows
    ]


def resume_line(rows: int, todo: list[Row], store: ResultsStore, force: bool) -> str:
    """What a run will do, said before it starts: the rows it reuses and those it computes, and why."""
    reasons = why_computed(todo, store, force)
    counts = Counter(reasons)
    why = ", ".join(f"{count} {reason}" for reason, count in counts.items())
    edited = sorted(
        {row.press for row, reason in zip(todo, reasons, strict=True) if reason == "edited press"}
    )
    return (
        f"{rows - len(todo)} of {rows} rows reused from {store.folder}, {len(todo)} to compute"
        + (f" ({why})" if why else "")
        + (f"; edited since their rows were written: {', '.join(sorted(edited))}" if edited else "")
    )


REFERENCE_PRESS = "none"  # the uncompressed reference every sweep runs
FIRST_SAMPLES = 5  # the uncompressed rows a run looks at before it says where they sit
FLOOR, CEILING = 20.0, 95.0  # mean scores at or past these leave presses little to separate


@dataclass
class ReferenceCheck:
    """Says once, after the first uncompressed rows a run scores (`FIRST_SAMPLES`, or all it has when
    fewer), when those samples cannot separate the presses; the run goes on. Near the floor, the
    uncompressed score leaves compressed presses nothing to lose. Near the ceiling it is the reference a
    compression benchmark wants, unless every compressed config scored on the same samples sits there too."""

    expected: int  # the uncompressed rows the run computes
    reference: list[tuple[str, str, float]] = field(default_factory=list)  # (task, sample id, score)
    compressed: dict[str, list[float]] = field(default_factory=dict)  # config id -> scores on those samples
    said: bool = False

    def line(self, rows: list[Row]) -> str | None:
        if self.said:
            return None
        needed = min(FIRST_SAMPLES, self.expected)
        scored = [row for row in rows if row.score is not None]
        for row in scored:
            if row.press == REFERENCE_PRESS and len(self.reference) < needed:
                self.reference.append((row.task, row.sample_id, row.score))
        samples = {(task, sample) for task, sample, _ in self.reference}
        for row in scored:
            if row.press != REFERENCE_PRESS and (row.task, row.sample_id) in samples:
                self.compressed.setdefault(row.config_id, []).append(row.score)
        if not needed or len(self.reference) < needed:
            return None
        mean = sum(score for _, _, score in self.reference) / len(self.reference)
        if CEILING > mean > FLOOR:
            self.said = True
            return None
        if mean >= CEILING and not self.compressed:
            return None  # no compressed row of these samples yet, or none in this run
        self.said = True
        tasks = ", ".join(sorted({task for task, _, _ in self.reference}))
        where = f"on its first {len(self.reference)} samples ({tasks})"
        probe = "probe a task with kvbench run --press none --ratio 0; going on"
        if mean <= FLOOR:
            return (
                f"note: uncompressed (none) scores {mean:.1f} {where}, near the floor: compressed presses "
                f"have little room to differ here ({probe})"
            )
        lowest = min(sum(scores) / len(scores) for scores in self.compressed.values())
        if lowest < CEILING:
            return None
        return (
            f"note: uncompressed (none) scores {mean:.1f} {where} and every compressed config at least "
            f"{lowest:.1f}, near the ceiling: these samples do not separate the presses ({probe})"
        )


def run_evaluator(evaluator: Evaluator, store: ResultsStore, progress: bool = True) -> pd.DataFrame:
    """Compute what `store` lacks of `evaluator`'s units, appending each row once scored; all rows of
    these units, as the store holds them. With `progress`, says first what it reuses and what it computes
    and why (`resume_line`), and counts on its bar only the rows it computes."""
    started = datetime.now(timezone.utc).isoformat()
    units = evaluator.units()
    rows_of = [evaluator.unit_rows(unit) for unit in units]
    record_path = store.write_run(evaluator.run_record(None, started))
    step = len(units) if evaluator.all_at_once else 1
    every = [row for rows in rows_of for row in rows]
    todo = [row for row in every if not store.is_done(row, evaluator.force)]
    if progress:
        print(resume_line(len(every), todo, store, evaluator.force), file=sys.stderr)
    uncounted = {row.key for row in todo}  # keys of the rows the bar counts, until they are done
    reference = ReferenceCheck(sum(row.press == REFERENCE_PRESS for row in todo))
    with tqdm(total=len(uncounted), desc="rows", unit="row", disable=not progress, file=sys.stderr) as bar:

        def count_done(rows: Iterable[Row]) -> None:
            done = {row.key for row in rows if row.key in uncounted and store.is_done(row, evaluator.force)}
            uncounted.difference_update(done)
            bar.update(len(done))

        pending = [index for index, rows in enumerate(rows_of) if any(row.key in uncounted for row in rows)]
        while pending:
            waiting = []
            for start in range(0, len(pending), max(step, 1)):
                batch = pending[start : start + max(step, 1)]
                claimed_rows = store.claim(
                    [row for index in batch for row in rows_of[index]], force=evaluator.force
                )
                claimed = {row.key for row in claimed_rows}
                work = [
                    part
                    for index in batch
                    if (part := evaluator.claimed_part(units[index], claimed)) is not None
                ]
                for scored in evaluator.evaluate(work) if work else ():
                    for row in scored:
                        if row.key in claimed:  # a question another run wrote already is not written twice
                            store.append(row, force=evaluator.force)
                    count_done(scored)
                    bar.set_postfix_str(scored[0].task)
                    if progress and (line := reference.line(scored)):
                        bar.write(line, file=sys.stderr)
                for index in batch:
                    count_done(rows_of[index])
                    if any(row.key in uncounted for row in rows_of[index]):  # claimed by another writer
                        waiting.append(index)
            store.release()
            if waiting:
                time.sleep(CLAIM_POLL_S)
            pending = waiting
    wanted = {row.sample_key for rows in rows_of for row in rows}
    frame = load_rows([store.rows_path])
    frame = frame[[key in wanted for key in zip(*(frame[name] for name in SAMPLE_FIELDS), strict=True)]]
    store.write_run(evaluator.run_record(frame, started), path=record_path)
    return frame.reset_index(drop=True)
