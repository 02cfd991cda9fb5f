"""The validation layer (kvbench/core/validation.py and the schemas of the files kvbench reads), held by
generated cases: every field of a valid results row, training manifest and LongBench data line is mutated
(wrong type, missing, null, nan, huge) and must be refused in one line with exit 2 (rows: skipped with one
warning, as
corrupt lines are), or accepted where the schema allows the value, with nothing changed on disk."""

import hashlib
import json
import math
import warnings
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvbench.bridge import models
from kvbench.cli import main
from kvbench.core.config import PROTOCOLS, Config
from kvbench.core.errors import BadInput, KvbenchWarning
from kvbench.core.validation import parse_float, parse_int, parse_value
from kvbench.harness.planning import parse_memory, parse_ratio, trial_run
from kvbench.store.results import REQUIRED_FIELDS, ResultsStore, Row, check_writable, load_rows, load_runs
from kvbench.tasks import longbench

MUTATIONS = ("wrong type", "missing", "null", "nan", "huge")
PROTOCOL_CONFIGS = [(name, ((p.option, 2),) if p.option else ()) for name, p in PROTOCOLS.items()]


def mutate(data: dict, path: tuple, mutation: str) -> dict | None:
    """A deep copy of `data` with the field at `path` mutated; None when the mutation does not apply (huge
    is for numbers and strings)."""
    data = json.loads(json.dumps(data))
    *parents, name = path
    holder = data
    for part in parents:
        holder = holder[part]
    value = holder[name]
    if mutation == "missing":
        del holder[name]
    elif mutation == "null":
        holder[name] = None
    elif mutation == "nan":
        holder[name] = float("nan")
    elif mutation == "wrong type":
        holder[name] = "abc" if isinstance(value, (int, float, list, dict)) else 12345
    elif isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    else:  # huge
        holder[name] = (
            "x" * 100_000 if isinstance(value, str) else 10**30 if isinstance(value, int) else 1e300
        )
    return data


def accepted(mutation: str, field: str, optional: set[str], unbounded: set[str]) -> bool:
    """Whether a schema accepts the mutation of `field`: absent (or null) where the field is optional,
    huge where it has no bound (`unbounded`: free text, some floats)."""
    if mutation in ("missing", "null"):
        return field in optional
    return mutation == "huge" and field in unbounded


def folder_hash(folder: Path) -> dict:
    return {
        str(path.relative_to(folder)): hashlib.sha1(path.read_bytes()).hexdigest() if path.is_file() else None
        for path in sorted(folder.rglob("*"))
    }


# ---- results rows ----

VALID_ROW = Row(
    config_id="c",
    model="m",
    press="knorm",
    ratio=0.5,
    task="t",
    length=1024,
    seed=3,
    sample_id="s1",
    press_args={"window_size": 8},
    press_state="abc",
    memory=0.5,  # a row of a memory budget: `BUDGET_ROW` is one of an absolute budget
    protocol="streaming",
    protocol_args={"chunk": 4},
    content_hash="h",
    prediction="x",
    references=["x"],
    score=50.0,
    context_tokens=10,
    kv_kept=5,
    kv_total=10,
    kv_bytes=100,
    kv_bytes_full=200,
    prefill_s=0.1,
    decode_s=0.2,
    nll=2.5,
    # The keys of meta that kvbench reads back (RowMeta), and one of a task's own.
    meta={
        "k": 1,
        "question": 0,
        "turn": 1,
        "context": "c",
        "part": "p",
        "length": 9,
        "span": 4,
        "span_nll": [2.0],
    },
).to_dict()
ROW_OPTIONAL = set(VALID_ROW) - set(REQUIRED_FIELDS)  # an absent or null field takes its default
ROW_OPTIONAL -= {"protocol", "protocol_args"}  # but a protocol's arguments are exactly its own
# Free text, and floats without an upper bound (lm-eval's metrics are not all on 0-100).
ROW_UNBOUNDED = {name for name, value in VALID_ROW.items() if isinstance(value, str)}
ROW_UNBOUNDED |= {"score", "prefill_s", "decode_s", "nll"}
BUDGET_ROW = {**VALID_ROW, "memory": None, "budget": 64}
ROW_CASES = [(field, mutation) for field in VALID_ROW for mutation in MUTATIONS]
META_CASES = [(key, mutation) for key in VALID_ROW["meta"] for mutation in MUTATIONS]
META_UNBOUNDED = {"k", "context", "part"}  # a task's own key passes as it is; free text


