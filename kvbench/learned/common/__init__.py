"""What every learned press's training shares: the model shape its files are made for, the data store's
manifest, the checkpoint card, atomic writes, and one-line errors that name the file and the command that
makes the right one.

KVP (learned/kvp/) and DistillCache (learned/distillcache/) both build on it: a data store is a folder of
shards plus `manifest.json` (the method that made it, the model's shape, the datagen config, the shards),
written by datagen.py for both ("shared"); a checkpoint is a folder with a safetensors file of weights plus
`card.json` (the method, the model's shape, the training config, the data summary, validation).
"""

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from kvbench.bridge import models
from kvbench.core import resources
from kvbench.core.errors import BadInput, DataFileError, TrainingFileError, WriteError
from kvbench.core.validation import STRICT, Count, Positive, check_json, parse_json, read_text

MANIFEST_FILE = "manifest.json"
CARD_FILE = "card.json"
SHARED = "shared"  # the method of datagen.py's stores: every learned press trains from them


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


def write_atomically(path: Path, write) -> None:
    """write(tmp_path), then rename over `path`: a reader never sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    os.replace(tmp, path)


def write_json(path: Path, content: dict) -> None:
    write_atomically(path, lambda tmp: tmp.write_text(json.dumps(content, indent=1) + "\n"))


def corrupt(path: Path, reason, hint: str) -> TrainingFileError:
    if isinstance(reason, BaseException):
        reason = models.first_line(reason)
    return TrainingFileError(f"{path} is corrupt ({reason}); make it again with: {hint}")


def read_json(path: Path, what: str, hint: str) -> dict:
    """A JSON file as a dict, or a one-line error naming the file and `hint` (the command that makes it)."""
    if not path.is_file():
        raise TrainingFileError(f"no {what} at {path.parent} (missing {path.name}); make it with: {hint}")
    try:
        content = parse_json(path.read_text())
        if not isinstance(content, dict):
            raise ValueError("not a JSON object")
    except (ValueError, UnicodeDecodeError) as error:
        raise corrupt(path, error, hint) from None
    return content


@dataclass
class Shard:
    """One prompt of a data store, as its manifest lists it (datagen.py writes more fields, read by none)."""

    __pydantic_config__ = STRICT

    file: str  # a file in the store's folder (`read_manifest` refuses a path)
    split: Literal["train", "val"]
    prompt_tokens: Positive
    task: str | None = None
    length: Positive | None = None
    sample_id: str | None = None
    question_tokens: Count | None = None
    continuation_tokens: Count | None = None


@dataclass
class Manifest:
    """The schema of a data store's manifest.json: checked whole when a store is read, so a trainer never
    meets a field of the wrong type half-way through training."""

    __pydantic_config__ = STRICT

    model: ModelShape
    config: dict[str, Any]
    shards: list[Shard]
    method: str = "kvp"  # stores from before the field existed are KVP's
    mixture: str | None = None
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"  # the model's while it ran the prompts


def existing_manifest(directory: Path) -> dict | None:
    """The manifest an earlier datagen run left in `directory` (None if there is none); a corrupt one is an
    error. Here, without torch, so that `datagen` refuses one before it imports what it generates with."""
    path = Path(directory) / MANIFEST_FILE
    if not path.is_file():
        return None
    try:
        text = read_text(path, ValueError)
        check_json(Manifest, text, "", ValueError)  # its schema: what a resumed run appends to
    except ValueError as error:  # UnicodeDecodeError is one
        raise DataFileError(f"{path}: not a datagen manifest ({str(error).splitlines()[0]})") from None
    return parse_json(text)


def manifest_method(manifest: dict) -> str:
    """The method that made a data store; stores from before the field existed are KVP's."""
    return manifest.get("method", "kvp")


def datagen_hint(method: str, name: str = "MODEL", out: str = "DIR") -> str:
    """The command that makes a data store `method` trains from (both presses' datagen make the same)."""
    return f"kvbench {method} datagen --model {name} --out {out}"


def read_manifest(directory: Path, method: str) -> dict:
    """A data store's manifest, refused when it is missing, corrupt or lacks what `method` trains on: a
    shared store serves every method; one made by a single method (before the shared store) serves only it.
    """
    path = Path(directory) / MANIFEST_FILE
    hint = datagen_hint(method, out=str(directory))
    manifest = read_json(path, f"{method} data", hint)
    made_by = manifest_method(manifest)
    if made_by not in (method, SHARED):
        model = manifest.get("model")
        name = model.get("name", "MODEL") if isinstance(model, dict) else "MODEL"
        raise TrainingFileError(
            f"{path} is a {made_by} data store, which lacks what {method} trains on; make data in another "
            f"folder with: {datagen_hint(method, name)}"
        )
    try:
        checked = check_json(Manifest, json.dumps(manifest), "", ValueError)
    except ValueError as error:
        raise corrupt(path, error, hint) from None
    for shard in checked.shards:
        if shard.file != Path(shard.file).name or shard.file in ("", ".", ".."):
            raise corrupt(path, f"shard file {shard.file!r} is not a file name in {directory}", hint)
    files = [shard.file for shard in checked.shards]
    if len(set(files)) != len(files):
        raise corrupt(path, "a shard is listed twice", hint)
    return manifest


# The tensors of a shard whose shape is checked on reading: (layers, KV heads, prompt tokens), then
# head_dim (True) or whatever the tensor holds per token (False); all must be finite.
SHARD_SHAPES = {"keys": True, "values": True, "utility": False, "reconstruction": False, "features": False}


