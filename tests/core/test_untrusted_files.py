"""A suite or task YAML is data that people share: it runs no code. Its templates render in a sandbox
capped in size (`kvbench.core.templates`), and what it names as a metric is imported only when the user
gave that code on the command line (or registered it); otherwise one line says how to allow it."""

import itertools
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvbench import tasks
from kvbench.bridge import models
from kvbench.cli import main
from kvbench.core.errors import BadInput
from kvbench.core.templates import MAX_OUTPUT
from kvbench.tasks import jsonl
from tests.cli.test_user_data_checks import RECORD, task_yaml, write_files

# Ways into Python's globals from what Jinja puts in a template's reach, and what each then runs: every
# pairing must be refused, whichever route a shared file takes.
ENTRIES = [
    "cycler.__init__.__globals__",
    "joiner.__init__.__globals__",
    "namespace.__init__.__globals__",
    "lipsum.__globals__",
    "self._TemplateReference__context.cycler.__init__.__globals__",
    "context.__class__.__mro__[1].__subclasses__()[0].__init__.__globals__",
]
ACTIONS = [
    ".os.system('touch PWNED')",
    "['os'].popen('touch PWNED').read()",
    "['__builtins__']['open']('PWNED', 'w').write('x')",
]
ESCAPES = [f"{{{{ {entry}{action} }}}}" for entry, action in itertools.product(ENTRIES, ACTIONS)]

# Templates that would build more than the sandbox's cap (each small enough that an unsandboxed render
# finishes, so that the test fails on the old code rather than hanging it).
BIG = 10 * MAX_OUTPUT
EXHAUSTING = [
    f"{{{{ range({BIG})|list|length }}}}",
    f"{{{{ 'x' * {BIG} }}}}",
    f"{{{{ context * {BIG} }}}}",
    f"{{{{ ['x'] * {BIG} }}}}",
    f"{{{{ 'x' * {BIG // 10**4} * 10**4 }}}}",
    f"{{{{ 2 ** {BIG} }}}}",
    f"{{{{ context|center({BIG}) }}}}",
    f"{{{{ context.ljust({BIG}) }}}}",
    f"{{{{ '%*d' % ({BIG}, 1) }}}}",
    f"{{{{ '{{:>{BIG}}}'.format(1) }}}}",
    f"{{% for i in range(99999) %}}{{{{ context * {MAX_OUTPUT // 1000} }}}}{{% endfor %}}",
]


@pytest.fixture
def no_model_loads(monkeypatch):
    """Past every check, a run would load its model: it says so in one line instead."""

    def refuse(*args, **kwargs):
        raise BadInput("the checks passed: the model would load now")

    monkeypatch.setattr(models, "load_model", refuse)


def refused_run(*args) -> str:
    result = CliRunner().invoke(
        main,
        ["run", "--press", "knorm", "--ratio", "0.5", "--length", "256", *args, "--out", "out"],
    )
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and "Traceback" not in result.output, result.output
    assert not Path("out").exists()
    return lines[0]


@pytest.mark.parametrize("template", ESCAPES + EXHAUSTING)
@pytest.mark.parametrize("field", ["context", "question"])
def test_a_task_yaml_template_runs_no_code_and_builds_nothing_past_the_cap(
    tmp_path, monkeypatch, no_model_loads, template, field
):
    monkeypatch.chdir(tmp_path)
    write_files(
        {
            "s/mine.jsonl": [RECORD],
            "s/task.yaml": task_yaml(templates={field: template + "{{ " + field + " }}"}),
            "s/suite.yaml": {"tasks": ["mytask"]},
        }
    )
    line = refused_run("--suite", "s/suite.yaml")
    where = f"Error: {tmp_path}/s/task.yaml: template of {field!r} fails on record 1 of "
    assert line.startswith(where), line
    assert "SecurityError" in line or "unsafe" in line, line
    assert not Path("PWNED").exists() and not Path("s/PWNED").exists()


@pytest.mark.parametrize(
    "template",
    [
        "{{ title|upper }}: {{ context }}",
        "{% for word in context.split() %}{{ word|lower }} {% endfor %}",
        "{{ '%s (%d)' % (context, 3) }} {{ '{:>5}'.format(title) }} {{ context * 2 }} {{ 2 ** 10 }}",
        "{{ context|center(80)|trim }} {{ range(10)|join(',') }}",
    ],
)
def test_ordinary_templates_render_as_jinja_does(template):
    import jinja2

    from kvbench.core.templates import render_capped, sandboxed_environment

    record = {**RECORD, "title": "Box"}
    sandboxed = sandboxed_environment(undefined=jinja2.StrictUndefined).from_string(template)
    plain = jinja2.Environment(undefined=jinja2.StrictUndefined).from_string(template)
    assert render_capped(sandboxed, record) == plain.render(record)


