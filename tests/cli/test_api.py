"""The Python API: `import kvbench` is light, its names resolve, and it scores exactly the CLI's rows."""

import subprocess
import sys

import pandas as pd
import pytest
from click.testing import CliRunner

import kvbench
from kvbench.cli import LAZY_COMMANDS, main

TIMINGS = ["prefill_s", "decode_s", "source"]  # what legitimately differs between two identical runs


def test_every_public_name_resolves():
    for name in kvbench.__all__:
        assert getattr(kvbench, name) is not None, name
    assert callable(kvbench.report) and callable(kvbench.run) and callable(kvbench.load_results)
    assert "kvp" in {spec.name for spec in kvbench.list_presses()}
    assert "niah_single_1" in {task.name for task in kvbench.list_tasks()}
    assert "ruler-smoke" in {suite.name for suite in kvbench.list_suites()}


def test_import_kvbench_and_the_help_load_no_torch():
    """`import kvbench` and `kvbench --help` answer at once: nothing heavy is imported."""
    code = (
        "import sys, kvbench; from kvbench.cli import main; main(['--help'], standalone_mode=False); "
        "print(sorted({'torch', 'transformers', 'kvpress', 'pandas'} & set(sys.modules)))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "lm-eval" in result.stdout and result.stdout.strip().endswith("[]"), result.stdout


@pytest.mark.parametrize("name", sorted(LAZY_COMMANDS))
def test_the_help_of_lazy_commands_is_their_own(name):
    command = main.get_command(None, name)
    assert command.get_short_help_str(limit=300) == LAZY_COMMANDS[name][1]


def test_api_rows_are_the_cli_rows(tmp_path, tiny_llama_dir):
    """The same sweep through `kvbench sweep` and through `kvbench.sweep`: the same rows, value for value."""
    common = ["--task", "niah_single_1", "--length", "512", "--samples", "1", "--model", tiny_llama_dir]
    cli_out, api_out = tmp_path / "cli", tmp_path / "api"
    args = ["sweep", "--presses", "knorm,tova", "--ratios", "0.5", *common, "--out", str(cli_out)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    returned = kvbench.sweep(
        ["knorm", "tova"],
        [0.5],
        tasks=["niah_single_1"],
        length=512,
        samples=1,
        model=tiny_llama_dir,
        out=api_out,
        progress=False,
    )
    cli_rows = kvbench.load_results(cli_out).drop(columns=TIMINGS)
    api_rows = kvbench.load_results(api_out).drop(columns=TIMINGS)
    assert len(api_rows) == 3 and set(api_rows.press) == {"none", "knorm", "tova"}
    pd.testing.assert_frame_equal(cli_rows, api_rows)
    pd.testing.assert_frame_equal(returned.drop(columns=TIMINGS), api_rows)
    # Bad input is the same one-line error type from Python as from the command line.
    with pytest.raises(kvbench.BadInput, match="ratio must be in"):
        kvbench.run("knorm", 1.5, out=api_out)


@pytest.mark.gpu
def test_a_cuda_run_keeps_and_counts_what_a_cpu_run_does(tmp_path, tiny_llama_dir):
    setup = dict(tasks=["niah_single_1"], length=512, samples=1, model=tiny_llama_dir, progress=False)
    cpu = kvbench.sweep(["knorm", "tova"], [0.5], out=tmp_path / "cpu", **setup)
    cuda = kvbench.sweep(["knorm", "tova"], [0.5], device="cuda", out=tmp_path / "cuda", **setup)
    columns = ["config_id", "sample_id", "content_hash", "context_tokens", "kv_kept", "kv_total", "kv_bytes"]
    pd.testing.assert_frame_equal(cpu[columns], cuda[columns])


def fail_if_loaded(*args, **kwargs):
    raise AssertionError("a bad argument must fail before the model loads")


# Each argument of the API given a value of a type it cannot be (a path as a number or None, a dict as a
# list, a press as None): one KvbenchError naming the argument, never a TypeError from deep inside.
BAD_ARGUMENTS = [
    (lambda out: kvbench.run(None, 0.5, out=out), "press None: give a press's name"),
    (lambda out: kvbench.run(5, 0.5, out=out), "press 5: give a press's name"),
    (lambda out: kvbench.run("knorm", 0.5, out=5), "out: a path"),
    (lambda out: kvbench.run("knorm", 0.5, out=None), "out: a path"),
    (lambda out: kvbench.run("knorm", 0.5, press_args=["a=1"], out=out), "press_args: a dict"),
    (lambda out: kvbench.run("knorm", 0.5, data=5, out=out), "data: a path"),
    (lambda out: kvbench.run("knorm", 0.5, include_path=[None], out=out), "include_path: a path"),
    (lambda out: kvbench.run("knorm", 0.5, data_dir=3.5, out=out), "data_dir: a path"),
    (lambda out: kvbench.sweep(["knorm"], [0.5], press_args=[("a", 1)], out=out), "press_args: a dict"),
    (lambda out: kvbench.load_results(None), "results folders: a path"),
    (lambda out: kvbench.load_results([out, 7]), "results folders: a path"),
    (lambda out: kvbench.load_results([out / "typo"]), "no results at"),
    (lambda out: kvbench.report(5, out=out), "result_dirs: a path"),
    (lambda out: kvbench.report(out, out=5), "out: a path"),
    (lambda out: kvbench.report(out, out=out / "r", costs=5), "costs: a path"),
]


@pytest.mark.parametrize("call, message", BAD_ARGUMENTS, ids=[message for _, message in BAD_ARGUMENTS])
def test_an_api_argument_of_the_wrong_type_is_one_kvbench_error(call, message, tmp_path, monkeypatch):
    monkeypatch.setattr("kvbench.bridge.models.load_model", fail_if_loaded)
    with pytest.raises(kvbench.KvbenchError, match=message.replace("(", r"\(")) as caught:
        call(tmp_path)
    assert "\n" not in str(caught.value)
    assert not (tmp_path / "r").exists()
