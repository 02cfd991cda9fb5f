"""Bad input that is not a typo: a FIFO or a device where a file is read, a count with a digit too many, a
kvbench cache that cannot be written, a loop of links for --out, a file size limit while writing. Each is
one line and its exit code, no traceback, nothing lost of what was written before; and every check a
command can make on its options and files comes before it imports torch, transformers or lm-eval (13-24 s
on 2 busy cores), so that a slip costs a second, not half a minute.

A reader that waits on a FIFO would hang the test run: the FIFO tests run readers in a subprocess with a
timeout, or in this process with a writer that opens the FIFO after a few seconds (`released`), so that a
regression fails instead of hanging."""

import contextlib
import json
import os
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import pytest

from kvbench.core.errors import BadInput, DataFileError, KvbenchWarning
from kvbench.core.validation import MAX_COUNT, load_yaml, parse_count, read_bytes, read_text
from kvbench.store.results import ResultsStore, Row, load_runs

HEAVY = ("torch", "transformers", "kvpress", "lm_eval")

# (entry point, arguments, environment, what the one line on stderr must say). "{tmp}": the prepared folder.
PPL = ["perplexity", "--presses", "streaming_llm", "--budget", "64"]
LM_EVAL = ["lm-eval", "--press", "snapkv", "--ratio", "0.5", "--tasks", "kvbench_niah_single_1"]
RUN = ["run", "--press", "knorm", "--ratio", "0.5", "--task", "niah_single_1", "--out", "{tmp}/out"]
OUT = ["--out", "{tmp}/out"]
CASES = [
    # counts bounded, said in the message
    ("kvbench", [*PPL, "--texts", "0", *OUT], {}, "--texts': must be at least 1, got 0"),
    ("kvbench", [*PPL, "--texts", "9" * 20, *OUT], {}, f"--texts': must be at most {MAX_COUNT}, got 9999"),
    ("kvbench", ["prefix-cache", *OUT, "--requests", "9" * 20], {}, f"': must be at most {MAX_COUNT}"),
    ("kvbench", ["prefix-cache", *OUT, "--requests", "0"], {}, "--requests': must be at least 1, got 0"),
    ("kvbench", ["prefix-cache", *OUT, "--docs", "9" * 20], {}, f"--docs': must be at most {MAX_COUNT}"),
    # FIFOs where a file is read: refused, never waited on
    (
        "kvbench",
        ["prefix-cache", *OUT, "--trace", "{tmp}/fifo"],
        {},
        "{tmp}/fifo is not a plain file (a FIFO)",
    ),
    ("kvbench", ["prefix-cache", *OUT, "--trace", "{tmp}/nope"], {}, "{tmp}/nope: cannot read the trace"),
    ("kvbench", ["speed", "--presses", "knorm", "--out", "{tmp}/costfifo"], {}, "costs.jsonl is not a plain"),
    # --out a loop of links, or under a file: refused before the work, not after it
    ("kvbench", [*PPL, "--out", "{tmp}/loop1"], {}, "'{tmp}/loop1' is a loop of links"),
    ("kvbench", ["prefix-cache", "--out", "{tmp}/loop1"], {}, "'{tmp}/loop1' is a loop of links"),
    (
        "kvbench",
        ["speed", "--presses", "knorm", "--out", "{tmp}/loop1"],
        {},
        "'{tmp}/loop1' is a loop of links",
    ),
    ("kvbench", ["memdecay", "lifetimes", "--out", "{tmp}/text.txt/x"], {}, "text.txt' is a file"),
    # the options of commands whose library imports torch, checked before it is imported
    ("kvbench", [*PPL, "--data-dir", "{tmp}/nope", *OUT], {}, "--data-dir '{tmp}/nope' is not a folder"),
    ("kvbench", ["prefix-cache", *OUT, "--press", "snapkv"], {}, "--press snapkv needs --ratio"),
    ("kvbench", ["prefix-cache", *OUT, "--policies", "lru"], {}, "unknown policy 'lru'"),
    ("kvbench", [*LM_EVAL[:4], "2", *LM_EVAL[5:], *OUT], {}, "ratio must be in [0, 1), got 2"),
    ("kvbench", [*LM_EVAL[:2], "snapk", *LM_EVAL[3:], *OUT], {}, "unknown press 'snapk'"),
    ("kvbench", [*LM_EVAL, "--length", "10", *OUT], {}, "--length 10 is below the minimum of task"),
    ("kvbench", [*LM_EVAL, "--out", "{tmp}/text.txt/sub"], {}, "text.txt' is a file"),
    ("kvbench", ["memdecay", "calibrate", *OUT, "--task", "nope"], {}, "unknown task 'nope'"),
    ("kvbench", ["distillcache", "train", *OUT, "--data", "{tmp}/empty"], {}, "no distillcache data at"),
    ("kvbench", ["distillcache", "datagen", *OUT, "--length", "10"], {}, "10 is below the minimum of task"),
    ("kvbench", ["distillcache", "datagen", "--out", "{tmp}/badmanifest"], {}, "not a datagen manifest"),
    # a kvbench cache that cannot take the embedded model's copy: refused before the ~30 s conversion
    ("kvbench", RUN, {"KVBENCH_CACHE": "{tmp}/text.txt"}, "KVBENCH_CACHE '{tmp}/text.txt' is not writable"),
    ("kvbench", RUN, {"KVBENCH_CACHE": "{tmp}/dangling"}, "'{tmp}/dangling' is a dangling link"),
    ("kvbench", RUN, {"KVBENCH_CACHE": "{tmp}/loop1"}, "'{tmp}/loop1' is a loop of links"),
    ("kvbench", RUN, {"KVBENCH_CACHE": "/proc/kvbench-cache"}, "KVBENCH_CACHE '/proc/kvbench-cache' is not"),
    # lm-eval writes its request cache and the tasks' tokenizer there: refused before lm-eval runs
    ("kvbench", [*LM_EVAL, *OUT], {"KVBENCH_CACHE": "/proc/kvbench-cache"}, "KVBENCH_CACHE '/proc/kvbench"),
    # lm-eval-kvbench: the model named, or lm-eval fails with a traceback once the model has loaded
    (
        "lm-eval-kvbench",
        ["--model", "kvbench", "--model_args", "press=snapkv,compression_ratio=0.5", "--tasks", "kvbench_vt"],
        {},
        "--model kvbench needs pretrained=MODEL in --model_args",
    ),
    ("lm-eval-kvbench", ["--model", "kvbench", "--tasks", "kvbench_vt"], {}, "needs pretrained=MODEL"),
    (
        "lm-eval-kvbench",
        ["-M", "kvbench", "-a", '{"press": "knorm"}', "--tasks", "x"],
        {},
        "needs pretrained=",
    ),
]