@pytest.mark.parametrize("field, mutation", ROW_CASES, ids=[f"{f}-{m}" for f, m in ROW_CASES])
def test_a_mutated_row_is_loaded_or_skipped_with_one_warning_and_nothing_changes(field, mutation, tmp_path):
    row = mutate(BUDGET_ROW if field == "budget" else VALID_ROW, (field,), mutation)
    check_mutated_row(row, accepted(mutation, field, ROW_OPTIONAL, ROW_UNBOUNDED), tmp_path)


@pytest.mark.parametrize("key, mutation", META_CASES, ids=[f"meta.{k}-{m}" for k, m in META_CASES])
def test_a_row_whose_meta_is_mutated_is_loaded_or_skipped_with_one_warning(key, mutation, tmp_path):
    """The keys of meta the report reads are typed (a question "a" was a pandas traceback in the report);
    each may be absent, and other keys pass whatever they hold."""
    row = mutate(VALID_ROW, ("meta", key), mutation)
    ok = key == "k" or accepted(mutation, key, set(VALID_ROW["meta"]), META_UNBOUNDED)
    check_mutated_row(row, ok, tmp_path, f"'meta.{key}'")


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"protocol": "perplexity", "nll": None}, "'nll'"),
        ({"protocol": "perplexity", "meta": {"span_nll": [2.0]}}, "'meta.span'"),
        ({"protocol": "perplexity", "meta": {"span": 4}}, "'meta.span_nll'"),
        ({"task": "longbench-e/qasper", "meta": {"k": 1}}, "'meta.length'"),
    ],
)
def test_a_row_without_what_its_kind_needs_is_skipped_with_one_warning(changes, field, tmp_path):
    """A perplexity row is drawn from its NLL and per-span NLLs, a LongBench-E row bucketed by its length:
    without them, a KeyError in the report; now skipped as a corrupt row, naming the field."""
    check_mutated_row({**VALID_ROW, **changes}, False, tmp_path, field)


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"kv_kept": 11, "kv_total": 10}, "'kv_kept'"),
        ({"kv_kept": 0, "kv_total": 0}, "'kv_total'"),
        ({"kv_bytes": 0, "kv_bytes_full": 0}, "'kv_bytes_full'"),
        ({"budget": 64}, "'budget'"),
        ({"press": "none", "memory": None}, "'ratio'"),
        ({"press": "none", "ratio": 0.0}, "'memory'"),
        ({"press": "none", "ratio": 0.0, "memory": None, "budget": 8}, "'budget'"),
        ({"kv_kept": 10, "kv_total": 10}, None),
        ({"press": "none", "ratio": 0.0, "memory": None}, None),
    ],
)
def test_a_row_whose_fields_contradict_each_other_is_skipped_with_one_warning(changes, field, tmp_path):
    """Each field fits its type, the row does not: more entries kept than the cache had, none at all (a
    memory ratio of inf in the report), a budget given two ways, an uncompressed row with a budget."""
    check_mutated_row({**VALID_ROW, **changes}, field is None, tmp_path, field or "")


