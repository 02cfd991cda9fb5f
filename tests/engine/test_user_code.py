"""A user's press and factory run inside kvbench's engine, next to other configs: a press that writes into
what the configs share is refused before any row of that sample is written, a factory is checked per
config, and whatever the user's code raises (sys.exit included) is one line with the rows written kept."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import kvbench
from kvbench.cli import main
from tests.core.test_extending import write_data

PRESS = """
from dataclasses import dataclass

from kvpress import ScorerPress


@dataclass
class Bad(ScorerPress):
    compression_ratio: float = 0.0

    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        scores = keys.norm(dim=-1).clone()
        {write}
        return scores
"""

# Writes into what the engine hands a press in a shared prefill, each in place.
WRITES = [
    "keys.mul_(-1e3)",
    "values.zero_()",
    "keys[..., 0] = 0",
    "hidden_states.add_(1.0)",
    "kwargs['position_embeddings'][0].mul_(2.0)",
    "values.copy_(values.flip(-2))",
    "keys.mul_(-1e3) if module.layer_idx > 0 else None",  # past the one layer of the trial's model
]


def invoke(*args):
    return CliRunner().invoke(main, [str(arg) for arg in args])


def rows_of(folder: Path) -> list[dict]:
    path = folder / "rows.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.parametrize("write", WRITES)
def test_a_press_that_writes_into_shared_tensors_is_refused_before_its_rows(
    tmp_path, monkeypatch, tiny_llama_dir, write
):
    monkeypatch.chdir(tmp_path)
    Path("bad.py").write_text(PRESS.format(write=write))
    data = write_data(tmp_path, 2)
    common = ["--ratios", "0.5", "--data", data, "--length", 256, "--model", tiny_llama_dir, "--out", "out"]
    result = invoke("sweep", "--presses", "none,bad.py:Bad,knorm", *common)
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert lines[-1].startswith("Error: press 'Bad' writes into the keys, values, hidden states"), lines
    assert rows_of(tmp_path / "out") == []
    with pytest.raises(kvbench.BadInput, match="press 'Bad' writes into"):  # the API, as the command
        kvbench.sweep(["none", "bad.py:Bad"], [0.5], data=[str(data)], length=256, model=tiny_llama_dir)


def test_a_clean_press_beside_it_gives_the_rows_it_gives_alone(tmp_path, monkeypatch, tiny_llama_dir):
    """The check is a comparison of torch's write counters: a press that writes only into its own tensors
    passes, and the other configs' rows are those of a sweep without it."""
    monkeypatch.chdir(tmp_path)
    Path("own.py").write_text(PRESS.format(write="scores.mul_(2.0)"))
    data = write_data(tmp_path, 2)
    common = ["--ratios", "0.5", "--data", data, "--length", 256, "--model", tiny_llama_dir]
    assert invoke("sweep", "--presses", "none,own.py:Bad", *common, "--out", "a").exit_code == 0
    assert invoke("sweep", "--presses", "none", *common, "--out", "b").exit_code == 0
    alone = [row["prediction"] for row in rows_of(tmp_path / "b")]
    beside = [row["prediction"] for row in rows_of(tmp_path / "a") if row["press"] == "none"]
    assert beside == alone and len(alone) == 2


FACTORY = """
import sys

from kvpress import KnormPress

SHARED = KnormPress()


def make(ratio):
    {body}
"""


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ("return None", "press 'make' at ratio 0.25: its factory returned NoneType, not a kvpress press"),
        ("return 'knorm'", "press 'make' at ratio 0.25: its factory returned str, not a kvpress press"),
        ("return KnormPress", "press 'make' at ratio 0.25: its factory returned type, not a kvpress press"),
        (
            "SHARED.compression_ratio = ratio\n    return SHARED",
            "press 'make': its factory returned one press object for ratios 0.25 and 0.75; build a new press "
            "on each call",
        ),
        ("sys.exit(0)", "press 'make' at ratio 0.25 fails to build: SystemExit: 0"),
        ("raise GeneratorExit", "press 'make' at ratio 0.25 fails to build: GeneratorExit"),
        ("raise RuntimeError('no\\nmore')", "press 'make' at ratio 0.25 fails to build: RuntimeError: no"),
    ],
    ids=["none", "text", "class", "same-object", "sys-exit", "generator-exit", "raises"],
)
def test_what_a_factory_returns_is_checked_per_config(tmp_path, monkeypatch, tiny_llama_dir, body, says):
    monkeypatch.chdir(tmp_path)
    Path("f.py").write_text(FACTORY.format(body=body))
    data = write_data(tmp_path, 1)
    args = ["sweep", "--presses", "none,f.py:make", "--ratios", "0.25,0.75", "--data", data]
    result = invoke(*args, "--length", 256, "--model", tiny_llama_dir, "--out", "out")
    assert result.exit_code == 2 and result.output.strip().splitlines() == [f"Error: {says}"], result.output
    assert not Path("out").exists()