class TrainingData:
    """The shards of one or more data stores made for one model, as `method` trains on them: several folders
    train on their union (e.g. `--mixture ruler` and `--mixture text` made apart), so a mixture part made
    once serves every mixture that holds it. Each shard records its folder; subclasses read the tensors."""

    method = ""  # the trainer's method, e.g. "kvp"
    label = ""  # its name in messages, e.g. "KVP"

    def __init__(self, directories: Path | list[Path]):
        directories = [directories] if isinstance(directories, (str, Path)) else directories
        self.directories = [Path(directory) for directory in directories]
        self.manifests = [read_manifest(directory, self.method) for directory in self.directories]
        models = [manifest["model"] for manifest in self.manifests]
        if any(not ModelShape(**model).fits(ModelShape(**models[0])) for model in models):
            names = ", ".join(f"{d} ({m.get('name')})" for d, m in zip(self.directories, models, strict=True))
            raise TrainingFileError(f"{self.label} data folders made for different models: {names}")
        self.shape = ModelShape(**models[0])
        shards = [
            {**shard, "directory": str(directory)}
            for directory, manifest in zip(self.directories, self.manifests, strict=True)
            for shard in manifest["shards"]
        ]
        self.train = [shard for shard in shards if shard["split"] == "train"]
        self.val = [shard for shard in shards if shard["split"] == "val"]
        if not self.train or not self.val:
            raise TrainingFileError(
                f"{self.label} data at {self.where} needs train and val prompts; it has {len(self.train)} "
                f"train and {len(self.val)} val; make more with: {self.hint()}"
            )

    @property
    def where(self) -> str:
        return ", ".join(map(str, self.directories))

    def read_tensors(self, shard: dict, names) -> dict:
        """The named tensors of one shard. A shard that is missing, truncated or not safetensors, lacks a
        tensor, or holds one of another shape than the manifest says (`SHARD_SHAPES`) or not finite, is a
        one-line TrainingFileError naming it, not a traceback half-way through training."""
        import torch
        from safetensors import safe_open

        path = Path(shard["directory"]) / shard["file"]
        try:
            with safe_open(path, framework="pt") as file:
                tensors = {name: file.get_tensor(name) for name in names}
        except Exception as error:  # missing or truncated shard: safetensors raises its own types
            raise TrainingFileError(
                f"{path} is unreadable ({models.first_line(error)}); make it again with: {self.hint()}"
            ) from None
        shape = self.shape
        heads = (shape.num_layers, shape.num_kv_heads, shard["prompt_tokens"])
        for name, tensor in tensors.items():
            if name not in SHARD_SHAPES:
                continue
            wanted = (*heads, shape.head_dim) if SHARD_SHAPES[name] else heads
            got = tuple(tensor.shape)
            if got[: len(wanted)] != wanted or (SHARD_SHAPES[name] and len(got) != len(wanted)):
                reason = f"{name} of shape {got}, not {wanted}"
            elif not torch.isfinite(tensor).all():
                reason = f"{name} holds values that are not finite"
            else:
                continue
            raise TrainingFileError(f"{path} is corrupt ({reason}); make it again with: {self.hint()}")
        return tensors

    def hint(self, name: str | None = None, out: str | None = None) -> str:
        """The datagen command for these folders (or `out`), for model `name` (default: the data's)."""
        out = out or (str(self.directories[0]) if len(self.directories) == 1 else "DIR")
        return datagen_hint(self.method, name or self.shape.name, out)

    def summary(self) -> dict:
        """What a checkpoint's card records of its data: each folder's mixture, config and size."""
        folders = [
            {
                "folder": str(directory),
                "mixture": manifest.get("mixture"),
                **manifest["config"],
                "prompts": len(manifest["shards"]),
            }
            for directory, manifest in zip(self.directories, self.manifests, strict=True)
        ]
        return {
            **(folders[0] if len(folders) == 1 else {"folders": folders}),
            "train_prompts": len(self.train),
            "val_prompts": len(self.val),
            "prompt_tokens": sum(shard["prompt_tokens"] for shard in self.train + self.val),
        }


def read_card(directory: Path, method: str, hint: str) -> dict:
    """A checkpoint's card, refused when it is missing, corrupt or made by another method."""
    path = Path(directory) / CARD_FILE
    card = read_json(path, f"{method} weights", hint)
    made_by = card.get("method", "kvp")
    if made_by != method:
        raise TrainingFileError(f"{path} holds {made_by} weights, not {method}'s; make them with: {hint}")
    try:
        check_json(ModelShape, json.dumps(card.get("model")), "field 'model'", ValueError)
    except ValueError as error:
        raise corrupt(path, error, hint) from None
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


def check_finite(state: dict, path: Path, hint: str, error=TrainingFileError) -> dict:
    """`state` (a checkpoint's tensors, read from `path`), refused in one line where a floating tensor holds
    nan or inf: a press scoring with such weights ranks every entry alike and scores 0 without a word (a
    diverged training, a damaged file)."""
    import torch

    for name, tensor in state.items():
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            bad = int((~torch.isfinite(tensor)).sum())
            raise error(
                f"{path}: {name} holds {bad} of {tensor.numel()} values that are not finite (nan or inf); "
                f"make it again with: {hint}"
            )
    return state
