"""The spine of the learned and fitted presses (kvbench.learned.common.state): the card read through its
schema, state matched to the model it was made for."""

import json

import pytest

from kvbench.core.errors import TrainingFileError
from kvbench.learned.common import read_card

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
