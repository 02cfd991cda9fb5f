"""The data store the learned presses train from: a folder of shards plus `manifest.json` (the method that
made it, the model's shape, the datagen config, the shards), written by datagen.py for every method
("shared"), read whole through its schema (`Manifest`) before training starts."""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from kvbench.bridge import models
from kvbench.core.errors import DataFileError, TrainingFileError
from kvbench.core.validation import STRICT, Count, Positive, check_json, parse_json, read_text
from kvbench.learned.common.files import MANIFEST_FILE, corrupt, read_json
from kvbench.learned.common.state import ModelShape, all_finite

SHARED = "shared"  # the method of datagen.py's stores: every learned press trains from them


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
            elif tensor.is_floating_point() and not all_finite(tensor):
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
