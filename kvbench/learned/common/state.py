"""Learned state, the spine of every learned and fitted press: a folder (default presses/<method>/<model>/)
of a safetensors file and `card.json` (the method, the model's shape and weights identity, what made it),
written whole, read through the card's schema, and refused in one line when made for another model.
"""

import functools
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from kvbench.bridge import models
from kvbench.core import resources
from kvbench.core.errors import BadInput, TrainingFileError, WriteError
from kvbench.core.validation import STRICT, Positive, check_json
from kvbench.learned.common.files import CARD_FILE, MANIFEST_FILE, corrupt, read_json


@dataclass(frozen=True)
class ModelShape:
    """What a data store or checkpoint must match: the model and the shape of its KV cache."""

    # Also the schema of the `model` field of manifests and cards; a key more would fail ModelShape(**model).
    __pydantic_config__ = {**STRICT, "extra": "forbid"}

    name: str
    num_layers: Positive
    num_kv_heads: Positive
    head_dim: Positive
    identity: str | None = None  # models.model_identity; None in state made before it was recorded

    @property
    def num_heads(self) -> int:
        return self.num_layers * self.num_kv_heads

    def fits(self, other: "ModelShape") -> bool:
        """Whether state made for this model serves `other`: the same KV-cache shape, and the same model,
        by identity where both record one (a copy of a model's folder is that model), else by name."""
        same = (self.num_layers, self.num_kv_heads, self.head_dim) == (
            other.num_layers,
            other.num_kv_heads,
            other.head_dim,
        )
        if self.identity is not None and other.identity is not None:
            return same and self.identity == other.identity
        return same and self.name == other.name

    def describe(self) -> str:
        """e.g. `smollm2-135m (30 layers x 3 KV heads x 64, weights 1f2e...)`, for messages."""
        weights = f", weights {self.identity}" if self.identity else ""
        shape = f"{self.num_layers} layers x {self.num_kv_heads} KV heads x {self.head_dim}"
        return f"{self.name} ({shape}{weights})"


def model_shape(model) -> ModelShape:
    shape = models.model_shape(model)
    return ModelShape(
        models.model_name(model),
        shape["layers"],
        shape["kv_heads"],
        shape["head_dim"],
        models.model_identity(model),
    )


def folder_name(name: str) -> str:
    """A model name as one folder name (hub ids hold a slash)."""
    return name.replace("/", "--")


def shipped_state_dir(method: str, name: str) -> Path:
    """Where the shipped learned state of `method` for model `name` lives: presses/<method>/<name>/."""
    return resources.learned_state_dir(method, folder_name(name))


def state_folder(weights: str | None, method: str, name: str) -> Path:
    """The folder a learned press reads: its `weights` argument, or the shipped state of model `name`."""
    return Path(weights) if weights else shipped_state_dir(method, name)


def state_version(directory: Path) -> tuple[Path, int]:
    """The resolved folder and its card's modification time: the key under which a press caches the
    loaded state, so that a retrained state on disk is read again (0 when there is no card: loading
    then refuses it in one line)."""
    card = directory / "card.json"
    return directory.resolve(), card.stat().st_mtime_ns if card.is_file() else 0


def train_command_hint(method: str, name: str, press_arg: str) -> str:
    """The commands that make `method`'s state for model `name`, for error messages."""
    data = f"data/{method}/{folder_name(name)}"
    return (
        f"kvbench {method} datagen --model {name} --out {data} && kvbench {method} train --data {data} "
        f"{resources.out_option(shipped_state_dir(method, name), press_arg)}"
    )


