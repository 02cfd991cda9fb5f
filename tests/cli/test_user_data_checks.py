"""Hostile input from the user's own files and options (data records, task and suite YAMLs, metrics, press
arguments): each refused in one line, exit 2, naming the file and record it comes from, before the model
loads where it can be, with nothing written to --out."""

import json
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

import kvbench
from kvbench.bridge import models
from kvbench.cli import main
from kvbench.core.errors import BadInput

RECORD = {
    "id": "s0",
    "context": "The code of box 0 is 100.",
    "question": "Code of box 0?",
    "answers": ["100"],
}


@pytest.fixture
def no_model_loads(monkeypatch):
    """Past every check, a run would load its model: it says so in one line instead."""

    def refuse(*args, **kwargs):
        raise BadInput("the checks passed: the model would load now")

    monkeypatch.setattr(models, "load_model", refuse)


def write_files(files: dict[str, object]) -> None:
    """Files in the current folder: a list of records as JSONL, a dict as YAML (JSON is YAML), text as is."""
    for name, content in files.items():
        path = Path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, list):
            path.write_text("".join(json.dumps(record) + "\n" for record in content))
        elif isinstance(content, dict):
            path.write_text(json.dumps(content))
        else:
            path.write_text(textwrap.dedent(content))


def refused(*args) -> str:
    """The one line of a command refused with exit 2, which wrote nothing to `out`."""
    result = CliRunner().invoke(main, [str(arg) for arg in args])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "Traceback" not in result.output, (
        result.output
    )
    assert not Path("out").exists()
    return lines[0]


def run(*args) -> str:
    return refused("run", "--press", "knorm", "--ratio", "0.5", "--length", 256, *args, "--out", "out")


def task_yaml(**spec) -> dict:
    return {"task": "mytask", "data": "mine.jsonl", **spec}


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ("raise KeyError('boom')", "KeyError: 'boom'"),
        ("return 1 / 0", "ZeroDivisionError: division by zero"),
        ("raise ValueError('first line\\nsecond line')", "ValueError: first line"),
    ],
    ids=["KeyError", "ZeroDivisionError", "two-line-message"],
)
def test_a_metric_that_raises_on_a_real_answer_is_one_line_and_keeps_the_rows_written(
    tmp_path, monkeypatch, tiny_llama_dir, body, says
):
    monkeypatch.chdir(tmp_path)
    metric = (
        f"def f(prediction, references):\n    if references == ['101']:\n        {body}\n    return 1.0\n"
    )
    records = [{**RECORD, "id": f"s{i}", "answers": [str(100 + i)]} for i in range(2)]
    write_files({"metrics.py": metric, "mine.jsonl": records})
    args = ["run", "--press", "knorm", "--ratio", "0.5", "--length", 256, "--model", tiny_llama_dir]
    args += ["--data", "mine.jsonl", "--metric", "metrics.py:f", "--out", "out"]
    result = CliRunner().invoke(main, [str(arg) for arg in args])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    line = result.output.strip().splitlines()[-1]
    assert line == f"Error: metric '{tmp_path}/metrics.py:f' fails on sample mine/s1: {says}", result.output
    rows = [json.loads(line) for line in Path("out/rows.jsonl").read_text().splitlines()]
    assert [row["sample_id"] for row in rows] == ["s0"]


@pytest.mark.parametrize("metric", ["", "   "])
def test_an_empty_metric_is_refused(tmp_path, monkeypatch, no_model_loads, metric):
    monkeypatch.chdir(tmp_path)
    write_files({"mine.jsonl": [RECORD]})
    assert "--metric must name a metric" in run("--data", "mine.jsonl", "--metric", metric)
    with pytest.raises(kvbench.BadInput, match="--metric must name a metric"):  # the API, as the command
        kvbench.run("knorm", 0.5, data="mine.jsonl", metric=metric, out="out")
    assert not Path("out").exists()