PRESS_CLASS = """
from dataclasses import dataclass

from kvpress import ScorerPress


@dataclass
class Norm(ScorerPress):
    compression_ratio: float = 0.0

    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        return values.norm(dim=-1){edit}
"""


def test_a_press_is_keyed_by_every_file_of_the_users_it_runs(tmp_path, monkeypatch):
    """A factory in one file building a press class of another: an edit to either is a new digest; a
    `functools.partial` is keyed by its function's file and the arguments it binds."""
    import functools

    from kvbench.core.registry import load_target, source_of
    from kvbench.presses import PRESSES, resolve_press

    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    Path("norm_press.py").write_text(PRESS_CLASS.format(edit=""))
    factory = "from norm_press import Norm\n\n\ndef make(ratio, power=1.0):\n    return Norm(ratio){edit}\n"
    Path("factory.py").write_text(factory.format(edit=""))

    def digest(target: str = "mk=factory.py:make") -> str:
        return PRESSES[resolve_press(target)].source.digest

    first = digest()
    assert digest() == first
    Path("norm_press.py").write_text(PRESS_CLASS.format(edit=" * 2"))
    second = digest()
    assert second != first
    Path("factory.py").write_text(factory.format(edit="  # edited"))
    assert digest() not in (first, second)

    make = load_target(f"{tmp_path}/factory.py:make", "press")
    two, three = (source_of(functools.partial(make, power=power)) for power in (2.0, 3.0))
    assert two.file == str(tmp_path / "factory.py") and two.digest != three.digest
    assert source_of(functools.partial(make, power=2.0)).digest == two.digest
    Path("factory.py").write_text(factory.format(edit="  # edited again"))
    edited = load_target(f"{tmp_path}/factory.py:make", "press")
    assert source_of(functools.partial(edited, power=2.0)).digest != two.digest


EXITS = """
import sys
from dataclasses import dataclass

from kvpress import ScorerPress

CALLS = []


@dataclass
class Exits(ScorerPress):
    compression_ratio: float = 0.0

    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        if module.layer_idx > 0:  # past the trial's one-layer model
            CALLS.append(module.layer_idx)
            if len(CALLS) >= module.config.num_hidden_layers:  # the real run's second sample
                {exit}
        return keys.norm(dim=-1)
"""


@pytest.mark.parametrize(
    "exit", ["sys.exit(0)", "sys.exit()", "raise SystemExit('bye')", "raise GeneratorExit"]
)
def test_a_press_that_exits_mid_sweep_is_one_line_with_the_rows_written_kept(
    tmp_path, monkeypatch, tiny_llama_dir, exit
):
    monkeypatch.chdir(tmp_path)
    Path("exits.py").write_text(EXITS.format(exit=exit))
    data = write_data(tmp_path, 2)
    args = ["sweep", "--presses", "none,exits.py:Exits", "--ratios", "0.5", "--data", data, "--length", 256]
    result = invoke(*args, "--model", tiny_llama_dir, "--out", "out")
    last = result.output.strip().splitlines()[-1]
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert last.startswith("Error: a press exited on sample mine/s1 ("), last
    assert [(row["press"], row["sample_id"]) for row in rows_of(tmp_path / "out")] == [
        ("none", "s0"),
        ("Exits", "s0"),
    ]
    (record,) = [json.loads(path.read_text()) for path in (tmp_path / "out" / "runs").glob("*.json")]
    assert not record.get("finished")