def save_learned_state(directory: Path, weights_file: str, module, card: dict, metadata: dict | None = None):
    """The one checkpoint format of the learned presses: `weights_file` (safetensors of the module's state,
    or of a dict of tensors) and card.json. Both are written whole into a folder beside `directory` first,
    then that folder becomes `directory` (or, where it exists, its files are moved in, weights first, so a
    card never names weights that are not there). A write that fails (a full disk, a file size limit)
    leaves `directory` as it was, no empty folder and no half a file, and is one line (WriteError)."""
    import shutil

    from safetensors.torch import save

    directory = Path(directory)
    tensors = module if isinstance(module, dict) else module.state_dict()
    state = {name: tensor.detach().cpu().contiguous() for name, tensor in tensors.items()}
    data = save(state, metadata=metadata)  # bytes: written by Python, a failed write is an OSError
    tmp = directory.with_name(f".{directory.name}.tmp{os.getpid()}")
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)  # a killed earlier save's
        tmp.mkdir()
        (tmp / weights_file).write_bytes(data)
        (tmp / CARD_FILE).write_text(json.dumps(card, indent=1) + "\n")
        if not directory.exists():
            tmp.rename(directory)
        else:
            for name in (weights_file, CARD_FILE):
                os.replace(tmp / name, directory / name)
            tmp.rmdir()
    except OSError as error:
        shutil.rmtree(tmp, ignore_errors=True)
        raise WriteError(
            f"cannot write {weights_file} and {CARD_FILE} to {directory}: {error.strerror or error}"
        ) from None


def check_training_out(out: Path, replace: bool, data: tuple[Path, ...] = ()) -> None:
    """BadInput when training would write its checkpoint over something: a data store (one of `data`, or
    any folder with a manifest), or learned state already there (a card) unless `replace`. Training writes
    only its weights and card, so without this check the folder's other files (notes, logs, plots) would
    describe state no longer there."""
    out = Path(out)
    if (out / MANIFEST_FILE).is_file() or any(out.resolve() == Path(folder).resolve() for folder in data):
        raise BadInput(f"--out {str(out)!r} is a data store: give the checkpoint a folder of its own")
    if (out / CARD_FILE).is_file() and not replace:
        raise BadInput(
            f"--out {str(out)!r} already holds learned state ({CARD_FILE}): "
            "give --replace to train over it, or another folder"
        )


@dataclass
class Card:
    """The schema of what kvbench reads of every learned state's card.json: the method that made it and the
    model it was made for. The other fields (training, data, recipe, validation, command) are records, each
    method's own (KVP's card schema adds its heads: learned/kvp/checkpoint.py)."""

    __pydantic_config__ = STRICT

    model: ModelShape
    method: str = "kvp"  # cards written before the field existed are KVP's


def read_card(directory: Path, method: str, hint: str) -> dict:
    """A checkpoint's card, checked against `Card`; refused when it is missing, corrupt or made by another
    method."""
    path = Path(directory) / CARD_FILE
    card = read_json(path, f"{method} weights", hint)
    try:
        made_by = check_json(Card, json.dumps(card), "", ValueError).method
    except ValueError as error:
        raise corrupt(path, error, hint) from None
    if made_by != method:
        raise TrainingFileError(f"{path} holds {made_by} weights, not {method}'s; make them with: {hint}")
    return card


def check_made_for(
    card: dict, name: str, directory: Path, what: str, hint: str, error=TrainingFileError
) -> None:
    """Refuse weights (`what`) made for another model, by name: what can be checked before the model loads
    (`check_fits` checks the KV-cache shape once it has). Weights that record the model's identity are
    matched by it once the model has loaded, whatever its name (a copy of its folder)."""
    made_for = card["model"]["name"]
    if made_for != name and card["model"].get("identity") is None:
        raise error(
            f"{what} at {directory} were made for {made_for}, not for {name}; "
            f"make weights for this model with: {hint}"
        )


def check_fits(card: dict, shape: ModelShape, directory: Path, what: str, hint: str) -> None:
    """Refuse weights (`what`, e.g. "KVP agents") made for another model (name or KV-cache shape)."""
    made_for = ModelShape(**card["model"])
    if not made_for.fits(shape):
        raise TrainingFileError(
            f"{what} at {directory} were made for {made_for.describe()}, not for {shape.describe()}; "
            f"make weights for this model with: {hint}"
        )


def load_weights(path: Path, hint: str, error=TrainingFileError) -> dict:
    """A safetensors file's tensors, every one finite (`check_finite`), or a one-line `error` naming the
    file and the command that makes it."""
    from safetensors.torch import load_file

    if not path.is_file():
        raise error(f"missing {path}; make it with: {hint}")
    try:
        state = load_file(path)
    except Exception as reason:  # safetensors raises its own error types for truncated or foreign files
        raise error(str(corrupt(path, reason, hint))) from None
    return check_finite(state, path, hint, error)


