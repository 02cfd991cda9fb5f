"""`--tokenizer` (and a suite's `tokenizer:`): samples sized and generated with another tokenizer than the
model's, on a character-level tokenizer built here and the tiny model; the leaderboard suites and the
command docs/usage.md gives for them."""

import json
import re
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from kvbench.bridge import models
from kvbench.cli import main
from kvbench.core.config import Config
from kvbench.core.errors import DataFileError
from kvbench.harness import runner
from kvbench.harness.planning import plan_tasks
from kvbench.store.results import load_rows
from kvbench.tasks import load_suite, ruler

USAGE = Path(__file__).resolve().parents[2] / "docs" / "usage.md"
LEADERBOARD_TOKENIZER = "meta-llama/Meta-Llama-3.1-8B"  # kvpress's evaluation/benchmarks/ruler/generate.sh


@pytest.fixture(scope="module")
def char_tokenizer_dir(tmp_path_factory) -> str:
    """A tokenizer folder whose every character is a token: about four times the tokens SmolLM2 counts."""
    from tokenizers import Regex, Tokenizer, pre_tokenizers
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(WordLevel({"<unk>": 0, "<s>": 1, "</s>": 2}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    folder = tmp_path_factory.mktemp("char-tokenizer")
    PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        clean_up_tokenization_spaces=False,
    ).save_pretrained(folder)
    return str(folder)


def invoke(*args):
    return CliRunner().invoke(main, [str(arg) for arg in args])


def ruler_tokens(tokenizer, sample) -> int:
    """RULER's count of a sample's input (`ruler.fit`): context, question and answer prefix (its space)."""
    text = sample.context + sample.question + " " + sample.answer_prefix
    return ruler.count_tokens(tokenizer, text)


def test_samples_sized_by_another_tokenizer_fit_the_length_by_it(
    tmp_path, char_tokenizer_dir, tiny_llama_dir
):
    config = Config("none", 0.0)
    setup = dict(tasks=["niah_single_2"], length=1024, samples=2, model=tiny_llama_dir, out=tmp_path)
    plan, _, own = runner.prepare_plan([config], tokenizer=char_tokenizer_dir, **setup)
    sizer = runner.sizing_tokenizer(char_tokenizer_dir)
    by_other = runner.plan_samples(plan, sizer)
    budget = 1024 - by_other[0].max_new_tokens
    for sample in by_other:  # filled up to the budget (within 64) in the other tokenizer's tokens
        assert budget - 64 < ruler_tokens(sizer, sample) <= budget
        assert ruler_tokens(own, sample) < budget / 2  # ... which the model's own counts far fewer of
    plain, _, _ = runner.prepare_plan([config], **setup)
    by_own = runner.plan_samples(plain, own)
    assert plan.tokenizer == char_tokenizer_dir and plain.tokenizer is None
    assert [s.id for s in by_other] == [s.id for s in by_own]
    assert {s.content_hash() for s in by_other}.isdisjoint(s.content_hash() for s in by_own)


def test_the_option_is_recorded_and_another_tokenizer_never_resumes_its_rows(
    tmp_path, char_tokenizer_dir, tiny_llama_dir
):
    out = tmp_path / "results"
    common = ["--task", "niah_single_1", "--length", 1024, "--samples", 1, "--model", tiny_llama_dir]
    args = ["run", "--press", "knorm", "--ratio", 0.5, *common, "--out", out]
    result = invoke(*args, "--tokenizer", char_tokenizer_dir)
    assert result.exit_code == 0, result.output
    [record] = [json.loads(path.read_text()) for path in (out / "runs").glob("*.json")]
    assert record["config"]["tokenizer"] == char_tokenizer_dir
    assert invoke(*args, "--tokenizer", char_tokenizer_dir).exit_code == 0  # resumed: nothing new
    assert len(load_rows(out)) == 1
    again = invoke(*args)  # the model's own tokenizer: other samples, computed anew
    assert again.exit_code == 0, again.output
    hashes = [json.loads(line)["content_hash"] for line in (out / "rows.jsonl").read_text().splitlines()]
    assert len(hashes) == 2 and hashes[0] != hashes[1]
    records = [json.loads(path.read_text())["config"] for path in (out / "runs").glob("*.json")]
    assert sorted(str(record.get("tokenizer")) for record in records) == sorted(
        [char_tokenizer_dir, char_tokenizer_dir, "None"]
    )


def test_the_python_api_takes_the_tokenizer_keyword(tmp_path, char_tokenizer_dir, tiny_llama_dir):
    import kvbench

    setup = dict(tasks=["niah_single_1"], length=1024, samples=1, model=tiny_llama_dir, out=tmp_path)
    rows = kvbench.sweep(["knorm"], [0.5], tokenizer=char_tokenizer_dir, progress=False, **setup)
    [sample] = runner.plan_samples(
        runner.prepare_plan([Config("none", 0.0)], tokenizer=char_tokenizer_dir, **setup)[0],
        runner.sizing_tokenizer(char_tokenizer_dir),
    )
    assert set(rows.content_hash) == {sample.content_hash()} and len(rows) == 2


@pytest.mark.parametrize(
    ("tokenizer", "said"),
    [
        ("/no/such/folder", "no such folder, and not a Hugging Face id"),
        (
            "kvbench-tests/no-such-tokenizer",
            "not in the local Hugging Face cache and the hub is not reachable",
        ),
        ("EMPTY", "has no tokenizer_config.json"),
        ("BROKEN", "cannot load tokenizer"),
    ],
)
def test_a_tokenizer_that_is_not_there_is_one_line_before_the_model_loads(
    tmp_path, monkeypatch, tiny_llama_dir, tokenizer, said
):
    (tmp_path / "EMPTY").mkdir()
    (tmp_path / "BROKEN").mkdir()
    (tmp_path / "BROKEN" / "tokenizer_config.json").write_text("{}")  # no vocabulary at all
    tokenizer = str(tmp_path / tokenizer) if tokenizer in ("EMPTY", "BROKEN") else tokenizer
    monkeypatch.setattr(models, "hub_reachable", lambda timeout=3.0: False)

    def no_model(*args, **kwargs):
        raise AssertionError("the model loaded")

    monkeypatch.setattr(models, "load_model", no_model)
    common = ["--task", "niah_single_1", "--length", 512, "--samples", 1, "--model", tiny_llama_dir]
    result = invoke("run", "--press", "knorm", "--ratio", 0.5, *common, "--out", tmp_path / "out")
    assert result.exit_code == 1  # the check above: without --tokenizer the model loads
    result = invoke(
        "run", "--press", "knorm", "--ratio", 0.5, *common, "--tokenizer", tokenizer, "--out", tmp_path / "o"
    )
    assert result.exit_code == 2, result.output
    assert result.output.count("\n") == 1 and said in result.output


def test_the_option_is_refused_where_no_task_is_sized_by_a_tokenizer(tmp_path, char_tokenizer_dir):
    asked = ["--task", "math500", "--tokenizer", char_tokenizer_dir, "--out", tmp_path]
    result = invoke("sweep", "--presses", "knorm", "--ratios", 0.5, *asked)
    assert result.exit_code == 2 and result.output.count("\n") == 1
    assert "--tokenizer sizes the samples of tasks" in result.output and "math500" in result.output
    assert not (tmp_path / "rows.jsonl").exists()


def test_a_suite_names_its_tokenizer_and_the_option_overrides_it(tmp_path, char_tokenizer_dir):
    folder = tmp_path / "suites"
    (folder / "tok").mkdir(parents=True)
    (folder / "tok" / "tokenizer_config.json").write_text("{}")
    (folder / "mine.yaml").write_text("tasks: [niah_single_1]\nlength: 1024\ntokenizer: tok\n")
    assert load_suite(str(folder / "mine.yaml")).tokenizer == str((folder / "tok").resolve())
    assert plan_tasks(str(folder / "mine.yaml")).tokenizer == str((folder / "tok").resolve())
    assert plan_tasks(str(folder / "mine.yaml"), tokenizer=char_tokenizer_dir).tokenizer == char_tokenizer_dir
    (folder / "hub.yaml").write_text("tasks: [niah_single_1]\ntokenizer: owner/name\n")
    assert load_suite(str(folder / "hub.yaml")).tokenizer == "owner/name"
    (folder / "empty.yaml").write_text("tasks: [niah_single_1]\ntokenizer: ''\n")
    with pytest.raises(DataFileError, match="tokenizer"):
        load_suite(str(folder / "empty.yaml"))


@pytest.mark.parametrize(("name", "length"), [("4k", 4096), ("8k", 8192), ("16k", 16384)])
def test_the_leaderboard_suites_are_rulers_13_tasks_by_kvpress_s_tokenizer(name, length):
    suite = load_suite(f"ruler-{name}-leaderboard")
    assert suite.tasks == list(ruler.TASKS) and suite.length == length and suite.samples == 500
    assert suite.tokenizer == LEADERBOARD_TOKENIZER


def usage_section() -> str:
    text = USAGE.read_text()
    start = text.index("## RULER as kvpress's leaderboard scores it")
    return text[start : text.index("\n## ", start + 1)]


def test_the_usage_page_s_leaderboard_commands_plan_what_it_says(monkeypatch):
    """The section's commands need a GPU and the hub (Llama 3.1, Qwen3): each is parsed by the command line
    and planned here as far as that goes without them; its suite, model and grid checked."""
    commands = re.findall(r"^uv run (kvbench sweep .*?)\s+# needs a GPU and the hub", usage_section(), re.M)
    assert len(commands) == 2
    seen = []

    def planned(configs, **setup):
        seen.append((configs, setup))
        return pd.DataFrame()

    monkeypatch.setattr(runner, "run_configs", planned)
    for command in commands:
        assert invoke(*command.split()[1:]).exit_code == 0
    models_asked = []
    for configs, setup in seen:
        assert [(c.press, c.ratio) for c in configs] == [("none", 0.0)] + [
            ("knorm", ratio) for ratio in (0.25, 0.5, 0.75)
        ]
        assert setup["device"] == "cuda" and setup["dtype"] == "bfloat16"
        assert setup["suite"] == "ruler-4k-leaderboard" and setup["out"].name.startswith("leaderboard-")
        assert plan_tasks(setup["suite"]).tokenizer == LEADERBOARD_TOKENIZER
        models_asked.append(setup["model"])
    assert models_asked == ["meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen3-8B"]
