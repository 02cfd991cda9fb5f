"""Results store: a folder with `rows.jsonl` (one JSON `Row` per (config, sample)) and `runs/*.json`.

A folder may also hold `rows.jsonl.gz` (the committed reference folders: `python -m kvbench.store.results
compress FOLDER` folds a folder's rows into it). A folder's rows are those of its `rows.jsonl.gz`, then those
of its
`rows.jsonl`; the compressed file is read, never written, by the store: a resumed sweep appends to a plain
`rows.jsonl` beside it.

Rows are only ever appended, one `write` per line on an O_APPEND file, then fsync'd, so a run killed at any
point (even kill -9) leaves at most one torn last line, which the next writer cuts. A rerun computes only
the keys that are missing. Lines are split by `kvbench.core.validation.jsonl_lines` (at "\n", "\r\n" or a lone
"\r"), by every reader of the store, so a file written with other line ends by another tool reads and
resumes as the store's own.

A row's key is (config_id, task, length, seed, sample_id, content_hash): the config, which sample, and a hash
of the sample's content (`Sample.content_hash`: prompt, question, references, ...), so that regenerated task
data with the same ids is scored again, never served old rows. Rows written before content hashes existed
(`content_hash` null, e.g. the committed reference folders) still load, and still resume: such a row counts
as done for a sample whose references are the ones it recorded, the only content it holds. A rule that
accepts both kinds, rather than a migration, because stamping today's hash on an old row would claim a
content nobody checked. When a sample's content changed, its new row and the old one share the same
(config_id, task, length, seed, sample_id), and `load_rows` keeps the one written last.

Several processes may write one folder at once (two sweeps on one --out, split by hand or not): appends
and claims go under a file lock (`rows.jsonl.lock`), and before computing, a writer claims the rows it is
about to compute (`claims/<writer>.json`): rows that another live writer has claimed or written are left to
it. A writer holds a lock on `claims/<writer>.lock` while it lives, so the claims of a killed writer are
recognised as stale (its lock is free) and dropped. Run records are written whole (tmp + rename).
"""

import errno
import gzip
import hashlib
import json
import os
import socket
import tempfile
import uuid
import warnings
from collections.abc import Generator, Iterable
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from kvbench.core.config import DEFAULT_PROTOCOL, PROTOCOLS, Config
from kvbench.core.errors import (
    BadInput,
    DataFileError,
    KvbenchError,
    KvbenchWarning,
    NoResults,
    ResultsWriteError,
)
from kvbench.core.registry import PluginError
from kvbench.core.validation import (
    STRICT,
    Count,
    Int64,
    Memory,
    NonNegative,
    Positive,
    Ratio,
    as_paths,
    check_fields,
    check_json,
    jsonl_lines,
    open_plain,
    parse_json,
    read_bytes,
    read_text,
    whole_lines_size,
)

ROWS_FILE = "rows.jsonl"
ROWS_GZ = "rows.jsonl.gz"  # compressed rows, read-only (see the module's docstring)
RUNS_DIR = "runs"
LOCK_FILE = "rows.jsonl.lock"
CLAIMS_DIR = "claims"
SAMPLE_FIELDS = ("config_id", "task", "length", "seed", "sample_id")  # which config on which sample
KEY_FIELDS = (*SAMPLE_FIELDS, "content_hash")  # ... on which content
REQUIRED_FIELDS = ("config_id", "model", "press", "ratio", "task", "sample_id")