@pytest.mark.parametrize(
    ("templates", "says"),
    [
        ({"question": "{{ 1/0 }}"}, "ZeroDivisionError: division by zero"),
        ({"question": "{{ '%d' % context }}"}, "TypeError: %d format"),
        ({"context": "{{ title }}"}, "'title' is undefined"),
        ({"question": "{{ context.split()[99] }}"}, "UndefinedError"),
        ({"question": "{{ context.index('nowhere') }}"}, "ValueError: substring not found"),
    ],
    ids=["zero-division", "type-error", "undefined", "index", "filter"],
)
def test_a_template_that_fails_on_a_record_names_its_yaml_and_the_record(
    tmp_path, monkeypatch, no_model_loads, templates, says
):
    monkeypatch.chdir(tmp_path)
    write_files({"mine.jsonl": [RECORD], "task.yaml": task_yaml(templates=templates)})
    line = run("--include-path", ".", "--task", "mytask")
    name = next(iter(templates))
    expected = f"{tmp_path}/task.yaml: template of {name!r} fails on record 1 of {tmp_path}/mine.jsonl: "
    assert line.startswith(f"Error: {expected}") and says in line, line


@pytest.mark.parametrize("template", ["{{ context ", "{% if %}", "{{ context }", "{% for x in y %}"])
def test_a_template_that_is_not_jinja_names_its_yaml(tmp_path, monkeypatch, no_model_loads, template):
    monkeypatch.chdir(tmp_path)
    write_files({"mine.jsonl": [RECORD], "task.yaml": task_yaml(templates={"question": template})})
    line = run("--include-path", ".", "--task", "mytask")
    assert line.startswith(f"Error: {tmp_path}/task.yaml: template of 'question' is not Jinja ("), line


@pytest.mark.parametrize(
    ("files", "says"),
    [
        ({"mine.jsonl": [{**RECORD, "context": ""}]}, "mine.jsonl: record 1: 'context' holds no text"),
        ({"mine.jsonl": [{**RECORD, "context": " \n\t"}]}, "mine.jsonl: record 1: 'context' holds no text"),
        (
            {"mine.jsonl": [RECORD, {**RECORD, "id": "b", "question": ""}]},
            "record 2: 'question' holds no text",
        ),
        ({"mine.jsonl": [{**RECORD, "question": "   "}]}, "mine.jsonl: record 1: 'question' holds no text"),
        (
            {"mine.jsonl": [{**RECORD, "answers": [""]}]},
            "record 1: 'answers' holds an empty reference answer",
        ),
        ({"mine.jsonl": [{**RECORD, "answers": ""}]}, "record 1: 'answers' holds an empty reference answer"),
        ({"mine.jsonl": [{**RECORD, "answers": ["a", " "]}]}, "'answers' holds an empty reference answer"),
        (
            {"mine.jsonl": [{**RECORD, "q": ""}], "task.yaml": task_yaml(fields={"question": "q"})},
            "mine.jsonl: record 1: 'q' holds no text",
        ),
        (
            {"mine.jsonl": [RECORD], "task.yaml": task_yaml(templates={"context": "{{ '' }}"})},
            "task.yaml: template of 'context' renders no text on record 1 of ",
        ),
        (
            {"mine.jsonl": [RECORD], "task.yaml": task_yaml(templates={"question": "   "})},
            "task.yaml: template of 'question' renders no text on record 1 of ",
        ),
    ],
    ids=[
        "context-empty",
        "context-blank",
        "question-empty",
        "question-blank",
        "answer-empty",
        "answer-text-empty",
        "one-answer-blank",
        "renamed-question-empty",
        "template-context-empty",
        "template-question-blank",
    ],
)
def test_empty_text_is_refused_before_the_model_loads(tmp_path, monkeypatch, no_model_loads, files, says):
    monkeypatch.chdir(tmp_path)
    write_files(files)
    line = run(
        *(["--include-path", ".", "--task", "mytask"] if "task.yaml" in files else ["--data", "mine.jsonl"])
    )
    assert says in line and str(tmp_path) in line, line


@pytest.mark.parametrize("name", ["context", "question", "answers", "id"])
def test_a_key_that_fields_names_and_a_record_lacks_is_refused(tmp_path, monkeypatch, no_model_loads, name):
    """`fields` maps a sample's field to a record's key: a record without that key is refused, the id's
    too (it would otherwise be numbered silently, and rows keyed by another id)."""
    monkeypatch.chdir(tmp_path)
    write_files({"mine.jsonl": [RECORD], "task.yaml": task_yaml(fields={name: "nope"})})
    line = run("--include-path", ".", "--task", "mytask")
    assert line == f"Error: {tmp_path}/mine.jsonl: record 1: no 'nope' field", line


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        (
            {"templates": {"answers": "{{ answers }}"}},
            "templates render context or question only, not 'answers'",
        ),
        ({"templates": {"id": "{{ id }}"}}, "templates render context or question only, not 'id'"),
        ({"templates": {"ctx": "{{ c }}"}}, "templates render context or question only, not 'ctx'"),
        (
            {"fields": {"ctx": "c"}},
            "fields maps context, question, answers or id to a record's key, not 'ctx'",
        ),
    ],
    ids=["templates-answers", "templates-id", "templates-typo", "fields-typo"],
)
def test_fields_and_templates_are_refused_by_the_rule_they_break(
    tmp_path, monkeypatch, no_model_loads, spec, says
):
    monkeypatch.chdir(tmp_path)
    write_files({"mine.jsonl": [RECORD], "task.yaml": task_yaml(**spec)})
    assert run("--include-path", ".", "--task", "mytask") == f"Error: {tmp_path}/task.yaml: {says}"


