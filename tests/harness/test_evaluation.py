"""The one runner (kvbench.harness.evaluation) with an evaluator written here in a few lines: what a
results folder lacks is computed once, a rerun computes nothing, --force everything, and rows another live
writer claimed are waited for, not computed twice."""

import threading
import time
from dataclasses import dataclass, field, replace

import pytest

from kvbench.harness.evaluation import run_evaluator
from kvbench.store.results import ResultsStore, Row, load_runs


@dataclass
class WordLength:
    """An evaluator: each word (a unit) under configs "a" and "b", scored by its length."""

    words: list[str]
    force: bool = False
    all_at_once: bool = False
    computed: list[tuple[str, str]] = field(default_factory=list)

    def units(self):
        return [(word, ("a", "b")) for word in self.words]

    def unit_rows(self, unit):
        word, configs = unit
        return [Row(config, "m", "p", 0.5, "words", 1, 0, word, content_hash=word) for config in configs]

    def claimed_part(self, unit, claimed):
        configs = tuple(row.config_id for row in self.unit_rows(unit) if row.key in claimed)
        return (unit[0], configs) if configs else None

    def evaluate(self, units):
        for unit in units:
            self.computed += [(unit[0], config) for config in unit[1]]
            yield [replace(row, score=float(len(unit[0]))) for row in self.unit_rows(unit)]

    def run_record(self, frame, started):
        return {"command": "test", "config": {"model": "m"}, "done": frame is not None}


def test_what_the_folder_lacks_is_computed_once(tmp_path):
    first = WordLength(["ab", "abc"])
    with ResultsStore(tmp_path) as store:
        frame = run_evaluator(first, store, progress=False)
    assert sorted(first.computed) == [("ab", "a"), ("ab", "b"), ("abc", "a"), ("abc", "b")]
    assert sorted(zip(frame["sample_id"], frame["score"], strict=True)) == [
        ("ab", 2.0),
        ("ab", 2.0),
        ("abc", 3.0),
        ("abc", 3.0),
    ]
    again = WordLength(["ab", "abc", "abcd"])
    with ResultsStore(tmp_path) as store:
        frame = run_evaluator(again, store, progress=False)
    assert again.computed == [("abcd", "a"), ("abcd", "b")] and len(frame) == 6
    forced = WordLength(["ab"], force=True)
    with ResultsStore(tmp_path) as store:
        run_evaluator(forced, store, progress=False)
    assert forced.computed == [("ab", "a"), ("ab", "b")]
    assert [record["done"] for record in load_runs([tmp_path])].count(True) == 3  # each record rewritten


def test_rows_another_live_writer_claimed_are_waited_for(tmp_path):
    mine = WordLength(["ab", "xyz"])
    theirs = [replace(row, score=99.0) for row in mine.unit_rows(("xyz", ("a", "b")))]
    with ResultsStore(tmp_path) as other, ResultsStore(tmp_path) as store:
        assert other.claim(theirs) == theirs

        def write_later():
            time.sleep(1.5)
            for row in theirs:
                other.append(row)
            other.release()

        writer = threading.Thread(target=write_later)
        writer.start()
        frame = run_evaluator(mine, store, progress=False)
        writer.join()
    assert mine.computed == [("ab", "a"), ("ab", "b")]  # not xyz: the other writer's
    assert sorted(frame[frame["sample_id"] == "xyz"]["score"]) == [99.0, 99.0]


def test_a_resumed_run_says_what_it_reuses_and_counts_only_what_it_computes(tmp_path, capsys):
    with ResultsStore(tmp_path) as store:
        run_evaluator(WordLength(["ab", "abc"]), store, progress=False)
    with ResultsStore(tmp_path) as store:
        run_evaluator(WordLength(["ab", "abc", "abcd"]), store, progress=True)
    said = capsys.readouterr().err
    assert f"4 of 6 rows reused from {tmp_path}, 2 to compute (2 new samples)" in said
    assert "2/2" in said and "/6" not in said  # the bar counts the rows it computes
    changed = WordLength(["ab"])
    changed.unit_rows = lambda unit: [
        replace(row, content_hash="new") for row in WordLength.unit_rows(changed, unit)
    ]
    with ResultsStore(tmp_path) as store:
        run_evaluator(changed, store, progress=True)
    assert "0 of 2 rows reused" in (said := capsys.readouterr().err) and "(2 changed samples)" in said


@dataclass
class Uncompressed(WordLength):
    """Each word scored `score` by the uncompressed press (config "a") and `compressed` by a press at
    ratio 0.5 (config "b"); `alone`: the uncompressed config only."""

    score: float = 0.0
    compressed: float = 0.0
    alone: bool = False

    def unit_rows(self, unit):
        rows = super().unit_rows(unit)
        return [replace(rows[0], press="none", ratio=0.0)] + ([] if self.alone else rows[1:])

    def evaluate(self, units):
        for rows in super().evaluate(units):
            yield [replace(row, score=self.score if row.press == "none" else self.compressed) for row in rows]


@pytest.mark.parametrize(
    "score, compressed, alone, said",
    [
        (10.0, 0.0, False, "near the floor: compressed presses have little room to differ"),
        (10.0, 0.0, True, "near the floor: compressed presses have little room to differ"),
        (100.0, 96.0, False, "and every compressed config at least 96.0, near the ceiling: these samples do"),
        (100.0, 40.0, False, None),  # a full score the presses fall from: what a benchmark wants
        (100.0, 100.0, True, None),  # nothing compressed to compare
        (50.0, 50.0, False, None),
    ],
)
def test_samples_that_cannot_separate_the_presses_are_said_once_and_the_run_goes_on(
    tmp_path, capsys, score, compressed, alone, said
):
    evaluator = Uncompressed([f"w{i}" for i in range(6)], score=score, compressed=compressed, alone=alone)
    with ResultsStore(tmp_path) as store:
        frame = run_evaluator(evaluator, store, progress=True)
    err = capsys.readouterr().err
    assert len(frame) == (6 if alone else 12)  # it went on
    if said is None:
        assert "note:" not in err
    else:
        assert err.count("note:") == 1
        assert f"uncompressed (none) scores {score:.1f} on its first 5 samples (words)" in err
        assert said in err