def check_mutated_row(row: dict | None, ok: bool, tmp_path: Path, field: str = "") -> None:
    """A folder of a valid row and `row` (its second line): both load (`ok`), or `row` is skipped with one
    warning (naming `field`) by the reader and by a writer opening the folder; no byte of it changes."""
    if row is None:
        pytest.skip("huge applies to numbers and strings")
    other = {**VALID_ROW, "sample_id": "s0"}
    (tmp_path / "rows.jsonl").write_text(json.dumps(other) + "\n" + json.dumps(row) + "\n")
    before = folder_hash(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        frame = load_rows(tmp_path)
        ResultsStore(tmp_path).close()  # a writer opening the folder (a resumed run) changes no row
    (tmp_path / "rows.jsonl.lock").unlink()  # what a writer leaves: its lock file, empty
    ours = [w for w in caught if issubclass(w.category, KvbenchWarning)]
    if ok:
        assert len(frame) == 2 and not ours, [str(w.message) for w in ours]
    else:
        assert list(frame["sample_id"]) == ["s0"]
        assert len(ours) == 2 and all(":2: skipped a corrupt results row" in str(w.message) for w in ours)
        assert "\n" not in str(ours[0].message) and field in str(ours[0].message), str(ours[0].message)
    assert folder_hash(tmp_path) == before


def test_rows_the_report_cannot_read_are_one_warning_then_one_error(tmp_path):
    (tmp_path / "rows.jsonl").write_text(json.dumps({**VALID_ROW, "ratio": "abc"}) + "\n")
    result = CliRunner().invoke(main, ["report", str(tmp_path), "--out", str(tmp_path / "report")])
    assert result.exit_code == 2 and "Traceback" not in result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("Warning: ") and "field 'ratio'" in lines[0]
    assert lines[1].startswith("Error: ") and not (tmp_path / "report").exists()


def test_the_store_refuses_to_write_a_row_it_could_not_read_back(tmp_path):
    store = ResultsStore(tmp_path)
    with pytest.raises(ValueError, match="cannot be read back: field 'score'"):
        store.append(Row("c", "m", "knorm", 0.5, "t", 1, 0, "s", score=float("nan")))
    assert not (tmp_path / "rows.jsonl").exists()


# ---- the torn last line and the last line that only lost its newline ----


def test_a_valid_last_row_without_its_newline_is_kept(tmp_path):
    lines = [json.dumps({**VALID_ROW, "sample_id": f"s{i}"}) for i in range(2)]
    (tmp_path / "rows.jsonl").write_text(lines[0] + "\n" + lines[1])  # no newline after the last row
    store = ResultsStore(tmp_path)
    store.append(Row(**{**Row.from_dict(VALID_ROW).__dict__, "sample_id": "s2"}))
    assert list(load_rows(tmp_path)["sample_id"]) == ["s0", "s1", "s2"]


def test_a_torn_last_line_is_still_cut(tmp_path):
    line = json.dumps(VALID_ROW)
    (tmp_path / "rows.jsonl").write_text(line + "\n" + line[:-7])
    ResultsStore(tmp_path)
    assert (tmp_path / "rows.jsonl").read_text() == line + "\n"


# ---- run records: their nested parts too ----

VALID_RUN = {
    "command": "kvbench sweep ...",
    "config": {
        "model": "m",
        "dtype": "float32",
        "configs": [
            {
                "press": "knorm",
                "ratio": 0.5,
                "press_args": [["window_size", 8]],
                "memory": 0.5,
                "budget": 64,
                "protocol": "decode-time",
                "protocol_args": [["interval", 4]],
            }
        ],
        "tasks": ["t"],
        "suite": "s",
        "length": 1024,
        "samples": 2,
    },
    "summary": {},
    "versions": {"torch": "2"},
    "hardware": {"machine": "x86_64", "cpus": 2, "gpu": "H200"},
    "git_commit": "abc",
    "started": "2026-01-01T00:00:00",
    "finished": None,
}
ENTRY = ("config", "configs", 0)
RUN_PATHS = [
    ("command",),
    ("config",),
    *[("config", key) for key in VALID_RUN["config"]],
    *[(*ENTRY, key) for key in VALID_RUN["config"]["configs"][0]],
    ("hardware",),
    *[("hardware", key) for key in VALID_RUN["hardware"]],
    ("started",),
]
# What a config of a run is, and the arguments of its protocol (decode-time takes one).
RUN_REQUIRED = {(*ENTRY, "press"), (*ENTRY, "ratio"), (*ENTRY, "protocol_args")}
RUN_CASES = [(path, mutation) for path in RUN_PATHS for mutation in MUTATIONS]


def dig(data, path: tuple):
    for part in path:
        data = data[part]
    return data


@pytest.mark.parametrize(
    "path, mutation", RUN_CASES, ids=[".".join(map(str, p)) + f"-{m}" for p, m in RUN_CASES]
)
def test_a_mutated_run_record_is_read_or_skipped_with_one_warning_naming_the_field(path, mutation, tmp_path):
    """Every field of a run record the report reads, nested ones too (config.tasks as text was iterated
    letter by letter; a config without a press was a KeyError): read, or skipped with one warning naming
    the file and the field, and the report's rows read all the same."""
    record = mutate(VALID_RUN, path, mutation)
    if record is None:
        pytest.skip("huge applies to numbers and strings")
    (tmp_path / "rows.jsonl").write_text(json.dumps(VALID_ROW) + "\n")
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "r.json").write_text(json.dumps(record))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        runs = load_runs([tmp_path])
    ours = [str(w.message) for w in caught if issubclass(w.category, KvbenchWarning)]
    free_text = isinstance(dig(VALID_RUN, path), str)
    if mutation in ("missing", "null"):
        ok = path not in RUN_REQUIRED
    else:
        ok = mutation == "huge" and free_text
    if ok:
        assert len(runs) == 1 and not ours, ours
    else:
        field = ".".join(map(str, path))
        assert not runs and len(ours) == 1, ours
        assert f"runs/r.json: skipped a corrupt run record: field '{field}" in ours[0], ours


