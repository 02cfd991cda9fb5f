"""JSONL files as other tools write them, and rewrites that fail half-way: every reader splits lines alike
(at "\\n", "\\r\\n" or a lone "\\r", never inside a JSON string), so a file with other line ends or with raw
U+2028 in its strings (as `jq -c` writes them) reads and resumes as kvbench's own; and no row is lost by a
resumed run, by `python -m kvbench.store.results compress` or by the substrate study's --merge, whatever the
line
ends, and when the disk fills or the process is killed mid-write."""

import errno
import gzip
import json
import os
import random
import resource
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import kvbench.harness.runner as runner
from kvbench.bridge.models import load_model
from kvbench.core.config import Config
from kvbench.core.errors import KvbenchWarning, ResultsWriteError
from kvbench.core.validation import jsonl_lines, whole_lines_size
from kvbench.store import results
from kvbench.store.results import ResultsStore, Row, compress_rows, config_id, load_rows, read_rows

REPO = Path(__file__).resolve().parents[2]
ENDS = ("\n", "\r\n", "\r")
# What JSON allows raw inside a string and str.splitlines() takes for a line end.
SPLITLINES_ONLY = ("\u2028", "\u2029", "\x85")
NO_WARNINGS = pytest.mark.filterwarnings("error::kvbench.core.errors.KvbenchWarning")


def row(sample_id: str, prediction: str = "x") -> Row:
    return Row(
        config_id=config_id("m", "knorm", 0.5, {}),
        model="m",
        press="knorm",
        ratio=0.5,
        task="vt",
        length=1024,
        seed=0,
        sample_id=sample_id,
        content_hash="c0",
        references=["x"],
        prediction=prediction,
        score=50.0,
    )


def jsonl(objects, ends=("\n",), final=True, raw=True) -> str:
    """`objects` as JSONL: raw (non-ASCII written as it is, as jq -c does) or escaped (json.dumps's
    default), line ends taken in turn from `ends`, the last one left off unless `final`."""
    lines = [json.dumps(obj, ensure_ascii=not raw) for obj in objects]
    text = "".join(line + ends[i % len(ends)] for i, line in enumerate(lines))
    return text if final else text[: len(text) - len(ends[(len(lines) - 1) % len(ends)])]


def hostile_strings(rng: random.Random, count: int) -> list[str]:
    """Strings holding what JSON keeps raw and splitlines() splits at, and escaped line ends."""
    parts = [*SPLITLINES_ONLY, "\n", "\r", "\r\n", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "a", "é", "😀"]
    return ["".join(rng.choice(parts) for _ in range(rng.randint(1, 8))) for _ in range(count)]


# The splitter itself.


@pytest.mark.parametrize("seed", range(20))
def test_jsonl_lines_gives_back_every_line_whatever_its_end(seed):
    rng = random.Random(seed)
    objects = [{"s": text, "n": i} for i, text in enumerate(hostile_strings(rng, rng.randint(1, 12)))]
    ends = tuple(rng.choice(ENDS) for _ in range(rng.randint(1, 3)))
    text = jsonl(objects, ends, final=rng.random() < 0.5)
    assert [json.loads(line) for line in jsonl_lines(text)] == objects
    if any(mark in obj["s"] for obj in objects for mark in SPLITLINES_ONLY):
        assert len(text.splitlines()) > len(objects)  # what the readers did before: this test can fail


def test_jsonl_lines_keeps_blank_lines_for_line_numbers_and_counts_no_line_after_a_final_end():
    assert jsonl_lines("") == [] and jsonl_lines("\n") == [""] and jsonl_lines("a") == ["a"]
    assert jsonl_lines("a\r\n\rb\n\nc") == ["a", "", "b", "", "c"]
    assert (
        whole_lines_size(b"ab") == 0 and whole_lines_size(b"a\nb") == 2 and whole_lines_size(b"a\rb\r") == 4
    )


# The results store: a folder written with other line ends resumes without losing or redoing a row.


