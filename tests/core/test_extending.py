"""A user's own press, data, metric and suite, from files outside kvbench, through the CLI and the API;
installed plugins through entry points; and the one-line refusals of what cannot be used. (On Ray workers:
tests/harness/test_ray_sweep.py.)"""

import json
import re
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

import kvbench
from kvbench import tasks
from kvbench.cli import main
from kvbench.presses import PRESSES
from kvbench.tasks import jsonl

PRESS_FILE = '''
from dataclasses import dataclass

from kvpress import ScorerPress


@dataclass
class ValueNormPress(ScorerPress):
    """Evict the entries whose values have the smallest norm."""

    compression_ratio: float = 0.0
    power: float = 2.0

    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        return values.abs().pow(self.power).sum(dim=-1){edit}
'''


def write_press(folder: Path, edit: str = "") -> Path:
    path = folder / "my_press.py"
    path.write_text(PRESS_FILE.format(edit=edit))
    return path


def write_data(folder: Path, count: int = 3, name: str = "mine.jsonl") -> Path:
    path = folder / name
    lines = [
        {
            "id": f"s{i}",
            "context": f"The code of box {i} is {100 + i}. " * 8,
            "question": f"Code of box {i}?",
            "answers": [str(100 + i)],
        }
        for i in range(count)
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def invoke(*args):
    return CliRunner().invoke(main, [str(arg) for arg in args])


def rows_of(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "rows.jsonl").read_text().splitlines()]


def test_a_press_file_runs_beside_a_built_in_and_an_edit_is_scored_again(tmp_path, tiny_llama_dir):
    press = write_press(tmp_path)
    data = write_data(tmp_path)
    out = tmp_path / "out"
    args = ["sweep", "--presses", f"{press}:ValueNormPress,knorm", "--ratios", "0.5", "--data", data]
    args += ["--length", 256, "--model", tiny_llama_dir, "--out", out]
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    rows = rows_of(out)
    mine = [row for row in rows if row["press"] == "ValueNormPress"]
    assert len(rows) == 9 and len(mine) == 3 and {row["task"] for row in rows} == {"mine"}
    source = mine[0]["press_source"]
    digest = __import__("hashlib").sha256(press.read_bytes()).hexdigest()
    assert source["file"] == str(press.resolve()) and source["sha256"] == digest
    assert source["qualname"] == "ValueNormPress" and mine[0]["press_state"] == digest[:12]
    assert all(row["press_source"] is None for row in rows if row["press"] != "ValueNormPress")
    assert all(row["meta"]["metric"] == "qa_f1" for row in rows)
    record = json.loads(next((out / "runs").glob("*.json")).read_text())
    assert record["config"]["press_sources"]["ValueNormPress"]["sha256"] == digest
    assert (
        record["config"]["data_tasks"]["mine"]["sha256"]
        == __import__("hashlib").sha256(data.read_bytes()).hexdigest()
    )
    # Unchanged: nothing to compute. Edited: its rows again, under another state; the others are kept.
    assert invoke(*args).exit_code == 0 and len(rows_of(out)) == 9
    write_press(tmp_path, edit=" + 0.0")
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    rows = rows_of(out)
    states = {row["press_state"] for row in rows if row["press"] == "ValueNormPress"}
    assert len(rows) == 12 and len(states) == 2
    # Said before the work, counted by the bar, named in the summary: what was reused, why, which version.
    said = f"6 of 9 rows reused from {out}, 3 to compute (3 edited press); edited since their rows were"
    assert said in result.output and "3/3" in result.output and "/9" not in result.output
    edited = __import__("hashlib").sha256(press.read_bytes()).hexdigest()[:12]
    assert f"version of ValueNormPress: {press.resolve()}, sha256 {edited}" in result.output