# Each case as a user's command runs, all in one subprocess (Python's start-up paid once): per case, the
# exit code, stderr and the heavy modules imported so far. An environment variable is set for its case only.
SCRIPT = """
import contextlib, io, json, os, sys
from kvbench.cli import main
from kvbench.cli.lm_eval import main as lm_eval_main

for entry, args, env in json.loads(sys.argv[1]):
    saved = {{name: os.environ.get(name) for name in env}}
    os.environ.update(env)
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        try:
            if entry == "kvbench":
                main(args)
            else:
                sys.argv = ["lm-eval-kvbench", *args]
                lm_eval_main()
            code = 0
        except SystemExit as done:
            code = done.code
    for name, value in saved.items():
        os.environ.pop(name) if value is None else os.environ.__setitem__(name, value)
    heavy = [name for name in {heavy!r} if name in sys.modules]
    print(json.dumps({{"code": code, "stderr": stderr.getvalue(), "heavy": heavy}}), flush=True)
"""


def make_files(tmp: Path) -> None:
    """The hostile files and folders the cases point at."""
    (tmp / "empty").mkdir()
    (tmp / "text.txt").write_text("not a folder\n")
    os.mkfifo(tmp / "fifo")
    (tmp / "costfifo").mkdir()
    os.mkfifo(tmp / "costfifo" / "costs.jsonl")
    (tmp / "loop1").symlink_to(tmp / "loop2")
    (tmp / "loop2").symlink_to(tmp / "loop1")
    (tmp / "dangling").symlink_to(tmp / "nowhere")
    (tmp / "badmanifest").mkdir()
    (tmp / "badmanifest" / "manifest.json").write_text("{oops")


def listing(tmp: Path) -> list[str]:
    return sorted(str(path.relative_to(tmp)) for path in tmp.rglob("*"))


def test_bad_input_and_environments_are_one_line_before_any_heavy_import(tmp_path):
    make_files(tmp_path)
    before = listing(tmp_path)
    cases = [
        (
            entry,
            [arg.replace("{tmp}", str(tmp_path)) for arg in args],
            {name: value.replace("{tmp}", str(tmp_path)) for name, value in env.items()},
        )
        for entry, args, env, _ in CASES
    ]
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(heavy=HEAVY), json.dumps(cases)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,  # a reader waiting on a FIFO fails the test here instead of hanging it
    )
    assert done.returncode == 0, done.stderr
    outcomes = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(outcomes) == len(CASES)
    for (entry, args, env, message), outcome in zip(CASES, outcomes, strict=True):
        case = (entry, args, env)
        assert outcome["code"] == 2, (case, outcome)
        lines = outcome["stderr"].strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: "), (case, outcome["stderr"])
        assert message.replace("{tmp}", str(tmp_path)) in lines[0], (case, lines[0])
        assert outcome["heavy"] == [], (case, outcome["heavy"])
    assert listing(tmp_path) == before  # no --out, no cache folder, no temporary file left


