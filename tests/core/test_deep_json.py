"""JSON that decodes to what nothing downstream takes: nested deeper than any file kvbench reads holds
(`validation.MAX_DEPTH`; at ~1000 levels json.loads raises RecursionError, a traceback), or a string holding
a lone surrogate escape (`"\\ud800"`: json.loads gives a str no tokenizer or UTF-8 writer takes). Every
reader that decodes JSON outside pydantic refuses both through `validation.parse_json`, in one line naming
the file. Each file kind, at a depth just past the limit and far past Python's recursion limit, and with
each kind of unpaired surrogate."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvbench.cli import main
from kvbench.core.errors import KvbenchError
from kvbench.core.validation import MAX_DEPTH, nesting, parse_json

DEPTHS = [MAX_DEPTH + 1, 5000, 100_000]
SURROGATES = ['"\\ud800"', '"a \\udfff b"', '["\\udbff"]', '"\\uDC00\\ud800"']
NESTED, UNPAIRED = "nested deeper", "outside a surrogate pair"
# The bad value a reader's record holds: (its JSON text, what the one line says of it).
BAD = {f"depth {depth}": (None, NESTED) for depth in DEPTHS} | {text: (text, UNPAIRED) for text in SURROGATES}


def deep(depth: int) -> str:
    """A JSON value nested `depth` levels: lists in a dict, so the outside looks like a record."""
    return "[" * (depth - 1) + "1" + "]" * (depth - 1)


def record(depth: int | str, **fields) -> str:
    """A JSON object of `fields` and a field "deep": a value nested `depth` levels, or the JSON text
    `depth`."""
    bad = depth if isinstance(depth, str) else deep(depth)
    return json.dumps(fields)[:-1] + (", " if fields else "") + f'"deep": {bad}}}'


def bad_value(name: str) -> int | str:
    text, _ = BAD[name]
    return text if text is not None else int(name.split()[1])


@pytest.mark.parametrize("depth", DEPTHS)
def test_parse_json_refuses_deep_nesting_as_a_value_error(depth):
    with pytest.raises(ValueError, match=f"nested deeper than {MAX_DEPTH} levels"):
        parse_json(record(depth))
    with pytest.raises(ValueError, match="nested deeper"):
        parse_json(record(depth).encode())
    assert nesting(parse_json(record(MAX_DEPTH))) == MAX_DEPTH  # the limit itself is read
    assert parse_json('"[[[[[[["') == "[[[[[[["  # brackets in a string are no nesting


@pytest.mark.parametrize("text", SURROGATES)
def test_parse_json_refuses_a_lone_surrogate_and_reads_a_pair(text):
    for given in (text, text.encode()):
        with pytest.raises(ValueError, match=UNPAIRED):
            parse_json(given)
    assert parse_json('"\\ud83d\\ude00"') == "\U0001f600"  # a pair is one character
    assert parse_json('"\\\\ud800"') == "\\ud800"  # an escaped backslash, then letters


def one_line(error: BaseException, path: Path, says: str = NESTED) -> None:
    message = str(error)
    assert "\n" not in message and str(path) in message, message
    assert says in message, message


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def longbench(tmp: Path, depth: int):
    from kvbench.tasks.longbench import read_jsonl

    read_jsonl([record(depth, context="c", input="q", answers=["a"])], str(tmp / "qa.jsonl"))


def user_jsonl(tmp: Path, depth: int):
    from kvbench.tasks.jsonl import DataTask, read_records

    path = write(tmp / "data.jsonl", record(depth, context="c", question="q", answers=["a"]) + "\n")
    read_records(DataTask("mine", path))
    return path


def published(tmp: Path, depth: int):
    from kvbench.tasks.published import read_objects

    path = write(tmp / "rows.json", f"[{record(depth)}]")
    read_objects(path)
    return path


def perplexity(tmp: Path, depth: int):
    from kvbench.harness.perplexity import local_texts

    write(tmp / "texts" / "a.jsonl", record(depth, text="hello") + "\n")
    list(local_texts(tmp / "texts"))
    return tmp / "texts" / "a.jsonl"


def trace(tmp: Path, depth: int):
    from kvbench.serving.trace import read_trace

    path = write(tmp / "trace.jsonl", record(depth, kind="chunk", id="c", text="t") + "\n")
    read_trace(path)
    return path


def card(tmp: Path, depth: int):
    from kvbench.learned.common import read_card

    path = write(tmp / "weights" / "card.json", record(depth, method="gate"))
    read_card(path.parent, "gate", "kvbench gate train")
    return path


def kvp_card(tmp: Path, depth: int):
    from kvbench.learned.kvp.checkpoint import load_card

    path = write(tmp / "agents" / "card.json", record(depth, heads=[0]))
    load_card(path.parent)
    return path


WHERE = {
    longbench: "qa.jsonl",
    user_jsonl: "data.jsonl",
    published: "rows.json",
    perplexity: "texts/a.jsonl",
    trace: "trace.jsonl",
    card: "weights/card.json",
    kvp_card: "agents/card.json",
}


@pytest.mark.parametrize("bad", list(BAD))
@pytest.mark.parametrize("reader", list(WHERE), ids=lambda reader: reader.__name__)
def test_every_reader_refuses_deep_json_and_lone_surrogates_in_one_line_naming_the_file(
    reader, bad, tmp_path
):
    with pytest.raises(KvbenchError) as caught:
        reader(tmp_path, bad_value(bad))
    one_line(caught.value, tmp_path / WHERE[reader], BAD[bad][1])


@pytest.mark.parametrize("bad", list(BAD))
def test_deep_rows_run_records_and_speed_records_are_skipped_with_a_warning(bad, tmp_path):
    """The readers that skip a damaged file or line (rows, run records, speed records) skip a deep one, or
    one with a lone surrogate, warning in one line naming it; the folder's other rows still load."""
    depth, says = bad_value(bad), BAD[bad][1]
    from kvbench.reporting.costs import read_costs
    from kvbench.store.results import load_rows, load_runs

    rows = write(tmp_path / "r" / "rows.jsonl", record(depth, press="x") + "\n")
    run = write(tmp_path / "r" / "runs" / "a.json", record(depth, config={}))
    with pytest.warns(Warning) as caught:
        assert load_rows([tmp_path / "r"]).empty
    assert any(str(rows) in str(w.message) and says in str(w.message) for w in caught)
    with pytest.warns(Warning) as caught:
        assert load_runs([tmp_path / "r"]) == []
    assert any(str(run) in str(w.message) and says in str(w.message) for w in caught)
    write(tmp_path / "c" / "runs" / "speed-a.json", record(depth, config={"model": "m"}))
    write(tmp_path / "c" / "costs.jsonl", "")
    with pytest.raises(KvbenchError, match="holds no costs.jsonl lines"):
        read_costs(tmp_path / "c")  # the record is skipped, not a traceback


def test_a_deep_card_is_one_line_exit_2_before_the_model_loads(tmp_path, monkeypatch):
    def fail_if_loaded(*args, **kwargs):
        raise AssertionError("a bad input must fail before the model loads")

    monkeypatch.setattr("kvbench.bridge.models.load_model", fail_if_loaded)
    path = write(tmp_path / "agents" / "card.json", record(5000, heads=[0]))
    args = ["run", "--press", "kvp", "--ratio", "0.5", "--press-arg", f"agents={path.parent}"]
    result = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    [line] = result.output.strip().splitlines()
    assert str(path) in line and "nested deeper" in line
    assert not (tmp_path / "out").exists()