def test_the_api_takes_press_objects_factories_and_targets(tmp_path, tiny_llama_dir, monkeypatch):
    write_press(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    from my_press import ValueNormPress  # ty: ignore[import-not-found]

    def halved_power(ratio, power=1.0):
        return ValueNormPress(compression_ratio=ratio, power=power / 2)

    setup = dict(data=[write_data(tmp_path)], length=256, model=tiny_llama_dir, progress=False)
    frame = kvbench.sweep(
        {"mine": ValueNormPress, "factory": halved_power, "bymodule": "my_press:ValueNormPress"},
        [0.5],
        press_args={"mine.power": 1.0, "factory.power": 2.0},
        out=tmp_path / "out",
        **setup,
    )
    assert sorted(set(frame.press)) == ["bymodule", "factory", "mine", "none"]
    args = {press: args for press, args in zip(frame.press, frame.press_args, strict=True)}
    assert args == {"none": {}, "mine": {"power": 1.0}, "factory": {"power": 2.0}, "bymodule": {}}
    # The same class by object and by module target: one source; the factory's is its own file.
    sources = {press: source for press, source in zip(frame.press, frame.press_source, strict=True)}
    assert sources["mine"]["target"] == "my_press:ValueNormPress" == sources["bymodule"]["target"]
    assert sources["factory"]["file"] == str(Path(__file__).resolve())
    # mine at power 1 and the factory at power 2 / 2 keep the same entries: the same answers.
    by_press = frame.set_index(["press", "sample_id"]).prediction
    assert (by_press["mine"] == by_press["factory"]).all()


def test_press_args_go_to_the_press_they_name(tmp_path):
    from kvbench.harness.planning import configs_for_sweep

    configs = configs_for_sweep(
        "snapkv,knorm,tova", "0.5", press_args={"snapkv.window_size": 16, "tova.window_size": 8}
    )
    assert {config.press: dict(config.press_args) for config in configs} == {
        "none": {},
        "snapkv": {"window_size": 16},
        "knorm": {},
        "tova": {"window_size": 8},
    }
    result = invoke("sweep", "--presses", "knorm", "--ratios", "0.5", "--press-arg", "kvp.agents=x")
    assert result.exit_code == 2
    assert result.output == "Error: press argument 'kvp.agents' names press 'kvp', which is not among knorm\n"


PLUGIN = '''
from dataclasses import dataclass

from kvpress import ScorerPress


@dataclass
class KeySumPress(ScorerPress):
    """Plugin press: keys' sum as the score."""

    compression_ratio: float = 0.0

    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        return keys.sum(dim=-1)


def exact(prediction, references):
    return float(prediction.strip() in references)


class NotAPress:
    pass
'''


def install_plugin(folder: Path, points: dict[str, str]) -> Path:
    """A package `kvplug` and its dist-info with `points` ({group: entry lines}), importable from `folder`:
    what `pip install` of a package declaring entry points leaves."""
    (folder / "kvplug").mkdir(parents=True)
    (folder / "kvplug" / "__init__.py").write_text(PLUGIN)
    (folder / "kvplug" / "quits.py").write_text("raise SystemExit(3)\n")  # a module that exits when imported
    info = folder / "kvplug-0.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kvplug\nVersion: 0.3\n")
    (info / "top_level.txt").write_text("kvplug\n")
    (info / "RECORD").write_text("kvplug/__init__.py,,\n")
    (info / "entry_points.txt").write_text(
        "".join(f"[{group}]\n{lines}\n" for group, lines in points.items())
    )
    return folder


def test_an_installed_plugin_press_and_metric_run_by_name(tmp_path, tiny_llama_dir, monkeypatch):
    points = {
        "kvbench.presses": "keysum = kvplug:KeySumPress",
        "kvbench.metrics": "plug_exact = kvplug:exact",
    }
    monkeypatch.syspath_prepend(str(install_plugin(tmp_path / "site", points)))
    PRESSES.points = tasks.METRICS.points = None  # look again at what is installed
    listing = invoke("presses").output
    (line,) = [line.split() for line in listing.splitlines() if line.startswith("keysum ")]
    assert " ".join(line) == "keysum Plugin press: keys' sum as the score. [from kvplug 0.3]"
    out = tmp_path / "out"
    args = ["run", "--press", "keysum", "--ratio", "0.5", "--data", write_data(tmp_path, 2)]
    result = invoke(*args, "--metric", "plug_exact", "--length", 256, "--model", tiny_llama_dir, "--out", out)
    assert result.exit_code == 0, result.output
    rows = rows_of(out)
    assert len(rows) == 2 and all(row["press_source"]["package"] == "kvplug" for row in rows)
    assert all(
        row["press_source"]["version"] == "0.3" and row["meta"]["metric"] == "plug_exact" for row in rows
    )
    assert all(row["score"] == 100.0 * (row["prediction"].strip() in row["references"]) for row in rows)