@NO_WARNINGS
@pytest.mark.parametrize("final", [True, False], ids=["final-end", "no-final-end"])
@pytest.mark.parametrize("ends", [("\r",), ("\r\n",), ("\n", "\r", "\r\n")], ids=["cr", "crlf", "mixed"])
def test_a_resumed_store_keeps_every_row_of_a_file_with_other_line_ends(tmp_path, ends, final):
    old = [row(str(i), prediction=f"p{i}\u2028q") for i in range(5)]
    (tmp_path / "rows.jsonl").write_bytes(jsonl([r.to_dict() for r in old], ends, final).encode())
    store = ResultsStore(tmp_path)
    assert store.done == {r.key for r in old}
    assert store.claim(old) == []  # nothing to recompute
    assert store.append(row("new"))
    frame = load_rows(tmp_path)
    assert sorted(frame.sample_id) == sorted([r.sample_id for r in old] + ["new"])
    assert set(frame.prediction) >= {f"p{i}\u2028q" for i in range(5)}


def test_a_torn_tail_after_cr_lines_is_cut_and_nothing_else(tmp_path):
    old = [row(str(i)) for i in range(3)]
    text = jsonl([r.to_dict() for r in old], ("\r",)) + '{"config_id": "abc", "task": "v'  # killed mid-row
    (tmp_path / "rows.jsonl").write_bytes(text.encode())
    ResultsStore(tmp_path).append(row("new"))
    assert [r.sample_id for r in read_rows(tmp_path / "rows.jsonl")] == ["0", "1", "2", "new"]


@NO_WARNINGS
def test_a_jq_rewritten_folder_resumes_without_recomputing(tmp_path, monkeypatch, tiny_model_dir):
    """A run, its rows.jsonl rewritten as `jq -c` writes JSON (U+2028 raw in the predictions), a rerun:
    nothing computed again, nothing appended twice."""
    calls = []

    def fake_evaluate(model, tokenizer, sample, configs, batch_configs):
        calls.append(sample.id)
        return [
            {"prediction": f"{sample.references[0]}\u2028\u2029\x85", "context_tokens": 1} for _ in configs
        ]

    monkeypatch.setattr(runner, "evaluate_sample", fake_evaluate)
    model, tokenizer = load_model(tiny_model_dir)
    plan = runner.Plan([Config("none", 0.0)], ["niah_single_1"], 512, samples=2, model=tiny_model_dir)
    runner.run_plan(model, tokenizer, plan, ResultsStore(tmp_path), progress=False)
    rows_file = tmp_path / "rows.jsonl"
    written = [json.loads(line) for line in rows_file.read_text(encoding="utf-8").split("\n") if line]
    rows_file.write_bytes(jsonl(written, raw=True).encode())
    assert "\u2028" in rows_file.read_text(encoding="utf-8")
    frame = runner.run_plan(model, tokenizer, plan, ResultsStore(tmp_path), progress=False)
    assert len(calls) == 2 and len(frame) == 2
    assert len(jsonl_lines(rows_file.read_text(encoding="utf-8"))) == 2


@NO_WARNINGS
def test_a_gzip_of_raw_u2028_rows_reads_every_row(tmp_path):
    rows = [row(str(i), prediction=text) for i, text in enumerate(hostile_strings(random.Random(0), 20))]
    (tmp_path / "rows.jsonl.gz").write_bytes(
        gzip.compress(jsonl([r.to_dict() for r in rows], ("\r\n",)).encode())
    )
    assert read_rows(tmp_path / "rows.jsonl.gz") == rows
    assert ResultsStore(tmp_path).claim(rows) == []


# Every other JSONL reader: a raw file with any line ends reads as the escaped "\n" file does.


def cost(index: int, text: str) -> dict:
    return {
        "press": "knorm",
        "ratio": 0.5,
        "memory": None,
        "press_args": {"note": text},
        "tokens": 64 + index,
        "device": "cpu",
        "prefill_s": 1.0,
        "prefill_none_s": 1.0,
        "prefill_overhead": 0.0,
        "decode_tokens_per_s": 1.0,
        "decode_none_tokens_per_s": 1.0,
        "allocated_bytes": 1,
        "allocated_bytes_full": 2,
        "accounted_bytes": 1,
        "accounted_bytes_full": 2,
    }


def study_row(index: int, text: str) -> dict:
    return {
        "model": f"m{text}",
        "seed": index,
        "method": "none",
        "keep": 1.0,
        "ppl": 2.0,
        "ppl_late": 2.0,
        "train_s": 0.0,
        "gate_mean_last20": None,
        "config": {"n_layer": 1, "d_model": 8, "n_head": 2, "context": 16},
        "settings": {"steps": 2},
    }