@pytest.mark.parametrize(
    ("files", "args", "says"),
    [
        (
            {"task.yaml": task_yaml(task="niah_single_1")},
            ["--include-path", "."],
            "{tmp}/task.yaml: task name 'niah_single_1' is taken by kvbench's built-in task; "
            "choose another `task:`",
        ),
        (
            {"task.yaml": task_yaml(), "other.yaml": task_yaml(data="other.jsonl")},
            ["--include-path", "."],
            "{tmp}/task.yaml: task name 'mytask' is taken by {tmp}/other.yaml; choose another `task:`",
        ),
        (
            {"task.yaml": task_yaml(), "copy.yml": task_yaml()},
            ["--include-path", "."],
            "{tmp}/task.yaml: task name 'mytask' is taken by {tmp}/copy.yml; choose another `task:`",
        ),
        (
            {"niah_single_1.jsonl": [RECORD]},
            ["--data", "niah_single_1.jsonl"],
            "data '{tmp}/niah_single_1.jsonl': task name 'niah_single_1' is taken by kvbench's built-in "
            "task; rename the file or name its task in a task YAML",
        ),
        (
            {"task.yaml": task_yaml(), "sub/mytask.jsonl": [RECORD]},
            ["--include-path", ".", "--data", "sub/mytask.jsonl"],
            "data '{tmp}/sub/mytask.jsonl': task name 'mytask' is taken by {tmp}/task.yaml; "
            "rename the file or name its task in a task YAML",
        ),
    ],
    ids=["yaml-vs-built-in", "two-yamls", "yaml-and-yml", "data-vs-built-in", "data-vs-yaml"],
)
def test_a_taken_task_name_names_both_sources(tmp_path, monkeypatch, no_model_loads, files, args, says):
    monkeypatch.chdir(tmp_path)
    write_files({"mine.jsonl": [RECORD], "other.jsonl": [RECORD], **files})
    assert run(*args) == "Error: " + says.format(tmp=tmp_path)


# Characters of each of Unicode's C categories a file name can hold: zero-width space, right-to-left
# override, isolates, soft hyphen, byte order mark (Cf), DEL and a C1 control (Cc), private use (Co),
# unassigned (Cn).
HIDDEN = ["\u200b", "\u202e", "\u2066", "\u00ad", "\ufeff", "\x7f", "\x85", "\ue000", "\U000e0080"]


@pytest.mark.parametrize("char", HIDDEN, ids=[f"U+{ord(char):04X}" for char in HIDDEN])
def test_a_task_name_that_would_show_wrong_is_refused(tmp_path, monkeypatch, no_model_loads, char):
    """A task is named after its --data file, or by its YAML: names carry into rows, tables and plot
    file names, where a zero-width or direction character makes two tasks look alike, or text run
    backwards."""
    monkeypatch.chdir(tmp_path)
    write_files(
        {f"my{char}data.jsonl": [RECORD], "mine.jsonl": [RECORD], "t/task.yaml": task_yaml(task=f"a{char}b")}
    )
    assert f"holds U+{ord(char):04X}, which shows as nothing" in run("--data", f"my{char}data.jsonl")
    assert f"holds U+{ord(char):04X}" in run("--include-path", "t", "--task", f"a{char}b")


def test_a_task_name_longer_than_a_table_takes_is_refused(tmp_path, monkeypatch, no_model_loads):
    monkeypatch.chdir(tmp_path)
    write_files({"a" * 101 + ".jsonl": [RECORD], "a" * 100 + ".jsonl": [RECORD]})
    assert "task name of 101 characters, more than 100" in run("--data", "a" * 101 + ".jsonl")
    assert run("--data", "a" * 100 + ".jsonl") == "Error: the checks passed: the model would load now"