@pytest.mark.parametrize(
    ("points", "press", "message"),
    [
        (
            {"kvbench.presses": "broken = kvplug.missing:Press"},
            "broken",
            "presses plugin 'broken' (kvplug.missing:Press, from kvplug) failed to load: ModuleNotFoundError",
        ),
        (
            {"kvbench.presses": "quits = kvplug.quits:Press"},
            "quits",
            "presses plugin 'quits' (kvplug.quits:Press, from kvplug) failed to load: SystemExit: 3",
        ),
        (
            {"kvbench.presses": "odd = kvplug:NotAPress"},
            "odd",
            "presses plugin 'odd' (kvplug:NotAPress, from kvplug): press 'kvplug:NotAPress': NotAPress is "
            "not a kvpress press",
        ),
    ],
)
def test_a_plugin_that_cannot_be_used_is_one_line_before_any_work(
    tmp_path, monkeypatch, points, press, message
):
    monkeypatch.syspath_prepend(str(install_plugin(tmp_path / "site", points)))
    PRESSES.points = None
    out = tmp_path / "out"
    result = invoke("run", "--press", press, "--ratio", "0.5", "--out", out)
    assert result.exit_code == 2 and result.output.startswith(f"Error: {message}"), result.output
    assert result.output.count("\n") == 1 and not out.exists()


BAD_PRESSES = {
    "syntax.py": ("class P(:\n", "fails to import: SyntaxError"),
    "nobase.py": ("class P:\n    pass\n", "P is not a kvpress press"),
    "exits.py": ("import sys\n\nsys.exit(0)\n", "fails to import: SystemExit: 0"),
    "generator_exit.py": ("raise GeneratorExit('closed')\n", "fails to import: GeneratorExit: closed"),
    "exits_in_score.py": (
        PRESS_FILE.replace("return values", "raise SystemExit(0) or values")
        .format(edit="")
        .replace("ValueNormPress", "P"),
        "a press exited on sample trial/0 (SystemExit: 0)",
    ),
    "noratio.py": (
        "from dataclasses import dataclass\nfrom kvpress import BasePress\n\n"
        "@dataclass\nclass P(BasePress):\n    window: int = 4\n",
        "P has no compression_ratio field",
    ),
    "crashes.py": (
        PRESS_FILE.replace("return values", "return undefined_name + values")
        .format(edit="")
        .replace("ValueNormPress", "P"),
        "press 'P' fails on a 512-token prefill of a tiny model: NameError",
    ),
}


@pytest.mark.parametrize("file", sorted(BAD_PRESSES))
def test_a_press_file_that_cannot_run_is_one_line_before_the_model_loads(tmp_path, file):
    text, message = BAD_PRESSES[file]
    (tmp_path / file).write_text(text)
    out = tmp_path / "out"
    result = invoke("run", "--press", f"{tmp_path / file}:P", "--ratio", "0.5", "--length", 512, "--out", out)
    assert result.exit_code == 2 and message in result.output and result.output.count("\n") == 1, (
        result.output
    )
    assert not out.exists()


@pytest.mark.parametrize(
    ("press", "message"),
    [
        ("knorm=PATH:ValueNormPress", "press name 'knorm' is taken by a built-in press"),
        ("PATH:Missing", "has no 'Missing'"),
        ("no_such_module_x:P", "cannot import 'no_such_module_x'"),
        ("kvplug.quits:P", "cannot import 'kvplug.quits': SystemExit: 3"),
        ("x=knorm", "NAME= names a press of your own given by its target"),
        ("PATH", "name the class in the file, as"),
        ("a.b=PATH:ValueNormPress", "press name 'a.b': use letters, digits, _ and -"),
        ("PATH.txt:P", "is not a file"),
    ],
)
def test_press_targets_that_name_no_press_are_refused(tmp_path, monkeypatch, press, message):
    path = write_press(tmp_path)
    monkeypatch.syspath_prepend(str(install_plugin(tmp_path / "site", {})))
    result = invoke(
        "run", "--press", press.replace("PATH", str(path)), "--ratio", "0.5", "--out", tmp_path / "o"
    )
    assert result.exit_code == 2 and message in result.output, result.output