def read_costs(path: Path):
    from kvbench.store.costs import load_costs

    path.rename(path.parent / "costs.jsonl")
    return load_costs(path.parent)


def read_trace(path: Path):
    from kvbench.serving.trace import read_trace

    return read_trace(path)


def read_study(path: Path):
    from benchmarks.substrate.summary import load

    return load(path)


def read_texts(path: Path):
    from kvbench.harness.perplexity import local_texts

    return list(local_texts(path.parent))


def trace_lines(texts: list[str]) -> list[dict]:
    chunks = [{"kind": "chunk", "id": f"c{i}", "text": f"t{text}"} for i, text in enumerate(texts)]
    requests = [
        {"kind": "request", "id": f"r{i}", "session": text, "chunks": [f"c{i}"], "question": f"q{text}"}
        for i, text in enumerate(texts)
    ]
    return chunks + requests


READERS = {
    "costs": (read_costs, lambda texts: [cost(i, text) for i, text in enumerate(texts)]),
    "trace": (read_trace, trace_lines),
    "substrate rows": (read_study, lambda texts: [study_row(i, text) for i, text in enumerate(texts)]),
    "perplexity texts": (read_texts, lambda texts: [{"text": f"t{text}"} for text in texts]),
}


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("kind", READERS)
def test_every_jsonl_reader_reads_raw_u2028_and_any_line_end_as_the_plain_file(kind, seed, tmp_path):
    read, make = READERS[kind]
    rng = random.Random(seed)
    objects = make(
        [mark + text for mark, text in zip(SPLITLINES_ONLY * 3, hostile_strings(rng, 9), strict=True)]
    )
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "data.jsonl").write_bytes(jsonl(objects, raw=False).encode())
    (tmp_path / "raw").mkdir()
    ends = tuple(rng.choice(ENDS) for _ in range(3))
    (tmp_path / "raw" / "data.jsonl").write_bytes(jsonl(objects, ends, final=seed % 2 == 0).encode())
    assert read(tmp_path / "raw" / "data.jsonl") == read(tmp_path / "plain" / "data.jsonl")


# python -m kvbench.store.results compress: never a row lost.


def folder_bytes(folder: Path) -> dict:
    """Every file of a folder and its bytes, but the lock file (which the lock may make or remove)."""
    files = sorted(path for path in folder.rglob("*") if path.is_file() and path.name != "rows.jsonl.lock")
    return {path.name: path.read_bytes() for path in files}


