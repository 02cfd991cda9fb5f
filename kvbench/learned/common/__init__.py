"""What every learned press's training shares: the model shape its files are made for and their card
(state.py), the data store's manifest (store.py), atomic writes and one-line errors that name the file and
the command that makes the right one (files.py).

KVP (learned/kvp/), DistillCache (learned/distillcache/), gate, MemDecay and the fitted presses all build on
it: a data store is a folder of shards plus `manifest.json`, written by datagen.py for every method
("shared"); learned state is a folder with a safetensors file of weights plus `card.json`.
"""

from kvbench.core.errors import TrainingFileError
from kvbench.learned.common.files import (
    CARD_FILE,
    MANIFEST_FILE,
    corrupt,
    read_json,
    write_atomically,
    write_json,
)
from kvbench.learned.common.state import (
    Card,
    ModelShape,
    StatePress,
    cached_state,
    check_finite,
    check_fits,
    check_made_for,
    check_training_out,
    folder_name,
    load_state,
    load_weights,
    model_shape,
    read_card,
    read_state,
    save_learned_state,
    shipped_state_dir,
    state_folder,
    state_version,
    train_command_hint,
)
from kvbench.learned.common.store import (
    SHARD_SHAPES,
    SHARED,
    Manifest,
    Shard,
    TrainingData,
    datagen_hint,
    existing_manifest,
    manifest_method,
    read_manifest,
)

__all__ = [
    "CARD_FILE",
    "MANIFEST_FILE",
    "SHARD_SHAPES",
    "SHARED",
    "Card",
    "Manifest",
    "ModelShape",
    "StatePress",
    "Shard",
    "TrainingData",
    "TrainingFileError",
    "cached_state",
    "check_finite",
    "check_fits",
    "check_made_for",
    "check_training_out",
    "corrupt",
    "datagen_hint",
    "existing_manifest",
    "folder_name",
    "load_state",
    "load_weights",
    "manifest_method",
    "model_shape",
    "read_card",
    "read_json",
    "read_manifest",
    "read_state",
    "save_learned_state",
    "shipped_state_dir",
    "state_folder",
    "state_version",
    "train_command_hint",
    "write_atomically",
    "write_json",
]
