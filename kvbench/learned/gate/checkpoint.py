"""Gates on disk: `gates.safetensors` (weight (layers, kv_heads, 2 head_dim), bias (layers, kv_heads)) and
`card.json` (method, the model's shape, the training config, data, steps, time, validation KL), in the
learned presses' one format (kvbench.learned.common)."""

import hashlib
from pathlib import Path

from kvbench.learned.common import (
    ModelShape,
    TrainingFileError,
    check_fits,
    load_weights,
    read_card,
    save_learned_state,
    shipped_state_dir,
)
from kvbench.learned.gate.gates import GateSet

METHOD = "gate"
WEIGHTS_FILE = "gates.safetensors"


def default_weights_dir(name: str) -> Path:
    """Where the shipped gates of model `name` live: presses/gate/<name>/."""
    return shipped_state_dir(METHOD, name)


def train_command_hint(name: str) -> str:
    from kvbench.core import resources

    return f"kvbench gate train --model {name} {resources.out_option(default_weights_dir(name), 'weights')}"


def save_gates(directory: Path, gates: GateSet, card: dict) -> None:
    save_learned_state(directory, WEIGHTS_FILE, gates, {"method": METHOD, **card})


def load_gates(directory: Path, shape: ModelShape | None = None) -> tuple[GateSet, dict, str]:
    """The gates, their card and the digest of the weights file; refused in one line when missing, corrupt
    or made for another model than `shape`."""
    directory = Path(directory)
    hint = train_command_hint(shape.name if shape else "MODEL")
    card = read_card(directory, METHOD, hint)
    if shape is not None:
        check_fits(card, shape, directory, "gate weights", hint)
    path = directory / WEIGHTS_FILE
    state = load_weights(path, hint)
    model = ModelShape(**card["model"])
    gates = GateSet(model.num_layers, model.num_kv_heads, model.head_dim)
    try:
        gates.load_state_dict(state)
    except (KeyError, RuntimeError, ValueError) as error:
        reason = str(error).strip().splitlines()[0]
        raise TrainingFileError(f"{path} is corrupt ({reason}); make it again with: {hint}") from None
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
    return gates, card, digest
