"""A DistillCache policy on disk: `policy.safetensors` (MLP weights, feature standardisation), `card.json`.

The card says which model the policy was made for (name and KV-cache shape), the features, the training
config and time, the data summary, the validation KL next to the reference presses, and the command.
"""

import hashlib
from pathlib import Path

from safetensors.torch import save_file

from kvbench import resources
from kvbench.distillcache.policy import FEATURES, WINDOW, DistillCachePolicy
from kvbench.training import (
    CARD_FILE,
    ModelShape,
    TrainingFileError,
    check_fits,
    folder_name,
    load_weights,
    read_card,
    write_atomically,
    write_json,
)

METHOD = "distillcache"
WEIGHTS_FILE = "policy.safetensors"


def default_weights_dir(name: str) -> Path:
    """Where the shipped policy of model `name` lives: presses/distillcache/<name>/ (kvbench.resources)."""
    return resources.learned_state_dir("distillcache", folder_name(name))


def train_command_hint(name: str) -> str:
    data = f"data/distillcache/{folder_name(name)}"
    return (
        f"kvbench distillcache datagen --model {name} --out {data} && "
        f"kvbench distillcache train --data {data} "
        f"{resources.out_option(default_weights_dir(name), 'weights')}"
    )


def save_policy(directory: Path, policy: DistillCachePolicy, card: dict) -> None:
    """Write weights then card, each atomically (tmp file + rename)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {name: tensor.detach().cpu().contiguous() for name, tensor in policy.state_dict().items()}
    write_atomically(directory / WEIGHTS_FILE, lambda path: save_file(state, path))
    policy_card = {"arch": policy.arch, "hidden": policy.hidden, "features": list(FEATURES), "window": WINDOW}
    write_json(directory / CARD_FILE, {"method": METHOD, **card, "policy": policy_card})


def load_policy(directory: Path, shape: ModelShape | None = None) -> tuple[DistillCachePolicy, dict, str]:
    """The policy, its card and the digest of its weights file; refused (one line) when missing, corrupt or
    made for another model than `shape`."""
    directory = Path(directory)
    name = shape.name if shape else "MODEL"
    hint = train_command_hint(name)
    card = read_card(directory, METHOD, hint)
    if shape is not None:
        check_fits(card, shape, directory, "DistillCache weights", hint)
    path = directory / WEIGHTS_FILE
    state = load_weights(path, hint)
    arch = (card.get("policy") or {}).get("arch", "shared")  # cards before per-head: shared
    try:
        if arch == "per-head":
            policy = DistillCachePolicy(state["w1"].shape[-1], arch, tuple(state["w1"].shape[:2]))
        else:
            policy = DistillCachePolicy(state["net.0.weight"].shape[0], arch)
        policy.load_state_dict(state)
    except (KeyError, RuntimeError, ValueError) as error:
        reason = str(error).strip().splitlines()[0]
        raise TrainingFileError(f"{path} is corrupt ({reason}); make it again with: {hint}") from None
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
    return policy, card, digest