def test_a_suite_yaml_with_its_task_yaml_runs_from_its_path(tmp_path, tiny_llama_dir, embedded_tokenizer):
    write_data(tmp_path, 2, "boxes.jsonl")
    (tmp_path / "boxes.yaml").write_text(
        textwrap.dedent("""\
            task: boxes
            data: boxes.jsonl
            metric: exact_match
            fields: {question: question}
            templates: {question: "{{ question }} Answer with the number only."}
            answer_prefix: "Code:"
            max_new_tokens: 4
            description: box codes
        """)
    )
    (tmp_path / "my_suite.yaml").write_text("tasks: [boxes, niah_single_1]\nsamples: 2\nlength: 512\n")
    out = tmp_path / "out"
    result = invoke(
        "run",
        "--press",
        "knorm",
        "--ratio",
        "0.5",
        "--suite",
        tmp_path / "my_suite.yaml",
        "--model",
        tiny_llama_dir,
        "--out",
        out,
    )
    assert result.exit_code == 0, result.output
    rows = rows_of(out)
    assert sorted({row["task"] for row in rows}) == ["boxes", "niah_single_1"] and len(rows) == 4
    record = json.loads(next((out / "runs").glob("*.json")).read_text())
    assert (
        record["config"]["suite"] == "my_suite"
        and record["config"]["data_tasks"]["boxes"]["metric"] == "exact_match"
    )
    samples = jsonl.make_samples("boxes", 256, 2, 0, embedded_tokenizer, None)
    assert (
        samples[0].question == "Code of box 0? Answer with the number only."
        and samples[0].answer_prefix == "Code:"
    )
    # The folder given with --include-path: its tasks and suites by name.
    result = invoke("tasks", "--include-path", tmp_path)
    assert "boxes" in result.output and "my_suite" in result.output, result.output


def test_data_from_parquet_and_a_datasets_folder_read_as_the_jsonl(tmp_path):
    import datasets

    path = write_data(tmp_path, 3)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    datasets.Dataset.from_list(records).to_parquet(str(tmp_path / "mine.parquet"))
    datasets.DatasetDict({"test": datasets.Dataset.from_list(records)}).save_to_disk(str(tmp_path / "folder"))
    read = [
        jsonl.checked_records(jsonl.data_task(tmp_path / name))
        for name in ("mine.jsonl", "mine.parquet", "folder")
    ]
    assert read[0] == read[1] == read[2] and [record["id"] for record in read[0]] == ["s0", "s1", "s2"]


def test_a_user_metric_scores_each_answer(tmp_path):
    (tmp_path / "metrics.py").write_text(
        "def longer(prediction, references):\n    return float(len(prediction) > 3)\n"
    )
    name = tasks.resolve_metric(f"{tmp_path / 'metrics.py'}:longer")
    sample = tasks.Sample("t", "0", "c", "q", "", ["x"], 4, name)
    assert tasks.score_sample(sample, "abcd") == 100.0 and tasks.score_sample(sample, "ab") == 0.0


@pytest.mark.parametrize(
    ("files", "args", "message"),
    [
        (
            {"d.jsonl": '{"context": "c", "question": "q"}\n'},
            ["--data", "d.jsonl"],
            "d.jsonl: record 1: no 'answers'",
        ),
        (
            {"d.jsonl": '{"context": "c", "question": "q", "answers": []}\n'},
            ["--data", "d.jsonl"],
            "record 1: 'answers' holds no reference answer",
        ),
        (
            {"d.jsonl": '{"context": 5, "question": "q", "answers": "a"}\n'},
            ["--data", "d.jsonl"],
            "record 1: field 'context': input should be a valid string",
        ),
        ({"d.jsonl": "[1]\n"}, ["--data", "d.jsonl"], "d.jsonl:1: not a record"),
        (
            {"d.jsonl": '{"id": 1, "context": "c", "question": "q", "answers": "a"}\n' * 2},
            ["--data", "d.jsonl"],
            "record 2: id '1' is also the id of record 1",
        ),
        ({"d.csv": "a,b\n"}, ["--data", "d.csv"], "give a .jsonl or .parquet file or a datasets folder"),
        (
            {"d.jsonl": '{"context": "c", "question": "q", "answers": "a"}\n'},
            ["--data", "d.jsonl", "--metric", "nope"],
            "unknown metric 'nope'",
        ),
        (
            {
                "m.py": "def f(prediction):\n    return 1.0\n",
                "d.jsonl": '{"context": "c", "question": "q", "answers": "a"}\n',
            },
            ["--data", "d.jsonl", "--metric", "m.py:f"],
            "m.py:f': a metric takes (prediction, references)",
        ),
        ({}, ["--metric", "qa_f1"], "--metric qa_f1 scores no task of the run"),
        ({"s.yaml": 'tasks: [niah_single_1]\nlength: "512"\n'}, ["--suite", "s.yaml"], "field 'length'"),
        ({"s.yaml": "tasks:\n"}, ["--suite", "s.yaml"], "field 'tasks'"),
        ({"s.yaml": "tasks: niah_single_1\n"}, ["--suite", "s.yaml"], "field 'tasks'"),
        ({"s.yaml": "tasks: [niah_single_1]\nsampels: 2\n"}, ["--suite", "s.yaml"], "field 'sampels'"),
        (
            {"s.yaml": "a: &a [x, x]\nb: &b [*a, *a]\ntasks: [*b]\n"},
            ["--suite", "s.yaml"],
            "aliases (*name) are not read",
        ),
        (
            {"t.yaml": "task: t\ndata: missing.jsonl\nmetrik: qa_f1\n"},
            ["--include-path", "."],
            "field 'metrik'",
        ),
        (
            {},
            ["--task", "niah_single_1", "--data-dir", "."],
            "--data-dir applies to tasks that read local files",
        ),
    ],
)
def test_bad_data_suites_and_metrics_are_one_line_and_write_nothing(
    tmp_path, monkeypatch, files, args, message
):
    monkeypatch.chdir(tmp_path)
    for name, text in files.items():
        Path(name).write_text(text)
    result = invoke("run", "--press", "knorm", "--ratio", "0.5", *args, "--out", "out")
    assert result.exit_code == 2 and message in result.output and result.output.count("\n") == 1, (
        result.output
    )
    assert not Path("out").exists()


