"""A DistillCache policy on disk: `policy.safetensors` (MLP weights, feature standardisation), `card.json`.

The card says which model the policy was made for (name and KV-cache shape), the features, the training
config and time, the data summary, the validation KL next to the reference presses, and the command.
"""

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
from kvbench.learned.distillcache.config import METHOD, train_command_hint
from kvbench.learned.distillcache.policy import FEATURES, WINDOW, DistillCachePolicy

WEIGHTS_FILE = "policy.safetensors"


def default_weights_dir(name: str) -> Path:
    """Where the shipped policy of model `name` lives: presses/distillcache/<name>/ (core.resources)."""
    return shipped_state_dir(METHOD, name)


def save_policy(directory: Path, policy: DistillCachePolicy, card: dict) -> None:
    """Weights and card in the learned presses' one format."""
    policy_card = {"arch": policy.arch, "hidden": policy.hidden, "features": list(FEATURES), "window": WINDOW}
    save_learned_state(directory, WEIGHTS_FILE, policy, {"method": METHOD, **card, "policy": policy_card})


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