def config_id(
    model: str,
    press: str,
    ratio: float,
    press_args: dict,
    press_state: str | None = None,
    memory: float | None = None,
    protocol: str = DEFAULT_PROTOCOL,
    protocol_args: dict | None = None,
    budget: int | None = None,
) -> str:
    """A short stable id of (model, press, ratio, press arguments) and, for presses that load learned state
    (KVP's agents), that state's digest: rows scored with other agents are other results. A memory budget
    and a protocol other than the default enter the id only when given, so older rows keep their ids."""
    spec = [model, press, float(ratio), press_args] + ([press_state] if press_state else [])
    if memory is not None:
        spec.append({"memory": float(memory)})
    if protocol != DEFAULT_PROTOCOL:
        spec.append({"protocol": protocol, **(protocol_args or {})})
    if budget is not None:
        spec.append({"budget": int(budget)})
    text = json.dumps(spec, sort_keys=True, default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def config_id_of(model: str, config: Config) -> str:
    """`config_id` of a Config on `model`: what every writer of rows (runs, sweeps, perplexity) keys by."""
    return config_id(
        model,
        config.press,
        config.ratio,
        dict(config.press_args),
        config.press_state,
        config.memory,
        config.protocol,
        dict(config.protocol_args),
        config.budget,
    )


@dataclass
class RowMeta:
    """The schema of the keys of a row's `meta` that kvbench reads back, each of its type where present: the
    question or turn of a context that asks several (the runner's `question`/`turn`, `context`, `part`), a
    sample's length (LongBench-E's length buckets), and a perplexity row's per-span NLLs (`span`, `span_nll`).
    Any other key passes as it is (a task's own, e.g. LongBench's `all_classes`)."""

    question: Count
    turn: Count
    context: str
    part: str
    length: Count
    span: Positive
    span_nll: list[NonNegative]


# What a kind of row must hold for the report to read it: (which rows, what they are, the fields).
ROW_NEEDS = (
    (
        lambda values: values.get("protocol") == "perplexity",
        "a perplexity row",
        ("nll", "meta.span", "meta.span_nll"),
    ),
    (
        lambda values: str(values.get("task")).startswith("longbench-e/"),
        "a LongBench-E row",
        ("meta.length",),
    ),
)


def check_meta(values: dict) -> None:
    """ValueError naming the field when a row's `meta` does not fit `RowMeta`, or when the row lacks a field
    its kind of row needs (`ROW_NEEDS`)."""
    meta = values.get("meta", {})
    try:
        check_fields(
            RowMeta, {key: meta[key] for key in RowMeta.__dataclass_fields__ if key in meta}, "", ValueError
        )
    except ValueError as error:
        raise ValueError(str(error).replace("field '", "field 'meta.", 1)) from None
    for applies, kind, names in ROW_NEEDS:
        held = {**values, **{f"meta.{key}": value for key, value in meta.items()}}
        missing = [name for name in names if held.get(name) is None]
        if missing and applies(values):
            raise ValueError(f"field {missing[0]!r}: {kind} needs it (got none)")


def check_consistent(values: dict) -> None:
    """ValueError naming the field when a row's fields contradict each other: more KV entries kept than
    there were, a budget given two ways, an uncompressed row (`none`) with a budget."""
    if values.get("kv_kept") is not None and values.get("kv_total") is not None:
        if values["kv_kept"] > values["kv_total"]:
            raise ValueError(
                f"field 'kv_kept': more than kv_total, {values['kv_total']} (got {values['kv_kept']})"
            )
    if values.get("memory") is not None and values.get("budget") is not None:
        raise ValueError(f"field 'budget': a row of a memory budget has none (got {values['budget']})")
    if values.get("press") == "none":
        asked = [(name, values[name]) for name in ("ratio", "memory", "budget") if values.get(name)]
        if asked:
            name, value = asked[0]
            raise ValueError(f"field {name!r}: the uncompressed row (press 'none') has none (got {value})")


# The protocols rows record that no run protocol is (`config.PROTOCOLS`), and their arguments: `kvbench
# perplexity` feeds a text `every` tokens at a time (kvbench.harness.perplexity).
RECORDED_ARGUMENTS = {"perplexity": ("every",)}


def protocol_arguments(name: str) -> tuple[str, ...] | None:
    """The arguments a row of protocol `name` records; None for a protocol kvbench does not know (a plugin
    not installed, or one that fails to load)."""
    if name in RECORDED_ARGUMENTS:
        return RECORDED_ARGUMENTS[name]
    try:
        return PROTOCOLS[name].arguments if name in PROTOCOLS else None
    except PluginError:
        return None


def check_protocol_args(values: dict) -> None:
    """ValueError naming the field when a row's `protocol_args` are not exactly its protocol's arguments
    (`protocol_arguments`); `Row`'s annotation makes each a whole number >= 1, as every protocol takes. A
    row without a protocol (or with "") is query-agnostic, as rows written before protocols were recorded
    are. A protocol kvbench does not know keeps the argument names its rows record: they cannot be
    checked, and the rows stay readable once its plugin is installed."""
    name = values.get("protocol") or DEFAULT_PROTOCOL
    wanted, given = protocol_arguments(name), sorted(values.get("protocol_args", {}))
    if wanted is None or given == sorted(wanted):
        return
    which = f"protocol {name!r}" if values.get("protocol") else f"a row without a protocol ({name})"
    takes = f"takes {', '.join(wanted)}" if wanted else "takes no arguments"
    raise ValueError(f"field 'protocol_args': {which} {takes} (got {', '.join(given) or 'none'})")


@dataclass
class Row:
    """One scored (config, sample): a line of rows.jsonl, written by `kvbench run`/`sweep` and by the lm-eval
    bridge, read by the report. Fields a row of an older version lacks take their defaults; fields this
    version does not know (e.g. the legacy `kv_bytes_kept`) are kept in `extra` and written back as read.

    The annotations are the row's schema (`from_dict` checks them; kvbench.core.validation): exact JSON types,
    finite numbers, ratios in [0, 1), memories in (0, 1], counts and seconds not negative, integers of 64
    bits. No range for `score`: lm-eval's metrics are not all on 0-100."""

    # Which config: model, press and budget (see `config_id`).
    config_id: str
    model: str
    press: str
    ratio: Ratio
    # Which sample: task, context length (None: lm-eval tasks that size themselves), seed, id, content.
    task: str
    length: Positive | None
    seed: Int64
    sample_id: str
    press_args: dict[str, Any] = field(default_factory=dict)
    press_state: str | None = None  # digest of the press's learned state (KVP agents), if any
    # A user's press: where it comes from (target, module, qualname, file, sha256, package, version).
    press_source: dict[str, Any] | None = None
    memory: Memory | None = None  # the memory budget asked for (fraction of the 16-bit full cache), if any
    budget: Positive | None = None  # the absolute budget asked for (KV entries kept per head and layer)
    protocol: str = DEFAULT_PROTOCOL
    protocol_args: dict[str, Positive] = field(default_factory=dict)  # `check_protocol_args`
    content_hash: str | None = None  # Sample.content_hash; None in rows written before it existed
    # What was asked on top of the context: the sample's question and answer prefix (None in rows written
    # before they were recorded; `meta.question` is the place of a question in a context that asks several).
    question: str | None = None
    answer_prefix: str | None = None
    # What came out.
    prediction: str | None = None
    references: list[str] = field(default_factory=list)
    score: float | None = None  # 0-100
    context_tokens: Count | None = None
    kv_kept: Count | None = None  # KV entries (tokens x layers x KV heads) after compression
    kv_total: Positive | None = None  # ... and before
    kv_bytes: Count | None = None  # what a 16-bit store of the compressed cache holds, metadata included
    kv_bytes_full: Positive | None = None  # ... of the full cache
    prefill_s: NonNegative | None = None  # its share of the shared prefill, plus its own compression
    decode_s: NonNegative | None = None  # its share of the batched decoding
    # `kvbench perplexity` (protocol "perplexity", score None): the mean negative log-likelihood in nats per
    # predicted token of the text (its perplexity is exp(nll)); per-span means are in `meta`.
    nll: NonNegative | None = None
    meta: dict[str, Any] = field(default_factory=dict)  # the sample's (e.g. LongBench-E's length); `RowMeta`
    extra: dict[str, Any] = field(default_factory=dict)  # fields of other versions, kept as read

    @property
    def key(self) -> tuple:
        """What makes a row unique in a store: a rerun computes only the keys a store lacks."""
        return tuple(getattr(self, name) for name in KEY_FIELDS)

    @property
    def sample_key(self) -> tuple:
        """The key without the content hash: the same config on the same sample id, whatever its content."""
        return tuple(getattr(self, name) for name in SAMPLE_FIELDS)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of the row, `extra` merged back in."""
        return {**{name: getattr(self, name) for name in ROW_FIELDS}, **self.extra}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Row":
        """A row from its JSON object; ValueError when it is not one: not an object, its identity missing,
        a field of the wrong type or out of range (the class's annotations), `meta` or `protocol_args` that
        do not fit (`check_meta`, `check_protocol_args`). A null field is an absent one."""
        if not isinstance(data, dict):
            raise ValueError("not a results row (a JSON object)")
        missing = [name for name in REQUIRED_FIELDS if data.get(name) is None]
        if missing:
            raise ValueError(f"not a results row (no {', '.join(missing)})")
        known = set(ROW_FIELDS)
        values = {name: value for name, value in data.items() if name in known and value is not None}
        values = check_fields(cls, values, "", error=ValueError)
        check_meta(values)
        check_consistent(values)
        check_protocol_args(values)
        extra = {name: value for name, value in data.items() if name not in known}
        return cls(**{"length": None, "seed": 0, **values}, extra=extra)


ROW_FIELDS = tuple(item.name for item in fields(Row) if item.name != "extra")  # a row's JSON fields, in order


def check_folder_writable(folder: Path, what: str) -> None:
    """Raise BadInput if `folder` (`what`, e.g. "--out folder") cannot be created or written, without
    creating anything: a name too long, a file, a dangling link or a loop of links on the way, a folder that
    refuses a file (read-only, /proc)."""
    folder = Path(folder)
    probe = folder
    try:
        while not probe.exists():
            if probe.is_symlink():
                raise BadInput(
                    f"{what} {str(folder)!r} is not writable: {str(probe)!r} is {broken_link(probe)}"
                )
            probe = probe.parent
    except OSError as error:  # a name longer than the file system takes
        raise BadInput(f"{what} {str(folder)!r} is not writable: {error.strerror}") from None
    if not probe.is_dir():
        raise BadInput(f"{what} {str(folder)!r} is not writable: {str(probe)!r} is a file")
    try:  # a real probe: os.access says yes to root even on a read-only file system
        tempfile.TemporaryFile(dir=probe).close()
    except OSError:
        raise BadInput(f"{what} {str(folder)!r} is not writable") from None


def broken_link(path: Path) -> str:
    """What is wrong with a symbolic link that leads to nothing: 'a dangling link' or 'a loop of links'."""
    try:
        os.stat(path)
    except OSError as error:
        if error.errno == errno.ELOOP:
            return "a loop of links"
    return "a dangling link"


STORE_FILES = (ROWS_FILE, LOCK_FILE, ROWS_GZ)  # what the store opens as plain files
STORE_FOLDERS = (RUNS_DIR, CLAIMS_DIR)  # ... and as folders


def check_writable(folder: Path) -> None:
    """Raise BadInput if `folder` cannot be written as a results folder, without creating or changing
    anything: `check_folder_writable`, and each file and folder the store opens in it is what the store
    expects (a rows.jsonl or lock that is a folder or a FIFO would fail, or hang, at the first write; `runs`
    a file; a dangling link) and can be opened for writing."""
    check_folder_writable(folder, "results folder")
    folder = Path(folder)
    for name in (*STORE_FILES, *STORE_FOLDERS):
        path = folder / name
        wrong = broken_link(path) if path.is_symlink() and not path.exists() else None
        if path.exists() and name in STORE_FILES and not path.is_file():
            wrong = "not a plain file"
        if path.exists() and name in STORE_FOLDERS and not path.is_dir():
            wrong = "not a folder"
        if wrong:
            raise BadInput(f"results folder {str(folder)!r} is not writable: {str(path)!r} is {wrong}")
    rows = folder / ROWS_FILE
    if rows.is_file():
        try:  # opened for appending, never written: its bytes and times stay as they were
            os.close(os.open(rows, os.O_WRONLY | os.O_APPEND))
        except OSError:
            raise BadInput(f"results file {str(rows)!r} is not writable") from None


class ResultsStore:
    """A results folder open for writing; several processes may hold one on the same folder (see the
    module's docstring). The folder is created by the first write, so a run that fails before scoring
    anything leaves none. Use as a context manager, or call `close()`, to drop this writer's claims.
    `read_only`: only to ask `is_done`, without writing anything (not even the lock file)."""

    def __init__(self, folder: Path, read_only: bool = False):
        self.folder = Path(folder)
        self.rows_path = self.folder / ROWS_FILE
        self.owner = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.lock = FileLock(str(self.folder / LOCK_FILE))
        self.alive: FileLock | None = None  # held while this writer has claims
        self.offset = 0  # bytes of rows.jsonl read so far (whole lines)
        self.done: set[tuple] = set()  # keys of every row in the file
        self.fresh: set[tuple] = set()  # keys of rows written since this store opened (what --force keeps)
        self.legacy: dict[tuple, tuple] = {}  # sample_key -> references, of rows without a content hash
        for row in read_file(self.folder / ROWS_GZ):
            self.done.add(row.key)
            if row.content_hash is None:
                self.legacy[row.sample_key] = tuple(row.references)
        if self.rows_path.exists() and read_only:  # a look that writes nothing (no lock file): whole lines
            self.refresh(fresh=False)
        elif self.rows_path.exists():
            with self.locked():
                self.cut_torn_tail()
                self.refresh(fresh=False)

    def __enter__(self) -> "ResultsStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @contextmanager
    def locked(self) -> Generator[None, None, None]:
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise ResultsWriteError(f"cannot write results to {self.folder}: {error.strerror}") from None
        with self.lock:
            yield

    def cut_torn_tail(self) -> None:
        """Drop a last line without its newline when it is torn: the row being written when a writer was
        killed. A last line that is whole JSON (a row whose newline was lost, e.g. a file written by another
        tool or edited by hand) is kept and given its newline: a torn write never parses (JSON closes on
        its last byte), so only a torn one is cut and no row that can be read is ever lost. Only under the
        lock, where no live writer is half-way through a line."""
        if not self.rows_path.exists() or self.rows_path.stat().st_size == 0:
            return
        with open(self.rows_path, "rb+") as file:
            size = file.seek(0, os.SEEK_END)
            file.seek(size - 1)
            if file.read(1) in (b"\n", b"\r"):  # every line ends, whatever its line ends
                return
            start = max(self.offset, 0)
            file.seek(start)
            tail = file.read()
            cut = whole_lines_size(tail)
            if is_json(tail[cut:]):
                file.write(b"\n")
                file.flush()
                os.fsync(file.fileno())
                return
            file.truncate(start + cut)

    def refresh(self, fresh: bool = True) -> None:
        """Read the whole lines written since the last read (by this writer or another)."""
        if not self.rows_path.exists():
            return
        with open_plain(self.rows_path, DataFileError) as file:
            file.seek(self.offset)
            data = file.read()
        end = whole_lines_size(data)
        self.offset += end
        for row in parse_rows(jsonl_lines(data[:end].decode("utf-8", errors="replace")), self.rows_path):
            self.done.add(row.key)
            if fresh:
                self.fresh.add(row.key)
            if row.content_hash is None:
                self.legacy[row.sample_key] = tuple(row.references)

    def is_done(self, row: Row, force: bool = False) -> bool:
        """Whether the store holds `row`'s key; with `force`, only rows written since it opened count.
        A row without a content hash (an older version's) counts for a sample with the same references."""
        if row.key in (self.fresh if force else self.done):
            return True
        if force or row.content_hash is None:
            return False
        return self.legacy.get(row.sample_key) == tuple(row.references)

    def has(self, row: Row) -> bool:
        return self.is_done(row)

    def claim(self, rows: Iterable[Row], force: bool = False) -> list[Row]:
        """The rows of `rows` that nobody has written or claimed, now claimed by this writer (until the next
        claim, `release()` or `close()`): the rows this writer should compute."""
        rows = list(rows)
        with self.locked():
            self.refresh()
            taken = self.claimed_by_others()
            todo = [row for row in rows if not self.is_done(row, force) and row.key not in taken]
            self.write_claim([row.key for row in todo])
        return todo

    def release(self) -> None:
        if self.alive is not None:
            with self.locked():
                self.write_claim([])

    def close(self) -> None:
        """Drop this writer's claims; its liveness lock is released and removed."""
        if self.alive is None:
            return
        with self.locked():
            (self.claims_dir / f"{self.owner}.json").unlink(missing_ok=True)
            self.alive.release()
            Path(self.alive.lock_file).unlink(missing_ok=True)
            self.alive = None
            with suppress_os_error():
                self.claims_dir.rmdir()  # only when no other writer has claims

    @property
    def claims_dir(self) -> Path:
        return self.folder / CLAIMS_DIR

    def write_claim(self, keys: list[tuple]) -> None:
        try:
            self.claims_dir.mkdir(exist_ok=True)
            if self.alive is None:
                self.alive = FileLock(str(self.claims_dir / f"{self.owner}.lock"), thread_local=False)
                self.alive.acquire()
            path = self.claims_dir / f"{self.owner}.json"
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(keys, default=str))
            tmp.rename(path)
        except OSError as error:
            raise ResultsWriteError(f"cannot write claims to {self.claims_dir}: {error.strerror}") from None

    def claimed_by_others(self) -> set[tuple]:
        """Keys claimed by other live writers; the claims of dead ones (their lock is free) are removed."""
        taken: set[tuple] = set()
        if not self.claims_dir.is_dir():
            return taken
        for path in self.claims_dir.glob("*.json"):
            if path.stem == self.owner or not path.is_file():  # a folder or a FIFO is no writer's claims
                continue
            owner_lock = FileLock(str(path.with_suffix(".lock")))
            try:
                owner_lock.acquire(blocking=False)
            except Timeout:  # the writer lives; claims it cannot have written (not lists of keys) are none
                with suppress_os_error(), suppress(TypeError):
                    taken.update(tuple(key) for key in parse_json(read_text(path, ValueError)))
                continue
            except OSError:  # a lock that cannot be taken (a folder in its place): no writer to wait for
                continue
            with suppress_os_error():
                path.unlink(missing_ok=True)  # a killed writer's claims
                owner_lock.release()
                Path(owner_lock.lock_file).unlink(missing_ok=True)
        return taken

    def append(self, row: Row, force: bool = False) -> bool:
        """Append one row unless the store already holds its key (another writer's, or with `force`, one
        written since this store opened); True if written. It counts as done only once all its bytes are
        written and fsync'd."""
        line = (json.dumps(row.to_dict(), default=str) + "\n").encode()
        try:  # the store never writes a row that its readers would skip
            Row.from_dict(parse_json(line))
        except ValueError as error:
            raise ValueError(f"refusing to write a results row that cannot be read back: {error}") from None
        with self.locked():
            self.cut_torn_tail()
            self.refresh()
            if row.key in (self.fresh if force else self.done):
                return False
            self.offset = append_line(self.rows_path, line)
            self.done.add(row.key)
            self.fresh.add(row.key)
        return True

    def write_run(self, record: dict, path: Path | None = None) -> Path:
        """Write (or, given its `path`, replace) a run record whole."""
        if path is None:
            stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S.%f")
            path = self.folder / RUNS_DIR / f"{stamp}-{os.getpid()}.json"
        tmp = path.with_suffix(".tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(record, indent=2, default=str))
            tmp.rename(path)
        except OSError as error:
            tmp.unlink(missing_ok=True)
            raise ResultsWriteError(f"cannot write the run record {path}: {error.strerror}") from None
        return path


def append_line(path: Path, line: bytes) -> int:
    """Append `line` with O_APPEND and fsync it; the file's new size. A failed write (disk full) is cut back
    off the file, so no torn row stays behind, and raises."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError as error:
        raise ResultsWriteError(f"cannot write results to {path}: {error.strerror}") from None
    start = os.fstat(fd).st_size
    try:
        written = 0
        while written < len(line):
            count = os.write(fd, line[written:])
            if count <= 0:
                raise OSError(28, os.strerror(28))  # no progress: as good as a full disk
            written += count
        os.fsync(fd)
    except OSError as error:
        try:
            os.ftruncate(fd, start)
        except OSError:
            pass  # the next writer cuts the torn tail
        raise ResultsWriteError(f"cannot write results to {path}: {error.strerror}") from None
    finally:
        os.close(fd)
    return start + len(line)


def is_json(line: bytes) -> bool:
    """Whether an unterminated last line is whole (kept) rather than torn (cut). JSON nested too deeply to
    decode is kept: cutting it would lose bytes that may be whole; the readers skip it as a corrupt row."""
    try:
        json.loads(line)
    except RecursionError:
        return True
    except ValueError:  # UnicodeDecodeError included
        return False
    return True


@contextmanager
def suppress_os_error() -> Generator[None, None, None]:
    try:
        yield
    except (OSError, ValueError):
        pass


def parse_rows(lines: Iterable[str], path: Path) -> list[Row]:
    """The rows of some lines of `path`; bad lines are skipped with one warning (how many, the first).

    A line of valid JSON whose fields have the wrong types or values out of range (`Row`'s schema) is
    skipped like a corrupt line, not refused with an error: the store is append-only and shared by writers,
    so one damaged line must not make a whole folder unreadable to the report or a resumed run; the row's
    key cannot be trusted, so a resumed run computes it again; and the line stays in the file as it is."""
    rows, bad = [], []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rows.append(Row.from_dict(parse_json(line)))
        except (ValueError, TypeError) as error:
            bad.append((number, str(error).splitlines()[0] if str(error) else "unreadable"))
    if bad:
        (first, error), numbers = bad[0], ", ".join(str(number) for number, _ in bad[:5])
        what = "a corrupt results row"
        if len(bad) > 1:
            what = f"{len(bad)} corrupt results rows (lines {numbers}{', ...' if len(bad) > 5 else ''})"
        warnings.warn(f"{path}:{first}: skipped {what}: {error}", KvbenchWarning, stacklevel=3)
    return rows


def rows_files(folder: Path) -> list[Path]:
    """A folder's rows files, in the order their rows were written: rows.jsonl.gz, then rows.jsonl."""
    return [path for path in (Path(folder) / ROWS_GZ, Path(folder) / ROWS_FILE) if path.is_file()]


PARSED_FILES: dict[bytes, tuple[Row, ...]] = {}  # digest of a rows file's bytes -> its rows, all read well
PARSED_FILES_KEPT: int = 8  # files whose rows a process keeps (a committed reference: ~5,000 rows, ~20 MB)


def read_file(path: Path) -> list[Row]:
    """The rows of one file (gzip'd if its name ends in .gz); none if it is not there.

    Parsing checks every row against its schema (the bulk of the time a held rerun or a report takes), so a
    process parses each content once: a file read again, or a copy of it, gives the same Row objects (in a
    new list; callers do not change rows they read). A file with bad lines is parsed, and warned of, each
    time it is read."""
    if not Path(path).is_file():
        return []
    data = file_bytes(Path(path))
    digest = hashlib.blake2b(data, digest_size=16).digest()
    if digest in PARSED_FILES:
        return list(PARSED_FILES[digest])
    lines = jsonl_lines(data.decode("utf-8", errors="replace"))
    rows = parse_rows(lines, Path(path))
    if len(rows) == sum(1 for line in lines if line.strip()):
        while len(PARSED_FILES) >= PARSED_FILES_KEPT:
            del PARSED_FILES[next(iter(PARSED_FILES))]
        PARSED_FILES[digest] = tuple(rows)
    return rows


def file_bytes(path: Path) -> bytes:
    """The bytes of a rows file, decompressed if its name ends in .gz. A compressed file is read whole: a
    torn or foreign one is refused (DataFileError), not half read."""
    if path.suffix != ".gz":
        return read_bytes(path, DataFileError)
    try:
        return gzip.decompress(read_bytes(path, DataFileError))
    except (OSError, EOFError) as error:
        raise DataFileError(f"{path} is not a readable gzip file of rows ({error})") from None


def read_rows(path: Path) -> list[Row]:
    """The rows of one rows file; bad lines are skipped with one warning per file (how many, the first). A
    folder's rows.jsonl or rows.jsonl.gz stands for both of them (see `rows_files`)."""
    path = Path(path)
    files = rows_files(path.parent) if path.name in (ROWS_FILE, ROWS_GZ) else [path]
    return [row for file in files for row in read_file(file)]


def results_files(paths, recursive: bool = True) -> list[Path]:
    """One rows file per results folder among the given folders (or the files themselves), and with
    `recursive` per folder below them too: a report on `results/` must not pull in `results/reference/`
    unless asked. A folder's file is its rows.jsonl.gz if it has one (`read_rows` reads both)."""
    files = []
    for path in map(Path, paths):
        if path.name in (ROWS_FILE, ROWS_GZ):  # stands for the folder's rows, even before a rows.jsonl exists
            files += rows_files(path.parent)[:1]
            continue
        if path.is_file():
            files.append(path)
            continue
        folders = [path]
        if recursive:
            folders = sorted({file.parent for name in (ROWS_FILE, ROWS_GZ) for file in path.rglob(name)})
        files += [rows_files(folder)[0] for folder in folders if rows_files(folder)]
    return files


NUMERIC_FIELDS = ("ratio", "memory", "budget", "score", "context_tokens", "kv_kept", "kv_total", "kv_bytes")
NUMERIC_FIELDS += ("kv_bytes_full", "prefill_s", "decode_s", "nll")


def check_results_path(path: Path) -> None:
    """NoResults when `path` is not there: the one way every command that reads results says so."""
    if not Path(path).exists():
        raise NoResults(f"no results at {str(path)!r}: no such file or folder")


def load_rows(paths):
    """All rows under `paths` (a folder or file, or a list of them; NoResults for one that is not there) as
    one DataFrame, a column per `Row` field (`source` names the folder). Of
    rows of one config on one sample id, the last written is kept: a --force rerun, or a rerun after the
    task's data changed (see the module's docstring)."""
    import pandas as pd

    paths = as_paths(paths, "results folders")
    for path in paths:  # a rows file stands for its folder's rows even before there is one
        if path.name not in (ROWS_FILE, ROWS_GZ):
            check_results_path(path)
    records = [
        {**row.to_dict(), "source": str(file.parent)}
        for file in results_files(paths)
        for row in read_rows(file)
    ]
    columns = [*ROW_FIELDS, "source"]
    frame = pd.DataFrame(records, columns=None if records else columns)
    for name in NUMERIC_FIELDS:
        frame[name] = pd.to_numeric(frame[name])
    return frame.drop_duplicates(subset=list(SAMPLE_FIELDS), keep="last").reset_index(drop=True)


# Arguments as a run record writes them: a config's sorted (key, value) pairs, or an object.
Arguments = list[tuple[str, Any]] | dict[str, Any]


@dataclass
class RunConfigEntry:
    """One config of a run record's `config.configs` (a `Config` as `asdict` writes it): the fields the
    report reads to name what a run asked for."""

    __pydantic_config__ = STRICT

    press: str
    ratio: Ratio
    press_args: Arguments | None = None
    memory: Memory | None = None
    budget: Positive | None = None
    protocol: str | None = None
    protocol_args: Arguments | None = None

    def __post_init__(self):
        check_named_protocol(self.protocol, self.protocol_args)


def check_named_protocol(protocol: str | None, arguments: Arguments | None) -> None:
    """`check_protocol_args` for a run record's protocol and its arguments, where it names one (a record
    of an older version may name none, and its configs then follow the record's)."""
    if protocol is not None:
        check_protocol_args({"protocol": protocol, "protocol_args": dict(arguments or {})})


@dataclass
class RunConfig:
    """A run record's `config`: the fields the report reads (the model and compute dtype, the configs, tasks,
    suite, length and samples a run asked for, a protocol named once for all), each of its type where
    present; the others pass as they are."""

    __pydantic_config__ = STRICT

    model: str | None = None
    dtype: str | None = None
    configs: list[RunConfigEntry] | None = None
    tasks: list[str] | None = None
    suite: str | None = None
    length: Positive | None = None
    lengths: dict[str, Positive] | None = None  # per task, where it differs from `length`
    samples: Count | None = None
    protocol: str | None = None
    protocol_args: Arguments | None = None

    def __post_init__(self):
        check_named_protocol(self.protocol, self.protocol_args)


@dataclass
class RunHardware:
    """A run record's `hardware`, what the report says the timings ran on."""

    __pydantic_config__ = STRICT

    machine: str | None = None
    cpus: Positive | None = None
    gpu: str | None = None


@dataclass
class RunRecord:
    """The schema of a run record (runs/*.json, written whole by `kvbench.core.provenance.run_record`): the
    fields readers use, each of its type (`config`'s and `hardware`'s too), null as absent; other fields pass
    as they are. Checked as JSON (`check_json`), so that arrays fill the (key, value) pairs."""

    __pydantic_config__ = STRICT

    command: str | None = None
    config: RunConfig | None = None
    summary: dict[str, Any] | None = None
    versions: dict[str, Any] | None = None
    hardware: RunHardware | None = None
    git_commit: str | None = None
    started: str | None = None
    finished: str | None = None


def load_runs(paths) -> list[dict]:
    """The run records (command, config, versions) of the results folders under `paths`. A record that is
    not JSON or does not fit `RunRecord` is skipped with a warning, as a corrupt row is: records describe
    runs, they hold no results, and one bad file must not hide the others."""
    records = []
    for file in results_files(paths):
        for run in sorted((file.parent / RUNS_DIR).glob("*.json")):
            try:
                record = parse_json(read_text(run, ValueError))  # a FIFO is skipped, never waited on
                if not isinstance(record, dict):
                    raise ValueError("not a JSON object")
                check_json(RunRecord, json.dumps(record), "", error=ValueError)
            except (OSError, ValueError) as error:  # UnicodeDecodeError is a ValueError
                reason = str(error).splitlines()[0] if str(error) else type(error).__name__
                reason = reason.removeprefix(f"{run} is ")  # open_plain's "<path> is not a plain file"
                warnings.warn(f"{run}: skipped a corrupt run record: {reason}", KvbenchWarning, stacklevel=2)
                continue
            records.append(record)
    return records


def compress_rows(folder: Path) -> Path:
    """Fold a folder's rows (rows.jsonl.gz, then rows.jsonl) into one rows.jsonl.gz and remove its
    rows.jsonl. Each line is kept byte for byte and ends in "\n" (a file whose lines end in "\r" or
    "\r\n", or whose last row lacks its end, is folded in whole); only a torn last line (no line end, not
    JSON: a writer killed mid-row) is dropped. gzip level 9 with mtime 0 and no name, so the same rows give
    the same bytes.

    Never loses a row: the new file is written to a temporary file beside it and fsync'd, read back, and
    must hold every row the folder held, in order (else ResultsWriteError, nothing changed); only then
    does it replace rows.jsonl.gz, and only after that is rows.jsonl removed. A failure at any point
    (a full disk, a kill) leaves the folder's rows readable as they were; at worst, killed between the
    two steps, rows.jsonl's rows are there twice, which readers keep once."""
    folder = Path(folder)
    if not rows_files(folder):
        raise BadInput(f"{folder} holds no rows.jsonl to compress")
    for path in rows_files(folder):
        read_file(path)  # a torn or foreign .gz is refused before anything is written, the lock included
    with FileLock(str(folder / LOCK_FILE)):
        for stale in folder.glob(ROWS_GZ + ".*.tmp"):  # of a compress killed mid-way (made under this lock)
            stale.unlink(missing_ok=True)
        lines, before = [], []
        with warnings.catch_warnings():  # corrupt lines were reported by the reads above
            warnings.simplefilter("ignore", KvbenchWarning)
            for path in rows_files(folder):
                before += read_file(path)
                text = file_bytes(path).decode("utf-8", errors="surrogateescape")  # bytes kept as they are
                found = jsonl_lines(text)
                if found and not text.endswith(("\n", "\r")) and not is_json(found[-1]):
                    found.pop()  # a torn last line
                lines += found
        data = "".join(line + "\n" for line in lines).encode("utf-8", errors="surrogateescape")
        target, tmp = folder / ROWS_GZ, None
        try:
            fd, name = tempfile.mkstemp(prefix=ROWS_GZ + ".", suffix=".tmp", dir=folder)
            tmp = Path(name)
            with open(fd, "wb") as raw:
                with gzip.GzipFile("", "wb", 9, raw, mtime=0) as file:
                    file.write(data)
                raw.flush()
                os.fsync(raw.fileno())
            after = read_back(tmp)
            if [row.to_dict() for row in after] != [row.to_dict() for row in before]:
                tmp.unlink()
                raise ResultsWriteError(
                    f"cannot compress {folder}: {len(before)} rows read, {len(after)} in the compressed "
                    "file; nothing changed"
                )
            os.chmod(tmp, 0o644)  # mkstemp's file is private; the rows are not
            os.replace(tmp, target)
            sync_folder(folder)
        except ResultsWriteError:
            raise
        except OSError as error:
            if tmp is not None:
                tmp.unlink(missing_ok=True)
            raise ResultsWriteError(f"cannot compress {folder}: {error.strerror}; nothing changed") from None
        try:
            (folder / ROWS_FILE).unlink(missing_ok=True)
        except OSError as error:
            raise ResultsWriteError(
                f"compressed {folder}, but cannot remove its rows.jsonl ({error.strerror}): its rows are in "
                "both files until it is removed"
            ) from None
    return target


def read_back(path: Path) -> list[Row]:
    """The rows of a gzip'd rows file whatever its name (a temporary one), without warnings."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", KvbenchWarning)
        return parse_rows(jsonl_lines(gzip.decompress(path.read_bytes()).decode("utf-8", "replace")), path)


def sync_folder(folder: Path) -> None:
    """fsync a folder, so that a rename in it survives a crash; where folders cannot be opened, nothing."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


if __name__ == "__main__":  # python -m kvbench.store.results compress FOLDER...
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m kvbench.store.results")
    parser.add_argument("command", choices=["compress"])
    parser.add_argument("folders", nargs="+", type=Path)
    for folder in parser.parse_args().folders:
        try:
            path = compress_rows(folder)  # checks its own count before it removes anything
        except KvbenchError as error:  # one line, and kvbench's exit code: 2, or 1 for a write that failed
            print(f"Error: {str(error).splitlines()[0]}", file=sys.stderr)
            raise SystemExit(error.exit_code) from None
        print(f"{path}: {len(load_rows(folder))} rows, {path.stat().st_size} bytes")