# ---- training manifests ----

SHAPE = {"name": "x", "num_layers": 1, "num_kv_heads": 1, "head_dim": 4}
SHARD = {
    "file": "train.safetensors",
    "split": "train",
    "prompt_tokens": 8,
    "task": "vt",
    "length": 512,
    "sample_id": "0",
    "question_tokens": 4,
    "continuation_tokens": 2,
}
VALID_MANIFEST = {
    "method": "shared",
    "mixture": "ruler",
    "model": SHAPE,
    "config": {"reconstruction": False},
    "shards": [SHARD, {**SHARD, "file": "val.safetensors", "split": "val"}],
}
SHARD_OPTIONAL = {"task", "length", "sample_id", "question_tokens", "continuation_tokens"}
MANIFEST_UNBOUNDED = {"name", "file", "mixture", "task", "sample_id"}  # free text (method and split are not)
MANIFEST_FIELDS = [
    *[(name,) for name in VALID_MANIFEST],
    *[("model", name) for name in SHAPE],
    *[("shards", 0, name) for name in SHARD],
]
MANIFEST_CASES = [(path, mutation) for path in MANIFEST_FIELDS for mutation in MUTATIONS]


@pytest.fixture
def no_model_loads(monkeypatch):
    """Past every check, a command would load its model: it says so in one line instead."""

    def refuse(*args, **kwargs):
        raise BadInput("the checks passed: the model would load now")

    monkeypatch.setattr(models, "load_model", refuse)
    monkeypatch.setattr(models, "hub_reachable", lambda timeout=3.0: False)
    monkeypatch.setattr(longbench, "hub_data_zip", lambda: None)


def one_line_exit_2(args: list[str], folder: Path) -> str:
    before = folder_hash(folder)
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "Traceback" not in result.output, (
        result.output
    )
    assert folder_hash(folder) == before
    return lines[0]


@pytest.mark.parametrize(
    "path, mutation", MANIFEST_CASES, ids=[f"{'.'.join(map(str, p))}-{m}" for p, m in MANIFEST_CASES]
)
def test_a_mutated_manifest_is_refused_in_one_line_before_training(path, mutation, tmp_path):
    manifest = mutate(VALID_MANIFEST, path, mutation)
    if manifest is None:
        pytest.skip("huge applies to numbers and strings")
    store = tmp_path / "store"
    store.mkdir()
    (store / "manifest.json").write_text(json.dumps(manifest))
    for split in ("train", "val"):  # the shards are garbage: a manifest that passes fails on them
        (store / f"{split}.safetensors").write_bytes(b"\x00garbage")
    line = one_line_exit_2(["kvp", "train", "--data", str(store), "--out", str(tmp_path / "out")], tmp_path)
    # A missing method is KVP's (stores from before the field); a null one is no method.
    optional = {"mixture", *SHARD_OPTIONAL} | ({"method"} if mutation == "missing" else set())
    if accepted(mutation, path[-1], optional, MANIFEST_UNBOUNDED):
        assert "is unreadable" in line, line
    else:
        assert "manifest.json" in line and "unreadable" not in line, line


# ---- LongBench data lines ----

VALID_LINE = {
    "input": "Who?",
    "context": "Alice.",
    "answers": ["Alice"],
    "length": 2,
    "_id": "a",
    "all_classes": ["x", "y"],
}
LINE_CASES = [(field, mutation) for field in VALID_LINE for mutation in MUTATIONS]