def make_folder(folder: Path, gz: str | None, plain: str | None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    if gz is not None:
        (folder / "rows.jsonl.gz").write_bytes(gzip.compress(gz.encode()))
    if plain is not None:
        (folder / "rows.jsonl").write_bytes(plain.encode())


GZ_ROWS = [row(f"g{i}", prediction=f"g\u2028{i}") for i in range(3)]
PLAIN_ROWS = [row(f"p{i}") for i in range(3)]
COMPRESS_CASES = {
    # (the .gz's text, rows.jsonl's text)
    "last row without its newline": (None, jsonl([r.to_dict() for r in PLAIN_ROWS], final=False)),
    "gz without its final newline": (jsonl([r.to_dict() for r in GZ_ROWS], final=False), ""),
    "gz without final newline, then rows": (
        jsonl([r.to_dict() for r in GZ_ROWS], final=False),
        jsonl([r.to_dict() for r in PLAIN_ROWS]),
    ),
    "cr line ends": (
        jsonl([r.to_dict() for r in GZ_ROWS], ("\r",)),
        jsonl([r.to_dict() for r in PLAIN_ROWS], ("\r",)),
    ),
    "crlf, no final end": (None, jsonl([r.to_dict() for r in PLAIN_ROWS], ("\r\n",), final=False)),
    "mixed": (
        jsonl([r.to_dict() for r in GZ_ROWS], ENDS),
        jsonl([r.to_dict() for r in PLAIN_ROWS], ENDS[::-1]),
    ),
}


@NO_WARNINGS
@pytest.mark.parametrize("case", COMPRESS_CASES)
def test_compress_keeps_every_row_whatever_the_line_ends(case, tmp_path):
    make_folder(tmp_path, *COMPRESS_CASES[case])
    before = read_rows(tmp_path / "rows.jsonl")
    assert before
    done = subprocess.run(
        [sys.executable, "-m", "kvbench.store.results", "compress", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "rows.jsonl").exists() and read_rows(tmp_path / "rows.jsonl.gz") == before
    data = gzip.decompress((tmp_path / "rows.jsonl.gz").read_bytes())
    assert b"\r" not in data and data.endswith(b"\n") and data.count(b"\n") == len(before)
    compress_rows(tmp_path)  # again: the same bytes
    assert gzip.decompress((tmp_path / "rows.jsonl.gz").read_bytes()) == data


def test_compress_drops_only_a_torn_last_line_and_keeps_a_corrupt_one_as_it_is(tmp_path):
    lines = [json.dumps(PLAIN_ROWS[0].to_dict()), "{not json", json.dumps(PLAIN_ROWS[1].to_dict())]
    make_folder(tmp_path, None, "\r".join(lines) + '\r{"config_id": "ab')  # killed mid-row
    with pytest.warns(KvbenchWarning):
        compress_rows(tmp_path)
    assert gzip.decompress((tmp_path / "rows.jsonl.gz").read_bytes()) == ("\n".join(lines) + "\n").encode()


def big_folder(folder: Path, count: int = 300) -> None:
    """Rows that gzip cannot shrink much: random predictions."""
    rng = random.Random(0)
    rows = [row(str(i), prediction=rng.randbytes(100).hex()) for i in range(count)]
    make_folder(
        folder, jsonl([r.to_dict() for r in rows[:50]]), jsonl([r.to_dict() for r in rows[50:]], ("\r",))
    )


class FullDisk:
    """A file whose writes fail with ENOSPC once `room` bytes are written (the first of them written)."""

    def __init__(self, file, room: int):
        self.file, self.room = file, room

    def write(self, data):
        if len(data) > self.room:
            self.file.write(bytes(data[: self.room]))
            self.room = 0
            raise OSError(errno.ENOSPC, "No space left on device")
        self.room -= len(data)
        return self.file.write(data)

    def __getattr__(self, name):
        return getattr(self.file, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.file.close()


def test_compress_on_a_full_disk_changes_nothing_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    big_folder(tmp_path)
    before = folder_bytes(tmp_path)
    monkeypatch.setattr(results, "open", lambda *a, **k: FullDisk(open(*a, **k), 4096), raising=False)
    with pytest.raises(ResultsWriteError, match="No space left on device; nothing changed"):
        compress_rows(tmp_path)
    assert folder_bytes(tmp_path) == before


def test_compress_that_reads_back_fewer_rows_changes_nothing(tmp_path, monkeypatch):
    big_folder(tmp_path, count=60)
    before = folder_bytes(tmp_path)
    real = results.read_back
    monkeypatch.setattr(results, "read_back", lambda path: real(path)[:-1])  # a row lost on the way
    with pytest.raises(ResultsWriteError, match="60 rows read, 59 in the compressed file; nothing changed"):
        compress_rows(tmp_path)
    assert folder_bytes(tmp_path) == before


def limit_file_size(size: int):
    """For a child process: writes past `size` bytes of any file fail (EFBIG), as on a full disk."""

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))

    return limit


def test_compress_under_a_file_size_limit_is_one_line_exit_1_and_changes_nothing(tmp_path):
    big_folder(tmp_path)
    before = folder_bytes(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "kvbench.store.results", "compress", str(tmp_path)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
        preexec_fn=limit_file_size(8192),
    )
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"Error: cannot compress {tmp_path}: File too large")
    assert folder_bytes(tmp_path) == before


KILLED_COMPRESS = """
import os, signal, sys
from pathlib import Path
from kvbench.store import results

def die(*args):
    os.kill(os.getpid(), signal.SIGKILL)

if sys.argv[2] == "writing":
    os.fsync = die  # the new file written, not yet in place
else:
    results.sync_folder = die  # in place, rows.jsonl not yet removed
results.compress_rows(Path(sys.argv[1]))
"""