def test_two_files_of_one_content_are_two_sources(tmp_path):
    from kvbench.presses import resolve_press

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first, second = write_press(tmp_path / "a"), write_press(tmp_path / "b")
    names = [
        resolve_press(f"{name}={path}:ValueNormPress") for name, path in (("one", first), ("two", second))
    ]
    files = [PRESSES[name].source.file for name in names]
    assert files == [str(first.resolve()), str(second.resolve())]
    assert PRESSES["one"].source.sha256 == PRESSES["two"].source.sha256


@pytest.mark.parametrize("end", ["\n", "\r\n", "\r"])
def test_a_data_file_reads_alike_with_any_line_end_and_raw_u2028(tmp_path, end):
    """The user's JSONL goes through the one line splitter of every JSONL reader: lines end at \\n, \\r\\n
    or a lone \\r, never at a U+2028 written raw inside a string (as `jq -c` writes it)."""
    lines = [
        json.dumps(
            {"context": f"box {i}\u2028line two", "question": "q?", "answers": [str(i)]}, ensure_ascii=False
        )
        for i in range(3)
    ]
    path = tmp_path / "mine.jsonl"
    path.write_bytes(end.join(lines).encode())
    records = jsonl.checked_records(jsonl.data_task(path))
    assert [record["context"] for record in records] == [f"box {i}\u2028line two" for i in range(3)]


BROKEN_POINTS = ["kvplug.quits:P", "kvplug:NotAPress", "kvplug_missing:X", "kvplug:nothing_here"]


@pytest.mark.parametrize("point", BROKEN_POINTS)
@pytest.mark.parametrize("group", ["kvbench.tasks", "kvbench.presses"])
def test_a_broken_plugin_stops_only_what_names_it(tmp_path, monkeypatch, point, group):
    """`kvbench tasks` and `kvbench presses` list the rest with one warning line for it; a run that never
    uses it passes its checks; naming it (its press, or a task no family that loads holds) says why."""
    from kvbench.bridge import models

    monkeypatch.syspath_prepend(str(install_plugin(tmp_path / "site", {group: f"broken = {point}"})))
    PRESSES.points = tasks.TASK_FAMILIES.points = None
    PRESSES.failed.clear(), tasks.TASK_FAMILIES.failed.clear()

    def refuse(*args, **kwargs):
        raise kvbench.BadInput("the checks passed: the model would load now")

    monkeypatch.setattr(models, "load_model", refuse)
    kind = "tasks" if group == "kvbench.tasks" else "presses"
    for command, listed in (("tasks", "niah_single_1"), ("presses", "knorm")):
        result = invoke(command)
        warnings = [line for line in result.output.splitlines() if line.startswith("Warning: ")]
        assert result.exit_code == 0 and listed in result.output, result.output
        assert warnings == ([] if kind != command else [warnings[0]]), warnings
        assert all(f"{kind} plugin 'broken' ({point}, from kvplug)" in line for line in warnings), warnings
    run = ["run", "--ratio", "0.5", "--length", 512, "--samples", 1, "--out", tmp_path / "out"]
    result = invoke(*run, "--press", "knorm", "--task", "niah_single_1")
    assert result.output.strip() == "Error: the checks passed: the model would load now", result.output
    named = ["--press", "broken", "--task", "niah_single_1"] if kind == "presses" else ["--task", "mine"]
    result = invoke(*run, *(["--press", "knorm"] if kind == "tasks" else []), *named)
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and f"{kind} plugin 'broken' ({point}" in lines[0], lines


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (
            ["perplexity", "--presses", "PRESS", "--ratios", "0.5", "--length", 256, "--texts", 1],
            "checks passed",
        ),
        (["prefix-cache", "--press", "PRESS", "--ratio", "0.5"], "checks passed"),
        (["lm-eval", "--press", "PRESS", "--ratio", "0.5", "--tasks", "nope_task"], "unknown lm-eval task"),
    ],
    ids=["perplexity", "prefix-cache", "lm-eval"],
)
@pytest.mark.parametrize("target", ["my_press.py:ValueNormPress", "mine=my_press.py:ValueNormPress"])
def test_every_command_that_takes_a_press_takes_a_press_file(tmp_path, monkeypatch, args, says, target):
    from kvbench.bridge import models

    monkeypatch.chdir(tmp_path)
    write_press(tmp_path)

    def refuse(*args, **kwargs):
        raise kvbench.BadInput("the checks passed: the model would load now")

    monkeypatch.setattr(models, "load_model", refuse)
    result = invoke(*[target if arg == "PRESS" else arg for arg in args], "--out", tmp_path / "out")
    assert result.exit_code == 2 and says in result.output.strip().splitlines()[-1], result.output


