"""The lm-eval bridge: loglikelihoods feel the press, `none` is lm-eval's own HF model, our task YAMLs score
as `kvbench run`, and `kvbench lm-eval` writes results-store rows."""

import json

import pytest
import torch
import yaml
from click.testing import CliRunner
from lm_eval import simple_evaluate
from lm_eval.api.instance import Instance
from lm_eval.api.registry import get_model
from lm_eval.models.huggingface import HFLM
from lm_eval.tasks import TaskManager

from kvbench import tasks
from kvbench.cli.lm_eval import lm_eval_command
from kvbench.core.config import Config
from kvbench.engine import evaluate_sample
from kvbench.harness import lmeval
from kvbench.harness.lmeval import QUESTION_FIELD, TASKS_DIR, KVBenchLM
from kvbench.tasks import ruler

WORDS = "the cat sat on a mat while dogs ran far away from home and birds sang in trees all day long".split()


@pytest.fixture(scope="module")
def model_dir(tiny_llama_dir):
    return tiny_llama_dir


def requests(kind: str, args: list[tuple], doc: dict | None = None) -> list[Instance]:
    return [Instance(kind, doc or {}, arg, 0, ("task", i, 1)) for i, arg in enumerate(args)]


def words(n: int, offset: int = 0) -> str:
    return " ".join(WORDS[(offset + i) % len(WORDS)] for i in range(n))


def test_importing_the_module_registers_the_kvbench_model_type():
    assert get_model("kvbench") is KVBenchLM


def test_press_none_gives_the_loglikelihoods_of_lm_evals_hf_model(model_dir):
    pairs = [
        (words(12), " " + words(3, 12)),
        (words(12), " " + words(2, 5)),  # same context: served by the same prefill
        (words(7, 3) + " ", words(4)),  # lm-eval moves the trailing space into the continuation
        ("", words(5)),  # empty context: lm-eval's prefix token
    ]
    expected = HFLM(pretrained=model_dir, device="cpu", batch_size=1).loglikelihood(
        requests("loglikelihood", pairs)
    )
    ours = KVBenchLM(model_dir, "none").loglikelihood(requests("loglikelihood", pairs))
    for (logprob, greedy), (expected_logprob, expected_greedy) in zip(ours, expected, strict=True):
        assert logprob == pytest.approx(expected_logprob, abs=1e-4)
        assert greedy == expected_greedy


def test_a_press_changes_loglikelihoods_and_compresses_all_but_the_last_context_token(model_dir):
    pairs = [(words(60), " " + words(4, 60)), (words(60), " " + words(4, 7))]
    plain = KVBenchLM(model_dir, "none").loglikelihood(requests("loglikelihood", pairs))
    lm = KVBenchLM(model_dir, "knorm", 0.5)
    pressed = lm.loglikelihood(requests("loglikelihood", pairs))
    assert all(abs(a[0] - b[0]) > 1e-3 for a, b in zip(plain, pressed, strict=True))
    prefix = len(lm.tok_encode(words(60))) - 1
    stats = lm.stats[("task", 0)]
    assert stats["context_tokens"] == prefix
    assert stats["kv_total"] == prefix * 2 * 2  # tokens x layers x KV heads
    assert stats["kv_kept"] == int(prefix * 0.5) * 2 * 2


def test_press_none_generates_as_lm_evals_hf_model_and_until_cuts_the_text(model_dir):
    prompt = words(30)
    args = [(prompt, {"until": [], "max_gen_toks": 8, "do_sample": False})]
    expected = HFLM(pretrained=model_dir, device="cpu", batch_size=1).generate_until(
        requests("generate_until", args)
    )
    lm = KVBenchLM(model_dir, "none")
    (text,) = lm.generate_until(requests("generate_until", args))
    assert text == expected[0] and text
    stop = text.split()[2]
    (cut,) = lm.generate_until(requests("generate_until", [(prompt, {"until": [stop], "max_gen_toks": 8})]))
    assert cut == text.split(stop)[0]
    # A prompt that names no question is compressed whole but its last token, and says so.
    assert lm.protocols == {"task": "query-aware"}
    assert lm.stats[("task", 0)]["context_tokens"] == len(lm.tok_encode(prompt)) - 1


def test_a_doc_naming_its_question_compresses_only_what_comes_before(model_dir):
    context, question = words(40) + "\n", "what sat on the mat?"
    lm = KVBenchLM(model_dir, "knorm", 0.5)
    args = [(context + question, {"until": [], "max_gen_toks": 2})]
    lm.generate_until(requests("generate_until", args, {QUESTION_FIELD: question}))
    assert lm.stats[("task", 0)]["context_tokens"] == len(
        lm.tokenizer.encode(context, add_special_tokens=False)
    )
    with pytest.raises(ValueError, match="does not contain"):
        lm.generate_until(requests("generate_until", args, {QUESTION_FIELD: "not in the prompt"}))


NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."


def lm_eval_ruler_prompts(tokenizer) -> dict[str, tuple[str, str, str]]:
    """Prompts made by lm-eval's own RULER generators: task -> (prompt, a piece of its haystack, a piece of
    its question)."""
    from lm_eval.tasks.ruler import cwe_utils, fwe_utils, niah_utils, prepare_niah, qa_utils, vt_utils

    def niah(values: int) -> tuple[str, str, str]:
        text, _, query = prepare_niah.generate_input_output(
            4, NOISE, type_haystack="repeat", num_needle_k=1, type_needle_k="words",
            num_needle_v=values, type_needle_v="numbers", template=niah_utils.TEMPLATE,
        )  # fmt: skip
        return text, "The grass is green", f"for {query} mentioned"

    example, text, _ = cwe_utils.generate_input_output(num_words=30, max_seq_length=1024)
    fwe, answer, _ = fwe_utils.generate_input_output(200, tokenizer, num_words=60)
    qa = qa_utils.TEMPLATE.format(context="Document 1:\nThe cat sat on the mat.", query="Where did it sit?")
    return {
        "niah_single_1": niah(1),  # one value: RULER's singular wording ("What is the special magic")
        "niah_multivalue": niah(4),
        "ruler_vt": (vt_utils.generate_input_output(8, 1, 4)[0], "VAR ", "assigned the value"),
        "ruler_cwe": (example + "\n" + text, "1. ", "10 most common words"),  # a worked example first
        "ruler_fwe": (fwe, answer[0], "three most frequently appeared"),
        "ruler_qa_squad": (qa, "The cat sat on the mat.", "Where did it sit?"),
    }


def test_lm_evals_own_ruler_prompts_are_split_where_rulers_question_starts(embedded_tokenizer):
    for task, (prompt, haystack, question) in lm_eval_ruler_prompts(embedded_tokenizer).items():
        cut = lmeval.question_start(prompt, task, {})
        assert cut is not None, task
        assert haystack in prompt[:cut] and haystack not in prompt[cut:], task
        assert question in prompt[cut:] and len(prompt[cut:]) < 250, task
    assert lmeval.question_start("a prompt of another task", "hellaswag", {}) is None
    with pytest.raises(ValueError, match="RULER's question"):
        lmeval.question_start("a prompt that RULER did not make", "ruler_vt", {})


def test_task_yamls_cover_every_ruler_task_with_its_generation_budget():
    names = set()
    for path in TASKS_DIR.glob("kvbench_*.yaml"):
        spec = yaml.safe_load(path.read_text())
        if "group" in spec:
            continue
        task = spec["dataset_kwargs"]["task"]
        names.add(task)
        assert spec["task"] == f"kvbench_{task}"
        assert spec["generation_kwargs"]["max_gen_toks"] == ruler.TOKENS_TO_GENERATE[ruler.family(task)]
    assert names == set(ruler.TASKS)
    group = yaml.safe_load((TASKS_DIR / "kvbench_ruler.yaml").read_text())
    assert group["task"] == [f"kvbench_{task}" for task in ruler.TASKS]


@pytest.mark.slow
def test_our_ruler_task_in_lm_eval_scores_as_kvbench_run(monkeypatch, tmp_path):
    monkeypatch.setattr(lmeval, "cache_dir", lambda: tmp_path)  # no request cache from an earlier run
    lm = KVBenchLM("smollm2-135m", "snapkv", 0.5)
    metadata = lmeval.task_metadata("smollm2-135m", limit=2, length=512)
    manager = TaskManager(include_path=str(TASKS_DIR), include_defaults=False, metadata=metadata)
    results = lmeval.evaluate(lm, manager, ["kvbench_niah_single_1"], limit=2)
    rows = lmeval.rows_from_results(results, lm)

    samples = tasks.load_samples("niah_single_1", length=512, samples=2, seed=0, tokenizer=lm.tokenizer)
    assert [row.sample_id for row in rows] == [sample.id for sample in samples]
    for row, sample in zip(rows, samples, strict=True):
        (expected,) = evaluate_sample(lm.model, lm.tokenizer, sample, [Config("snapkv", 0.5)])
        assert row.prediction == expected["prediction"]
        assert row.score == pytest.approx(tasks.score_sample(sample, expected["prediction"]))
        assert (row.context_tokens, row.kv_kept) == (expected["context_tokens"], expected["kv_kept"])
    assert row.task == "lm-eval/kvbench_niah_single_1" and row.length == 512