# Code a task YAML may name as its metric, each with what importing or calling it would do.
SIDE_EFFECT = "import pathlib\npathlib.Path('IMPORTED').touch()\n\ndef f(prediction, references):\n"
SIDE_EFFECT += "    pathlib.Path('CALLED').touch()\n    return 1.0\n"
NAMED_CODE = ["shutil:rmtree", "os:remove", "side:f", "side.py:f", "./side.py:f", "sub/../side.py:f"]


@pytest.mark.parametrize("metric", NAMED_CODE)
@pytest.mark.parametrize("entry", ["suite", "include-path"])
def test_a_task_yaml_imports_and_calls_no_code_it_names(tmp_path, monkeypatch, no_model_loads, metric, entry):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path / "s"))  # `side:f` would import from there
    write_files(
        {
            "s/mine.jsonl": [RECORD],
            "s/side.py": SIDE_EFFECT,
            "s/sub/.keep": "",
            "s/task.yaml": task_yaml(metric=metric),
            "s/suite.yaml": {"tasks": ["mytask"]},
            "a/.keep": "",
        }
    )
    args = ["--suite", "s/suite.yaml"] if entry == "suite" else ["--include-path", "s", "--task", "mytask"]
    line = refused_run(*args)
    assert line.startswith(f"Error: {tmp_path}/s/task.yaml: metric {metric!r} is code, which a task YAML "), (
        line
    )
    assert line.endswith(
        "give it on the command line: --metric " + tasks.metric_target(metric, tmp_path / "s")
    )
    assert not list(tmp_path.rglob("IMPORTED")) and not list(tmp_path.rglob("CALLED"))
    assert Path("a").is_dir()


def test_a_metric_given_on_the_command_line_is_what_a_task_yaml_may_name(
    tmp_path, monkeypatch, no_model_loads
):
    """The YAML's `m.py:f` resolves from the YAML's folder, as its `data:` does; the metric is imported,
    never called before it scores an answer."""
    monkeypatch.chdir(tmp_path)
    write_files(
        {
            "s/mine.jsonl": [RECORD],
            "s/side.py": SIDE_EFFECT,
            "side.py": "def f(prediction, references):\n    return 0.0\n",  # another file of that name
            "s/task.yaml": task_yaml(metric="side.py:f"),
        }
    )
    line = refused_run("--include-path", "s", "--task", "mytask", "--metric", "side.py:f")
    assert line.startswith(f"Error: {tmp_path}/s/task.yaml: metric 'side.py:f' is code"), line
    line = refused_run("--include-path", "s", "--task", "mytask", "--metric", "s/side.py:f")
    assert line == "Error: the checks passed: the model would load now"
    assert Path("IMPORTED").exists() and not Path("CALLED").exists()


def test_a_user_metric_keys_its_samples_by_its_file(tmp_path, monkeypatch, embedded_tokenizer):
    """An edited metric file, or another file of the same name in another folder, scores anew: the
    samples (and so the rows' content hash) carry the digest of the file that scores them."""
    monkeypatch.chdir(tmp_path)
    write_files({"mine.jsonl": [RECORD], "a/m.py": "def f(p, r):\n    return 1.0\n"})
    write_files({"b/m.py": "def f(p, r):\n    return 0.0\n"})

    hashes = []

    def content_hash(folder: str) -> str:
        data = tmp_path / f"data{len(hashes)}.jsonl"  # a task of its own each time (its name is no key)
        data.write_text((tmp_path / "mine.jsonl").read_text())
        monkeypatch.chdir(tmp_path / folder)
        name = tasks.register_data_task(jsonl.data_task(data, tasks.resolve_metric("m.py:f")))
        (sample,) = jsonl.make_samples(name, 256, 1, 0, embedded_tokenizer, None)
        hashes.append(sample.content_hash())
        return hashes[-1]

    first = content_hash("a")
    assert content_hash("a") == first
    assert content_hash("b") != first
    Path(tmp_path / "a/m.py").write_text("def f(p, r):\n    return 0.5\n")
    assert content_hash("a") != first


@pytest.mark.parametrize(("records", "asked"), [(2, 50), (1, 2), (3, 3)])
def test_more_samples_than_records_is_said(tmp_path, caplog, embedded_tokenizer, records, asked):
    data = tmp_path / f"few{records}{asked}.jsonl"
    write_files({str(data): [{**RECORD, "id": f"s{i}"} for i in range(records)]})
    name = tasks.register_data_task(jsonl.data_task(data))
    with caplog.at_level("WARNING"):
        made = jsonl.make_samples(name, 256, asked, 0, embedded_tokenizer, None)
    assert len(made) == min(records, asked)
    said = [record.getMessage() for record in caplog.records if "samples asked for" in record.getMessage()]
    expected = f"{name}: {asked} samples asked for, {data} holds {records} records"
    assert said == ([expected] if asked > records else [])