@pytest.mark.parametrize("field, mutation", LINE_CASES, ids=[f"{f}-{m}" for f, m in LINE_CASES])
def test_a_mutated_longbench_line_is_refused_in_one_line_before_the_model(
    field, mutation, tmp_path, no_model_loads
):
    line = mutate(VALID_LINE, (field,), mutation)
    if line is None:
        pytest.skip("huge applies to numbers and strings")
    (tmp_path / "lb").mkdir()
    (tmp_path / "lb" / "hotpotqa.jsonl").write_text(json.dumps(line) + "\n")
    args = ["run", "--press", "knorm", "--ratio", "0.5", "--task", "longbench/hotpotqa", "--samples", "1"]
    error = one_line_exit_2(
        [*args, "--data-dir", str(tmp_path / "lb"), "--out", str(tmp_path / "out")], tmp_path
    )
    if accepted(mutation, field, {"_id", "all_classes"}, {"input", "context", "_id"}):
        assert "the model would load now" in error, error
    else:
        assert "hotpotqa.jsonl:1" in error, error


@pytest.mark.parametrize("answers", [[], [[]]], ids=["no answer", "a list in the list"])
def test_a_longbench_line_without_an_answer_is_refused_in_one_line(answers, tmp_path, no_model_loads):
    """`"answers": []` scored 0 whatever the prediction; refused, as the user's own JSONL refuses it."""
    (tmp_path / "lb").mkdir()
    (tmp_path / "lb" / "hotpotqa.jsonl").write_text(json.dumps(VALID_LINE | {"answers": answers}) + "\n")
    args = ["run", "--press", "knorm", "--ratio", "0.5", "--task", "longbench/hotpotqa", "--samples", "1"]
    error = one_line_exit_2(
        [*args, "--data-dir", str(tmp_path / "lb"), "--out", str(tmp_path / "out")], tmp_path
    )
    assert "hotpotqa.jsonl:1" in error and "answers" in error, error


# ---- numbers ----


@pytest.mark.parametrize(
    "value", ["nan", "inf", "-inf", float("nan"), float("inf"), True, None, [0.5], "0x1"]
)
def test_numbers_that_mean_nothing_are_refused(value):
    for parse in (parse_ratio, parse_memory):
        with pytest.raises(BadInput):
            parse(value)


def test_numbers_are_parsed_from_text_and_numbers_alike():
    assert parse_float("0.25", "x", 0, 1) == parse_float(0.25, "x", 0, 1) == 0.25
    assert math.copysign(1, parse_float("-0", "x")) == 1  # -0.0 is 0.0
    assert parse_int("12", "n", 1) == parse_int(12, "n", 1) == 12
    for bad in (12.0, 12.5, "12.5", True, "abc", 2**63, None):
        with pytest.raises(BadInput):
            parse_int(bad, "n")
    assert parse_ratio("1e-320") == 0.0 and parse_memory("0.50000000000001") == 0.5
    with pytest.raises(BadInput, match="1 at 10 decimal places"):
        parse_ratio("0.99999999999")


# Python's int() and float() read these; a user typing them did not mean that number.
NOT_WRITTEN_AS_NUMBERS = ["1_000", "1_0.5", "١٢", "٣.٥", "１２", "1e1_0", "0x10", "12 34"]


@pytest.mark.parametrize("text", NOT_WRITTEN_AS_NUMBERS)
def test_numbers_are_read_as_ascii_digits_only(text):
    with pytest.raises(BadInput, match="must be a"):
        parse_float(text, "x")
    with pytest.raises(BadInput, match="must be a whole number"):
        parse_int(text, "n")
    assert parse_int(" 12 ", "n") == 12 and parse_float(" .5 ", "x") == 0.5  # spaces around are dropped


def test_a_count_with_underscores_is_one_line_exit_2(tmp_path):
    error = one_line_exit_2(["run", "--press", "knorm", "--ratio", "0.5", "--seed", "1_000"], tmp_path)
    assert "--seed': must be a whole number, got '1_000'" in error, error


# ---- values typed from text (--press-arg KEY=VALUE): one rule, YAML 1.2's core schema in decimal ----