def all_finite(tensor) -> bool:
    """Whether every value of a floating `tensor` is finite: `tensor * 0` is nan exactly where a value is nan
    or infinite and 0 elsewhere, and a sum of zeros cannot overflow, so one sum answers without building
    the boolean tensor of `torch.isfinite`."""
    return not bool((tensor * 0).sum().isnan())


def check_finite(state: dict, path: Path, hint: str, error=TrainingFileError) -> dict:
    """`state` (a checkpoint's tensors, read from `path`), refused in one line where a floating tensor holds
    nan or inf: a press scoring with such weights ranks every entry alike and scores 0 without a word (a
    diverged training, a damaged file)."""
    import torch

    for name, tensor in state.items():
        if tensor.is_floating_point() and not all_finite(tensor):
            bad = int((~torch.isfinite(tensor)).sum())
            raise error(
                f"{path}: {name} holds {bad} of {tensor.numel()} values that are not finite (nan or inf); "
                f"make it again with: {hint}"
            )
    return state


def read_state(directory: Path, method: str, file: str, shape: ModelShape | None, hint: str, what: str):
    """The tensors of `file` in `directory`, its card and the file's digest (12 hex digits of its sha256);
    refused in one line when missing, corrupt, not finite, or made for another model than `shape` (`what`,
    e.g. "gate weights", names them in the message)."""
    directory = Path(directory)
    card = read_card(directory, method, hint)
    if shape is not None:
        check_fits(card, shape, directory, what, hint)
    path = directory / file
    tensors = load_weights(path, hint)
    return tensors, card, hashlib.sha256(path.read_bytes()).hexdigest()[:12]


def load_state(press: type["StatePress"], directory: Path, shape: ModelShape | None = None, device="cpu"):
    """`press`'s state in `directory` as its `build` makes it (on `device`), its card and its digest; state
    whose tensors `build` cannot take is refused as corrupt, in one line."""
    hint = press.hint(shape.name if shape else "MODEL")
    what = press.what or f"{press.method} state"
    tensors, card, digest = read_state(directory, press.method, press.state_file, shape, hint, what)
    try:
        return press.build(tensors, card, device), card, digest
    except (KeyError, RuntimeError, ValueError) as error:
        raise corrupt(Path(directory) / press.state_file, error, hint) from None


@functools.lru_cache(maxsize=16)
def cached_state(press: type, directory: Path, shape: ModelShape, modified_ns: int, device):
    """The state loaded once per (press class, folder, model, version on disk, device): a sweep reuses it."""
    return load_state(press, directory, shape, device)


@dataclass
class StatePress:
    """Mixed into a kvpress press class ahead of it: the press reads its state (`state_file` + card.json)
    from `weights` (a folder; default presses/<method>/<model name>/), matched to the model (its name before
    it loads, its KV-cache shape and weights identity once it has) and refused in one line otherwise.
    `build(tensors, card, device)` makes the state the press scores with (default: the tensors) and
    `install(state, model)` hands it to the press; `state_digest` keys the press's rows."""

    weights: str | None = None
    state_digest: str | None = field(default=None, init=False, repr=False, compare=False)

    method = ""  # the state's method: its folder under presses/ and its card's `method`
    state_file = ""  # the safetensors file beside card.json
    what = ""  # the state in messages, e.g. "gate weights"; default "<method> state"

    @classmethod
    def hint(cls, name: str) -> str:
        """The command that makes the state for model `name`, for error messages."""
        return train_command_hint(cls.method, name, "weights")

    @classmethod
    def build(cls, tensors: dict, card: dict, device):
        return tensors

    def install(self, state, model, /) -> None:
        raise NotImplementedError

    def check_for_model(self, name: str) -> None:
        """Refuse (one line) a missing or corrupt card, one made for another model, or weights missing,
        corrupt or not finite, before the model loads; the KV-cache shape is checked once it has."""
        directory, hint = state_folder(self.weights, self.method, name), self.hint(name)
        what = self.what or f"{self.method} state"
        check_made_for(read_card(directory, self.method, hint), name, directory, what, hint)
        load_weights(directory / self.state_file, hint)

    def post_init_from_model(self, model) -> None:
        shape = model_shape(model)
        directory, modified = state_version(state_folder(self.weights, self.method, shape.name))
        state, _, self.state_digest = cached_state(type(self), directory, shape, modified, model.device)
        self.install(state, model)
