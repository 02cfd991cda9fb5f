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

import sys
import time
from collections.abc import Iterable
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Protocol

from tqdm.auto import tqdm

from kvbench.store.results import SAMPLE_FIELDS, ResultsStore, Row, load_rows

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


def run_evaluator(evaluator: Evaluator, store: ResultsStore, progress: bool = True) -> pd.DataFrame:
    """Compute what `store` lacks of `evaluator`'s units, appending each row once scored; all rows of
    these units, as the store holds them."""
    started = datetime.now(timezone.utc).isoformat()
    units = evaluator.units()
    rows_of = [evaluator.unit_rows(unit) for unit in units]
    record_path = store.write_run(evaluator.run_record(None, started))
    step = len(units) if evaluator.all_at_once else 1
    counted: set[tuple] = set()  # keys of the rows the bar counts as done
    total = sum(len(rows) for rows in rows_of)
    with tqdm(total=total, desc="rows", unit="row", disable=not progress, file=sys.stderr) as bar:

        def count_done(rows: Iterable[Row]) -> None:
            done = {row.key for row in rows if store.is_done(row, evaluator.force)} - counted
            counted.update(done)
            bar.update(len(done))

        pending = list(range(len(units)))
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
                for index in batch:
                    count_done(rows_of[index])
                    if any(row.key not in counted for row in rows_of[index]):  # claimed by another writer
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
