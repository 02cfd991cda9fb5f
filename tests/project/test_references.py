"""The committed reference folders (results/reference*/): rows stored as deterministic rows.jsonl.gz, each
folder loadable, and a resumed sweep on one appends plain rows beside the .gz without touching it."""

import dataclasses
import gzip
import json
import shutil
from pathlib import Path

import pytest

import kvbench
from kvbench.store.results import (
    REQUIRED_FIELDS,
    ROWS_GZ,
    SAMPLE_FIELDS,
    ResultsStore,
    compress_rows,
    load_rows,
    load_runs,
    read_rows,
    results_files,
)

RESULTS = Path(__file__).resolve().parents[2] / "results"
FOLDERS = sorted(path for path in RESULTS.glob("reference*") if path.is_dir())
SMALL = RESULTS / "reference-fifth-more"  # 224 rows, 12 KB


def test_there_are_reference_folders():
    assert len(FOLDERS) >= 20 and SMALL in FOLDERS


@pytest.mark.parametrize("folder", FOLDERS, ids=[folder.name for folder in FOLDERS])
def test_a_reference_folder_loads_from_its_deterministic_gzip(folder):
    data = (folder / "rows.jsonl.gz").read_bytes()
    assert not (
        folder / "rows.jsonl"
    ).exists()  # compressed whole: `python -m kvbench.store.results compress`
    assert data[:4] == b"\x1f\x8b\x08\x00" and data[4:8] == bytes(4)  # gzip, no name, mtime 0
    lines = gzip.decompress(data).count(b"\n")
    frame = kvbench.load_results(folder)
    assert 0.9 * lines < len(frame) <= lines  # a few rows rescored (--force), none lost
    assert set(REQUIRED_FIELDS) <= set(frame.columns)
    # What came out: a score, or a perplexity row's NLL (its score is empty by design).
    measured = frame["score"].where(frame["protocol"] != "perplexity", frame["nll"])
    assert frame[list(REQUIRED_FIELDS)].notna().all().all() and measured.notna().all()
    assert not frame.duplicated(subset=list(SAMPLE_FIELDS)).any()


def test_compressing_is_deterministic_and_keeps_every_byte(tmp_path):
    shutil.copytree(SMALL, tmp_path / "ref")
    compress_rows(tmp_path / "ref")
    assert (tmp_path / "ref" / "rows.jsonl.gz").read_bytes() == (SMALL / "rows.jsonl.gz").read_bytes()
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "rows.jsonl").write_bytes(gzip.decompress((SMALL / "rows.jsonl.gz").read_bytes()))
    compress_rows(tmp_path / "plain")
    assert not (tmp_path / "plain" / "rows.jsonl").exists()
    assert (tmp_path / "plain" / "rows.jsonl.gz").read_bytes() == (SMALL / "rows.jsonl.gz").read_bytes()


def test_a_resumed_reference_folder_appends_plain_rows_beside_its_gzip(tmp_path):
    folder = tmp_path / "ref"
    shutil.copytree(SMALL, folder)
    packed = (folder / "rows.jsonl.gz").read_bytes()
    old = read_rows(folder / "rows.jsonl.gz")
    first = old[0]
    rescored = dataclasses.replace(first, content_hash="abcdef012345", score=-1.0)  # its data changed
    new = dataclasses.replace(first, sample_id="new-sample", score=7.0)
    with ResultsStore(folder) as store:
        assert all(store.has(row) for row in old)  # the compressed rows count as done
        assert len(load_rows([store.rows_path])) == len(old)  # what a run that computed nothing returns
        assert store.claim([*old, rescored, new]) == [rescored, new]
        assert store.append(rescored) and store.append(new) and not store.append(first)
    (folder / "rows.jsonl").open("a").write('{"torn": ')  # a writer killed mid-line
    with ResultsStore(folder) as store:  # cuts the torn line of rows.jsonl only
        assert store.claim([*old, rescored, new]) == []
    assert (folder / "rows.jsonl.gz").read_bytes() == packed  # never rewritten
    plain = [json.loads(line) for line in (folder / "rows.jsonl").read_text().splitlines()]
    assert [(row["sample_id"], row["score"]) for row in plain] == [
        (first.sample_id, -1.0),
        ("new-sample", 7.0),
    ]
    assert results_files([folder]) == [folder / "rows.jsonl.gz"]  # one entry per folder
    assert results_files([tmp_path]) == [folder / "rows.jsonl.gz"]
    assert len(load_runs([folder])) == len(list((SMALL / "runs").glob("*.json")))
    frame = kvbench.load_results(folder)
    assert len(frame) == len(old) + 1
    mine = frame[frame[list(SAMPLE_FIELDS)].apply(tuple, axis=1) == first.sample_key]
    assert mine.score.tolist() == [-1.0]  # the row written last wins
    compress_rows(folder)  # folds the appended rows in
    assert not (folder / "rows.jsonl").exists() and kvbench.load_results(folder).equals(frame)


@pytest.mark.parametrize("damage", ["torn", "foreign"])
def test_a_damaged_gzip_is_refused_in_one_line_and_nothing_is_written(tmp_path, damage):
    """A torn .gz (cut mid-stream) or a file that is no gzip at all is refused by the reader, the report and
    the compressor alike: one line, exit 2, the folder untouched; never half read."""
    from click.testing import CliRunner

    from kvbench.cli import main
    from kvbench.core.errors import DataFileError

    folder = tmp_path / "ref"
    shutil.copytree(SMALL, folder)
    data = (folder / ROWS_GZ).read_bytes()
    (folder / ROWS_GZ).write_bytes(data[: len(data) // 2] if damage == "torn" else b"not gzip\n")
    before = sorted((path.name, path.read_bytes()) for path in folder.rglob("*") if path.is_file())
    with pytest.raises(DataFileError, match="not a readable gzip file"):
        kvbench.load_results(folder)
    with pytest.raises(DataFileError):
        compress_rows(folder)
    result = CliRunner().invoke(main, ["report", str(folder), "--out", str(tmp_path / "report")])
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output
    assert not (tmp_path / "report").exists() or not any((tmp_path / "report").iterdir())
    assert sorted((path.name, path.read_bytes()) for path in folder.rglob("*") if path.is_file()) == before