@pytest.mark.parametrize("when", ["writing", "replaced"])
def test_compress_killed_mid_way_loses_no_row(tmp_path, when):
    big_folder(tmp_path, count=60)
    before = load_rows(tmp_path)
    done = subprocess.run([sys.executable, "-c", KILLED_COMPRESS, str(tmp_path), when])
    assert done.returncode == -signal.SIGKILL
    with warnings.catch_warnings():
        warnings.simplefilter("error", KvbenchWarning)
        assert load_rows(tmp_path).equals(before)
        compress_rows(tmp_path)  # a rerun finishes the job
    assert load_rows(tmp_path).equals(before) and not (tmp_path / "rows.jsonl").exists()
    assert list(folder_bytes(tmp_path)) == ["rows.jsonl.gz"]  # a killed write's temporary file removed


# benchmarks/substrate_study.py --merge: the rows file is replaced whole, or not at all.

SCRIPT = REPO / "benchmarks" / "substrate_study.py"


def study_folder(folder: Path, seeds: range, ends=("\n",)) -> None:
    rng = random.Random(seeds.start)
    rows = [
        {
            **study_row(seed, ""),
            "model": model,
            "method": method,
            "keep": keep,
            "note": rng.randbytes(60).hex(),
        }
        for seed in seeds
        for model in ("a", "b")
        for method, keep in [("none", 1.0)] + [(m, k) for m in ("h2o", "window") for k in (0.25, 0.5)]
    ]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "rows.jsonl").write_bytes(jsonl(rows, ends).encode())


def test_merge_under_a_file_size_limit_leaves_the_rows_file_as_it_was(tmp_path):
    study_folder(tmp_path / "all", range(0, 10))
    study_folder(tmp_path / "more", range(10, 20), ("\r",))
    before = folder_bytes(tmp_path / "all")
    size = len(before["rows.jsonl"])
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--merge", str(tmp_path / "more"), "--out", str(tmp_path / "all")],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
        preexec_fn=limit_file_size(size + size // 2),  # room for half of what the merge adds
    )
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert "File too large; it is as it was" in done.stderr
    assert folder_bytes(tmp_path / "all") == before


def test_merge_on_a_full_disk_mid_file_leaves_the_rows_file_as_it_was(tmp_path, monkeypatch):
    import importlib.util

    spec = importlib.util.spec_from_file_location("substrate_study", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    study_folder(tmp_path / "all", range(0, 3))
    study_folder(tmp_path / "more", range(3, 6))
    before = folder_bytes(tmp_path / "all")
    real_open = open
    monkeypatch.setattr("builtins.open", lambda *a, **k: FullDisk(real_open(*a, **k), 1000))
    with pytest.raises(ResultsWriteError, match="No space left on device; it is as it was"):
        script.merge_rows([tmp_path / "all", tmp_path / "more"], tmp_path / "all" / "rows.jsonl")
    monkeypatch.undo()
    assert folder_bytes(tmp_path / "all") == before
    script.merge_rows([tmp_path / "all", tmp_path / "more"], tmp_path / "all" / "rows.jsonl")
    assert len(jsonl_lines((tmp_path / "all" / "rows.jsonl").read_text())) == 2 * 6 * 5


def test_a_rows_file_is_parsed_once_a_process_and_a_bad_one_warns_each_read(tmp_path, monkeypatch):
    good = "".join(json.dumps(row(name).to_dict()) + "\n" for name in ("1", "2"))
    for name, text in (("a", good), ("b", good), ("c", good + "{torn\n")):  # b: a copy elsewhere
        (tmp_path / name).mkdir()
        (tmp_path / name / "rows.jsonl.gz").write_bytes(gzip.compress(text.encode()))
    parsed, parse_rows = [], results.parse_rows
    counted = lambda lines, path: parsed.append(path) or parse_rows(lines, path)  # noqa: E731
    monkeypatch.setattr(results, "parse_rows", counted)
    monkeypatch.setattr(results, "PARSED_FILES", {})
    first = results.read_file(tmp_path / "a" / "rows.jsonl.gz")
    again = results.read_file(tmp_path / "b" / "rows.jsonl.gz")
    assert [item.sample_id for item in first] == ["1", "2"] and again == first and again is not first
    assert len(parsed) == 1
    for _ in range(2):
        with pytest.warns(KvbenchWarning, match="skipped a corrupt results row"):
            assert len(results.read_file(tmp_path / "c" / "rows.jsonl.gz")) == 2
    assert len(parsed) == 3