@pytest.mark.parametrize(
    ("files", "args", "says"),
    [
        (
            {"a/ruler-smoke.yaml": "tasks: [niah_single_2]\nsamples: 1\n"},
            ["tasks", "--include-path", "a"],
            "{tmp}/a/ruler-smoke.yaml: suite name 'ruler-smoke' is taken by kvbench's built-in suite; "
            "rename the file",
        ),
        (
            {"a/ruler-smoke.yml": "tasks: [niah_single_2]\n"},
            ["run", "--press", "knorm", "--ratio", "0.5", "--include-path", "a", "--suite", "ruler-smoke"],
            "{tmp}/a/ruler-smoke.yml: suite name 'ruler-smoke' is taken by kvbench's built-in suite; "
            "rename the file",
        ),
        (
            {"a/mine.yaml": "tasks: [niah_single_1]\n", "b/mine.yaml": "tasks: [niah_single_2]\n"},
            ["run", "--press", "knorm", "--ratio", "0.5", "--include-path", "a", "--include-path", "b"],
            "{tmp}/b/mine.yaml: suite name 'mine' is taken by {tmp}/a/mine.yaml; rename the file",
        ),
        (
            {"a/mine.yaml": "tasks: [niah_single_1]\n", "a/mine.yml": "tasks: [niah_single_2]\n"},
            ["tasks", "--include-path", "a"],
            "{tmp}/a/mine.yml: suite name 'mine' is taken by {tmp}/a/mine.yaml; rename the file",
        ),
    ],
    ids=["tasks-listing", "run-by-name", "two-folders", "yaml-and-yml"],
)
def test_a_suite_named_like_another_is_refused_naming_both(
    tmp_path, monkeypatch, no_model_loads, files, args, says
):
    monkeypatch.chdir(tmp_path)
    write_files(files)
    assert refused(*args, *(["--out", "out"] if args[0] == "run" else [])) == "Error: " + says.format(
        tmp=tmp_path
    )


def test_the_built_in_suites_folder_may_be_included(no_model_loads):
    from kvbench import tasks

    tasks.include_path(tasks.SUITES_DIR)
    assert tasks.load_suite("ruler-smoke").name == "ruler-smoke"


@pytest.mark.parametrize(
    "args",
    [
        ["run", "--press", "snapkv", "--ratio", "0.5", "--press-arg", "window_size="],
        ["run", "--press", "snapkv", "--ratio", "0.5", "--press-arg", "window_size=  "],
        ["sweep", "--presses", "snapkv,knorm", "--ratios", "0.5", "--press-arg", "snapkv.window_size="],
    ],
    ids=["empty", "blank", "sweep-dotted"],
)
def test_an_empty_press_argument_value_is_refused(tmp_path, monkeypatch, no_model_loads, args):
    monkeypatch.chdir(tmp_path)
    key = args[-1].partition("=")[0]
    assert refused(*args, "--out", "out") == f"Error: press argument {key!r} has an empty value"


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"answers": 42}, "record 1: field 'answers': should be a text or a list of texts (got 42)"),
        (
            {"answers": {"a": 1}},
            "record 1: field 'answers': should be a text or a list of texts (got {'a': 1})",
        ),
        ({"answers": None}, "record 1: field 'answers' is null: should be a text or a list of texts"),
        (
            {"answers": ["x", ["y"]]},
            "record 1: field 'answers.1': input should be a valid string (got ['y'])",
        ),
        ({"id": 1.5}, "record 1: field 'id': should be a text or a whole number (got 1.5)"),
        ({"context": None}, "record 1: field 'context' is null: input should be a valid string"),
        (
            {"question": None, "answers": 3},
            "record 1: field 'answers': should be a text or a list of texts (got 3)",
        ),
    ],
    ids=[
        "answers-number",
        "answers-object",
        "answers-null",
        "answers-nested",
        "id-float",
        "context-null",
        "two",
    ],
)
def test_a_record_of_the_wrong_type_names_the_field_once(
    tmp_path, monkeypatch, no_model_loads, changes, says
):
    monkeypatch.chdir(tmp_path)
    write_files({"mine.jsonl": [{**RECORD, **changes}]})
    line = run("--data", "mine.jsonl")
    more = "; 1 more bad field" if len(changes) > 1 else ""
    assert line == f"Error: {tmp_path}/mine.jsonl: {says}{more}", line