# ---- FIFOs and devices where a file is read ----


@contextlib.contextmanager
def released(fifo: Path, after: float = 5.0):
    """If a reader waits on `fifo` for a writer (the bug these tests guard against), open it for writing
    after `after` seconds and close it: the reader gets an empty file and the test fails, not hangs."""
    stop = threading.Event()

    def release():
        while not stop.wait(after):
            with contextlib.suppress(OSError):  # ENXIO: no reader waiting
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))

    thread = threading.Thread(target=release, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def test_the_one_reader_refuses_what_is_not_a_plain_file_before_reading(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "plain.txt").write_text("héllo")
    with released(tmp_path / "fifo"):
        with pytest.raises(DataFileError, match=r"fifo is not a plain file \(a FIFO\)$"):
            read_bytes(tmp_path / "fifo", DataFileError)
    with pytest.raises(BadInput, match=r"/dev/zero is not a plain file \(a character device\)"):
        read_bytes("/dev/zero")  # it would never end
    with pytest.raises(IsADirectoryError):  # the OSErrors of open(), for the callers' own messages
        read_text(tmp_path)
    with pytest.raises(FileNotFoundError):
        read_text(tmp_path / "nope")
    assert read_text(tmp_path / "plain.txt") == "héllo"
    (tmp_path / "link").symlink_to(tmp_path / "plain.txt")  # a link to a plain file is one
    assert read_bytes(tmp_path / "link") == "héllo".encode()


def test_a_suite_yaml_that_is_a_fifo_is_refused(tmp_path):
    os.mkfifo(tmp_path / "suite.yaml")
    with released(tmp_path / "suite.yaml"), pytest.raises(BadInput, match="is not a plain file"):
        load_yaml(tmp_path / "suite.yaml")


def test_a_run_record_that_is_a_fifo_is_skipped_and_the_others_kept(tmp_path):
    with ResultsStore(tmp_path) as store:
        store.append(Row("c", "m", "knorm", 0.5, "t", 1, 0, "s0", content_hash="h", score=1.0))
        store.write_run({"command": "kvbench run", "config": {"model": "m"}})
    os.mkfifo(tmp_path / "runs" / "x.json")
    with released(tmp_path / "runs" / "x.json"), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        records = load_runs([tmp_path])
    assert [record["command"] for record in records] == ["kvbench run"]
    said = [str(warning.message) for warning in caught if warning.category is KvbenchWarning]
    assert said == [
        f"{tmp_path / 'runs' / 'x.json'}: skipped a corrupt run record: not a plain file (a FIFO)"
    ]


def test_a_rows_file_or_claim_that_is_a_fifo_is_refused_not_waited_on(tmp_path):
    os.mkfifo(tmp_path / "rows.jsonl")
    with released(tmp_path / "rows.jsonl"), pytest.raises(DataFileError, match="is not a plain file"):
        ResultsStore(tmp_path, read_only=True)
    (tmp_path / "rows.jsonl").unlink()
    row = Row("c", "m", "knorm", 0.5, "t", 1, 0, "s0", content_hash="h", score=1.0)
    with ResultsStore(tmp_path) as store:
        (tmp_path / "claims").mkdir()
        os.mkfifo(tmp_path / "claims" / "other.json")  # another writer's claims, damaged: ignored
        with released(tmp_path / "claims" / "other.json"):
            assert store.claim([row]) == [row]


def test_a_costs_file_or_trace_that_is_a_fifo_is_refused(tmp_path):
    from kvbench.serving.trace import read_trace
    from kvbench.store.costs import load_costs

    os.mkfifo(tmp_path / "costs.jsonl")
    with released(tmp_path / "costs.jsonl"), pytest.raises(DataFileError, match="is not a plain file"):
        load_costs(tmp_path)
    with released(tmp_path / "costs.jsonl"), pytest.raises(DataFileError, match="is not a plain file"):
        read_trace(tmp_path / "costs.jsonl")


# ---- counts ----


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("9" * 20, f"--texts must be at most {MAX_COUNT}, got {'9' * 20}"),
        (MAX_COUNT + 1, f"--texts must be at most {MAX_COUNT}, got {MAX_COUNT + 1}"),
        (0, "--texts must be at least 1, got 0"),
    ],
)
def test_a_count_is_bounded_and_says_its_bound(value, said):
    with pytest.raises(BadInput) as info:
        parse_count(value, "--texts")
    assert str(info.value) == said
    assert parse_count(str(MAX_COUNT), "--texts") == MAX_COUNT