def invoke(*args):
    return CliRunner().invoke(lm_eval_command, [*args])


@pytest.mark.slow
def test_cli_runs_lm_evals_own_ruler_offline_into_the_results_store(monkeypatch, tmp_path, model_dir):
    monkeypatch.setenv("KVBENCH_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "results"
    args = ["--model", model_dir, "--press", "snapkv", "--ratio", "0.5", "--tasks", "niah_single_1"]
    result = invoke(*args, "--limit", "2", "--length", "256", "--out", str(out))
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    assert [row["sample_id"] for row in rows] == ["0", "1"]
    for row in rows:
        assert (row["task"], row["press"], row["ratio"], row["length"]) == (
            "lm-eval/niah_single_1",
            "snapkv",
            0.5,
            256,
        )
        assert row["model"] == model_dir and row["score"] in (0.0, 100.0)
        assert row["protocol"] == "query-agnostic"  # split at RULER's question, as kvbench's own tasks
        assert row["references"][0].isdigit() and len(row["references"][0]) == 7
        assert 0 < row["kv_kept"] < row["kv_total"] == row["context_tokens"] * 2 * 2
    record = json.loads(next((out / "runs").glob("*.json")).read_text())
    assert record["config"]["tasks"] == ["lm-eval/niah_single_1"]


MC_UTILS = """
import datasets


def load(**metadata):
    docs = [
        {"question": "the cat sat on the", "choices": ["mat", "dog", "tree", "home"], "label": 0},
        {"question": "birds sang in the", "choices": ["far", "trees", "cat"], "label": 1},
    ]
    return {"test": datasets.Dataset.from_list(docs)}
"""
MC_TASK = """
task: tiny_mc
dataset_path: ""
output_type: multiple_choice
test_split: test
custom_dataset: !function utils.load
doc_to_text: "{{question}}"
doc_to_choice: choices
doc_to_target: label
metric_list:
  - metric: acc
"""


def test_multiple_choice_rows_hold_the_most_likely_choice_and_accuracy_on_0_100(
    monkeypatch, tmp_path, model_dir
):
    monkeypatch.setattr(lmeval, "cache_dir", lambda: tmp_path)
    (tmp_path / "mc").mkdir()
    (tmp_path / "mc" / "utils.py").write_text(MC_UTILS)
    (tmp_path / "mc" / "tiny_mc.yaml").write_text(MC_TASK)
    lm = KVBenchLM(model_dir, "knorm", 0.5)
    manager = TaskManager(include_path=str(tmp_path / "mc"), include_defaults=False)
    results = lmeval.evaluate(lm, manager, ["tiny_mc"])
    rows = lmeval.rows_from_results(results, lm)

    for row, sample, label in zip(rows, results["samples"]["tiny_mc"], [0, 1], strict=True):
        # The requests as lm-eval sent them (chat template applied), scored again one by one.
        scores = [lm.loglikelihood(requests("loglikelihood", [args]))[0][0] for args in sample["arguments"]]
        best = max(range(len(scores)), key=scores.__getitem__)
        assert (row.task, row.prediction, row.references) == (
            "lm-eval/tiny_mc",
            str(best),
            [str(label)],
        )
        assert row.score == 100.0 * (best == label)
        assert row.kv_kept == int(row.context_tokens * 0.5) * 2 * 2
        assert row.protocol == "query-aware"  # the question is in the compressed context

    # The registered model type, built by lm-eval from an argument string, scores the same.
    plain = simple_evaluate(
        model="kvbench",
        model_args=f"pretrained={model_dir},press=knorm,compression_ratio=0.5",
        tasks=["tiny_mc"],
        task_manager=manager,
        apply_chat_template=True,
        bootstrap_iters=0,
    )
    assert 100 * plain["results"]["tiny_mc"]["acc,none"] == pytest.approx(sum(row.score for row in rows) / 2)
    assert plain["config"]["protocols"] == {"tiny_mc": "query-aware"}


def test_model_args_take_a_tokenizer_and_press_arguments_and_fall_back_to_the_cpu(model_dir):
    # As lm-eval's command line builds the model: every key in --model_args, its own device default.
    lm = get_model("kvbench").create_from_arg_string(
        f"pretrained={model_dir},tokenizer={model_dir},press=snapkv,compression_ratio=0.5,window_size=4",
        {"batch_size": 1, "max_batch_size": 64, "device": "cuda:0"},
    )
    assert (lm.press_name, lm.compression_ratio, lm.press_args) == ("snapkv", 0.5, {"window_size": 4})
    assert lm.new_run().press.window_size == 4
    assert lm.tokenizer.name_or_path == model_dir
    if not torch.cuda.is_available():
        assert lm.model.device.type == "cpu"
    with pytest.raises(ValueError, match="windw"):
        get_model("kvbench").create_from_arg_string("press=snapkv,compression_ratio=0.5,windw=4", {})


@pytest.mark.parametrize(
    "model_args, refusal",
    [
        ("compression_ratio=0.5", "press 'none' compresses nothing: its compression_ratio must be 0"),
        ("press=none,compression_ratio=0.25", "press 'none' compresses nothing: its compression_ratio"),
        ("window_size=4", "press 'none' takes no press arguments"),
    ],
)
def test_model_args_that_do_not_apply_without_a_press_are_refused(model_dir, model_args, refusal):
    """Run uncompressed, they recorded a ratio or arguments no press used."""
    with pytest.raises(ValueError, match=refusal):
        get_model("kvbench").create_from_arg_string(f"pretrained={model_dir},{model_args}", {})


def test_lm_eval_kvbench_is_lm_evals_own_command_line_with_the_model_registered(
    monkeypatch, tmp_path, model_dir
):
    from importlib.metadata import entry_points

    from kvbench.cli import lm_eval as lm_eval_cli

    (script,) = entry_points(group="console_scripts", name="lm-eval-kvbench")
    assert script.value == "kvbench.cli.lm_eval:main"
    (tmp_path / "mc").mkdir()
    (tmp_path / "mc" / "utils.py").write_text(MC_UTILS)
    (tmp_path / "mc" / "tiny_mc.yaml").write_text(MC_TASK)
    model_args = f"pretrained={model_dir},press=knorm,compression_ratio=0.5"
    argv = ["--model", "kvbench", "--model_args", model_args, "--tasks", "tiny_mc", "--device", "cpu"]
    argv += ["--include_path", str(tmp_path / "mc"), "--output_path", str(tmp_path / "out")]
    monkeypatch.setattr("sys.argv", ["lm-eval-kvbench", *argv])
    lm_eval_cli.main()
    (path,) = (tmp_path / "out").rglob("results_*.json")
    results = json.loads(path.read_text())
    assert 0 <= results["results"]["tiny_mc"]["acc,none"] <= 1
    assert results["config"]["press"] == "knorm" and results["config"]["protocols"] == {
        "tiny_mc": "query-aware"
    }


def test_lm_eval_kvbench_adds_kvbench_tasks_unless_given_a_path():
    from kvbench.cli.lm_eval import with_kvbench_tasks
    from kvbench.core.resources import lm_eval_tasks_dir

    argv = ["--model", "kvbench", "--tasks", "kvbench_vt"]
    assert with_kvbench_tasks(argv) == [*argv, "--include_path", str(lm_eval_tasks_dir())]
    assert (lm_eval_tasks_dir() / "kvbench_vt.yaml").is_file()
    for own in (["--include_path", "mine"], ["--include_path=mine"]):
        assert with_kvbench_tasks([*argv, *own]) == [*argv, *own]
    assert with_kvbench_tasks(["--help"]) == ["--help"] and with_kvbench_tasks([]) == []


def test_the_public_import_registers_the_model_type():
    """`import kvbench.lmeval` is the documented path (docs/usage.md), whatever the harness's layout."""
    import lm_eval.api.registry

    import kvbench.lmeval

    assert lm_eval.api.registry.get_model("kvbench") is kvbench.lmeval.KVBenchLM


def test_lm_eval_says_nothing_of_git_outside_a_checkout(tmp_path, monkeypatch, capfd):
    """lm-eval asks git for the working folder's commit; outside a checkout git's 'fatal: not a git
    repository' reached the user's terminal on every run."""
    import types

    import lm_eval
    import lm_eval.evaluator

    from kvbench.harness import lmeval

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    asked = []
    monkeypatch.setattr(
        lm_eval, "simple_evaluate", lambda **_: asked.append(lm_eval.evaluator.get_git_commit_hash()) or {}
    )
    monkeypatch.setattr(lmeval, "tokenizer_folder", lambda model: tmp_path / "tokenizer")
    lm = types.SimpleNamespace(
        model=types.SimpleNamespace(config=types.SimpleNamespace(kvbench_name="m")),
        tokenizer=types.SimpleNamespace(save_pretrained=lambda folder: None, chat_template=None),
        run_config={"model": "m", "press": "none", "ratio": 0.0, "press_args": {}},
    )
    lmeval.evaluate(lm, None, ["t"])
    assert asked == [None] and "fatal" not in capfd.readouterr().err