TYPED = [
    # YAML 1.1 (yaml.safe_load) read these as 8, 90, 16, True, True and the text '5e-1'
    ("010", 10),
    ("1:30", "1:30"),
    ("0x10", "0x10"),
    ("0o10", "0o10"),
    ("yes", "yes"),
    ("on", "on"),
    ("No", "No"),
    ("5e-1", 0.5),
    ("1_000", "1_000"),
    ("2001-01-01", "2001-01-01"),
    # the rule itself
    ("32", 32),
    ("-3", -3),
    ("+4", 4),
    (".5", 0.5),
    ("1.", 1.0),
    ("1E3", 1000.0),
    ("true", True),
    ("FALSE", False),
    ("null", None),
    ("", None),
    ("~", None),
    ("tova", "tova"),
    ("  tova ", "tova"),
    ("a: b", "a: b"),
    ("x # y", "x # y"),
    ("path/to/agents", "path/to/agents"),
    ("'010'", "010"),
    ('"yes"', "yes"),
    ("[0.3, 010, yes, '1', [a]]", [0.3, 10, "yes", "1", ["a"]]),
    ("{a: 1, b: [on]}", {"a": 1, "b": ["on"]}),
]


@pytest.mark.parametrize("text, value", TYPED, ids=[text or "(empty)" for text, _ in TYPED])
def test_a_value_typed_from_text_follows_one_rule(text, value):
    typed = parse_value(text, "press argument 'k'")
    assert typed == value and type(typed) is type(value)


@pytest.mark.parametrize(
    "text, reason",
    [
        ("1e999", "must be a finite number, got inf"),
        (".inf", "must be a finite number, got inf"),
        ("-.inf", "must be a finite number, got -inf"),
        ("nan", "must be a finite number, got nan"),
        ("[1, .nan]", "must be a finite number, got nan"),
        ("99999999999999999999", "must be at most 9223372036854775807"),
        ("[1", "cannot read '[1'"),
        ("[1] [2]", "cannot read"),
        ("[&a 1, *a]", "anchors and aliases"),
        ("[!!str 3]", "tags"),
        ("{[1]: 2}", "a key of"),
        ("[" * 5000, "cannot read"),
    ],
)
def test_a_value_that_cannot_be_typed_is_one_line_naming_it(text, reason):
    with pytest.raises(BadInput) as info:
        parse_value(text, "press argument 'k'")
    message = str(info.value)
    assert message.startswith("press argument 'k'") and reason in message and "\n" not in message


def test_the_python_api_refuses_wrong_types_before_any_work(tmp_path, no_model_loads):
    import kvbench

    out = tmp_path / "out"
    for keywords, culprit in (
        ({"seed": "abc"}, "--seed must be a whole number"),
        ({"length": 512.5}, "--length must be a whole number"),
        ({"samples": "2"}, "the checks passed"),  # text of a number, as the command line gives it
        ({"batch_configs": 0}, "--batch-configs must be at least 1"),
    ):
        with pytest.raises(BadInput, match=culprit):
            kvbench.run("knorm", 0.5, tasks=["niah_single_1"], out=out, **keywords)
    with pytest.raises(BadInput, match="the checks passed"):  # a scalar ratio, as run takes
        kvbench.sweep("knorm", 0.5, tasks=["niah_single_1"], out=out)
    assert not out.exists()


TRIED = [
    *[Config("knorm", 0.5, protocol=name, protocol_args=args) for name, args in PROTOCOL_CONFIGS],
    *[Config(name, 0.5) for name in ("snapkv", "random", "adakv", "chunkkv", "streaming_llm")],
    Config("quant", 0.0, memory=0.5),
]


@pytest.mark.parametrize("config", TRIED, ids=[f"{c.press}-{c.protocol}" for c in TRIED])
def test_the_trial_runs_every_protocol_with_a_press_defaults(config, one_thread):
    """The trial of press arguments blames them only when the press runs there without them: a trial that
    breaks by itself (the engine's API changed under it) would let every bad argument through."""
    trial_run(config, 320)


def test_check_writable_refuses_a_fifo_without_blocking(tmp_path):
    import os

    os.mkfifo(tmp_path / "rows.jsonl")
    with pytest.raises(BadInput, match="is not a plain file"):
        check_writable(tmp_path)