def test_lm_eval_kvbench_takes_a_press_file(tmp_path, monkeypatch):
    from kvbench.bridge import models
    from kvbench.harness.lmeval import KVBenchLM

    monkeypatch.chdir(tmp_path)
    write_press(tmp_path)

    def refuse(*args, **kwargs):
        raise kvbench.BadInput("the checks passed: the model would load now")

    monkeypatch.setattr(models, "load_model", refuse)
    monkeypatch.setattr("kvbench.harness.lmeval.load_model", refuse)
    with pytest.raises(kvbench.BadInput, match="the checks passed"):
        KVBenchLM("smollm2-135m", press="my_press.py:ValueNormPress", compression_ratio=0.5)


@pytest.mark.parametrize("route", ["data", "suite"])
def test_the_report_names_the_runs_and_press_sources_of_own_data(tmp_path, tiny_llama_dir, route):
    """A sweep of a press file on the user's data, through --data or a suite YAML without a length (each
    task at its own length, which the run records only per task): the report names the run record, its
    command, and the press file with its sha256."""
    press, data = write_press(tmp_path), write_data(tmp_path, 2)
    if route == "data":
        where = ["--data", data]
    else:
        (tmp_path / "mine.yaml").write_text("task: mine\ndata: mine.jsonl\nmetric: exact_match\n")
        (tmp_path / "my_suite.yaml").write_text("tasks: [mine]\nsamples: 2\n")
        where = ["--suite", tmp_path / "my_suite.yaml"]
    out = tmp_path / "out"
    args = ["sweep", "--presses", f"mine={press}:ValueNormPress,knorm", "--ratios", "0.5", *where]
    result = invoke(*args, "--model", tiny_llama_dir, "--out", out)
    assert result.exit_code == 0, result.output
    assert invoke("report", out, "--out", tmp_path / "report").exit_code == 0
    readme = (tmp_path / "report" / "README.md").read_text()
    digest = __import__("hashlib").sha256(press.read_bytes()).hexdigest()
    assert "No runs/*.json" not in readme
    assert f"`{out}` (1 run record)" in readme and f"Run 1: `{out}`" in readme
    assert f"mine: {press}:ValueNormPress (file {press.resolve()}, sha256 {digest}); run 1" in readme
    assert "knorm: kvbench's registry (see kvbench presses); run 1" in readme
    assert re.search(r"length \d+ \(a cap: contexts of \d+-\d+ tokens\)", readme)  # not the contexts' length
    write_press(tmp_path, edit=" + 0.0")  # an edit: the press's rows again, under its new source
    assert invoke(*args, "--model", tiny_llama_dir, "--out", out).exit_code == 0
    assert invoke("report", out, "--out", tmp_path / "report").exit_code == 0
    readme = (tmp_path / "report" / "README.md").read_text()
    assert f"mine on {tiny_llama_dir}: rows of 2 versions of its source ({press.resolve()})" in readme
    assert "learned state" not in readme
