"""The spine of the learned and fitted presses: the card read through its schema (learned/common/state.py),
and each press declared once (learned/catalog.py) as its class reads its state."""

import dataclasses
import json
import subprocess
import sys

import pytest

from kvbench.cli.group import LAZY_COMMANDS
from kvbench.core.errors import TrainingFileError
from kvbench.learned.catalog import LEARNED
from kvbench.learned.common import StatePress, read_card
from kvbench.presses import PRESSES, LearnedState
from kvbench.presses.registry import press_class

MODEL = {"name": "tiny", "num_layers": 2, "num_kv_heads": 2, "head_dim": 8}


def write_card(folder, card):
    folder.mkdir()
    (folder / "card.json").write_text(json.dumps(card))
    return folder


@pytest.mark.parametrize(
    ("card", "message"),
    [
        ({"method": 1, "model": MODEL}, "card.json is corrupt (field 'method'"),
        ({"method": "gate", "model": {**MODEL, "head_dim": 0}}, "corrupt (field 'model.head_dim'"),
        ({"method": "gate"}, "card.json is corrupt (field 'model'"),
        ({"method": "kvzap", "model": MODEL}, "holds kvzap weights, not gate's; make them with: HINT"),
    ],
)
def test_a_card_is_read_through_its_schema(tmp_path, card, message):
    with pytest.raises(TrainingFileError) as error:
        read_card(write_card(tmp_path / "state", card), "gate", "HINT")
    assert message in str(error.value) and "\n" not in str(error.value)


def test_a_card_without_a_method_is_kvps(tmp_path):
    """Cards written before the field existed are KVP's."""
    assert read_card(write_card(tmp_path / "state", {"model": MODEL}), "kvp", "HINT")["model"] == MODEL


@pytest.mark.parametrize("declared", LEARNED, ids=lambda press: press.name)
def test_each_declaration_is_what_its_press_reads(declared):
    """The registry and the commands read a press's declaration (no entry of their own); the press reads its
    own class attributes: they name the same method and state file."""
    press = press_class(declared.press)
    assert LAZY_COMMANDS.get(declared.name) == declared.command  # `kvbench NAME ...`, where it has commands
    assert PRESSES[declared.name].state == LearnedState(
        declared.folder_arg, declared.name, declared.state_file, declared.hashes_text
    )
    if issubclass(press, StatePress):
        assert (press.method, press.state_file) == (declared.name, declared.state_file)
        assert declared.folder_arg in {field.name for field in dataclasses.fields(press)}


def test_fit_options_are_checked_before_torch_is_imported():
    """`kvbench fit NAME --option ...` is checked against the declaration, not the module that fits."""
    code = (
        "import sys\n"
        "from kvbench.learned.fitted import check_options\n"
        "print(check_options('kvzap', {'epochs': '3'})['epochs'], 'torch' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["3", "False"]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_all_finite_says_what_torch_isfinite_says(dtype):
    """Finite values whose sum overflows are finite; one nan or infinity anywhere is not."""
    import torch

    from kvbench.learned.common.state import all_finite

    dtype = getattr(torch, dtype)
    huge = torch.full((4, 64), torch.finfo(dtype).max, dtype=dtype)
    assert all_finite(huge) and not torch.isfinite(huge.sum())
    generator = torch.Generator().manual_seed(0)
    for bad in (float("nan"), float("inf"), float("-inf")):
        for _ in range(5):
            tensor = torch.randn(4, 64, generator=generator).to(dtype)
            spots = torch.rand(tensor.shape, generator=generator) < 0.01
            tensor[spots] = bad
            assert all_finite(tensor) == bool(torch.isfinite(tensor).all()) == (not spots.any())
            tensor.view(-1)[int(torch.randint(256, (1,), generator=generator))] = bad
            assert not all_finite(tensor)