# ---- a file size limit while writing (`ulimit -f`): one line, and what was there stays ----


def limited(size: int):
    """A subprocess's pre-exec: files it writes may not grow past `size` bytes (RLIMIT_FSIZE). CPython
    ignores SIGXFSZ, so a write past it is an OSError (EFBIG), not a kill."""
    import resource

    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))


def test_compress_under_a_file_size_limit_keeps_the_rows_and_leaves_no_temporary_file(tmp_path):
    with ResultsStore(tmp_path) as store:
        for index in range(200):  # rows whose gzip is well past the limit
            store.append(Row("c", "m", "knorm", 0.5, "t", 1, 0, str(index), prediction=os.urandom(64).hex()))
    rows = (tmp_path / "rows.jsonl").read_bytes()
    done = subprocess.run(
        [sys.executable, "-m", "kvbench.store.results", "compress", str(tmp_path)],
        capture_output=True,
        text=True,
        preexec_fn=limited(4096),
        timeout=120,
    )
    assert done.returncode == 1, done.stderr  # a write that failed (exit 1), not a kill by SIGXFSZ (-25)
    assert done.stderr.strip() == f"Error: cannot compress {tmp_path}: File too large; nothing changed"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["rows.jsonl", "rows.jsonl.lock"]
    assert (tmp_path / "rows.jsonl").read_bytes() == rows


SAVE = """
import sys, torch
from pathlib import Path
from kvbench.core.errors import WriteError
from kvbench.learned.common import save_learned_state

module = torch.nn.Linear(64, int(sys.argv[2]))
try:
    save_learned_state(Path(sys.argv[1]), "agents.safetensors", module, {"model": "m"})
except WriteError as error:
    print(f"Error: {error}")
    sys.exit(error.exit_code)
"""


def test_learned_state_under_a_file_size_limit_leaves_no_folder_and_keeps_the_old_state(tmp_path):
    """`kvbench kvp train` (and distillcache's, gate's) write their state last: a write that fails leaves no
    empty agents folder, no half a file, and the state already there as it was."""
    out = tmp_path / "agents"
    save = [sys.executable, "-c", SAVE, str(out)]
    done = subprocess.run([*save, "1024"], capture_output=True, text=True, preexec_fn=limited(16384))
    assert done.returncode == 1, done.stderr
    assert (
        done.stdout.strip()
        == f"Error: cannot write agents.safetensors and card.json to {out}: File too large"
    )
    assert list(tmp_path.iterdir()) == []  # no agents folder, no temporary folder beside it
    done = subprocess.run([*save, "4"], capture_output=True, text=True)  # small: fits
    assert done.returncode == 0, done.stderr
    before = {path.name: path.read_bytes() for path in out.iterdir()}
    assert sorted(before) == ["agents.safetensors", "card.json"]
    done = subprocess.run([*save, "1024"], capture_output=True, text=True, preexec_fn=limited(16384))
    assert done.returncode == 1, done.stderr
    assert {path.name: path.read_bytes() for path in out.iterdir()} == before
    assert [path.name for path in tmp_path.iterdir()] == ["agents"]


def test_the_other_readers_refuse_a_fifo_too(tmp_path):
    """Conformance records, kvpress's metrics.json and predictions.csv, MemDecay's calibration."""
    from kvbench.harness.interop import read_predictions
    from kvbench.learned.memdecay.press import MemDecayError, load_calibration
    from kvbench.store.conformance import CONFORMANCE_DIR, read_records

    (tmp_path / CONFORMANCE_DIR).mkdir()
    os.mkfifo(tmp_path / CONFORMANCE_DIR / "x.json")
    with released(tmp_path / CONFORMANCE_DIR / "x.json"), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert read_records(tmp_path) == []
    assert any("not a plain file (a FIFO)" in str(warning.message) for warning in caught)
    os.mkfifo(tmp_path / "predictions.csv")
    with released(tmp_path / "predictions.csv"), pytest.raises(DataFileError, match="not a plain file"):
        read_predictions(tmp_path / "predictions.csv", ("predicted_answer",))
    (tmp_path / "calibration").mkdir()
    os.mkfifo(tmp_path / "calibration" / "calibration.json")
    with (
        released(tmp_path / "calibration" / "calibration.json"),
        pytest.raises(MemDecayError, match="no MemDecay calibration"),
    ):
        load_calibration(tmp_path / "calibration", "m")
