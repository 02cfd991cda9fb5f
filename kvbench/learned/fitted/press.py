"""A fitted press's state: kvpress's own press class with only its loader replaced (`FittedState`: the
learned presses' state loading, `kvbench.learned.common.StatePress`), and the state written in their one
format, `state.safetensors` + `card.json` (the state file's sha256 added)."""

import hashlib
from dataclasses import dataclass
from pathlib import Path

from kvbench.core import resources
from kvbench.learned.common import StatePress, save_learned_state, shipped_state_dir

STATE_FILE = "state.safetensors"
HUB = "hub"  # `--press-arg weights=hub`: kvpress's own download, where the hub publishes the model's state


def fit_hint(method: str, name: str) -> str:
    """The command that makes `method`'s state for model `name`, for error messages."""
    out = resources.out_option(shipped_state_dir(method, name), "weights")
    return f"kvbench fit {method} --model {name} {out}"


def save_fitted(directory: Path, name: str, tensors: dict, card: dict) -> dict:
    """Write `tensors` and their card (the state file's sha256 added) as the learned presses' state; returns
    the card."""
    from safetensors.torch import save

    state = {key: tensor.detach().cpu().contiguous() for key, tensor in tensors.items()}
    card = {"method": name, **card, "state_sha256": hashlib.sha256(save(state)).hexdigest()}
    save_learned_state(directory, STATE_FILE, state, card)
    return card


@dataclass
class FittedState(StatePress):
    """Mixed into a kvpress press class ahead of it: the press reads fitted state from `weights` (a folder;
    default presses/<method>/<model>/) instead of downloading it; `install(tensors, model)` hands the state
    to the class in the form its own loader would. `weights="hub"` keeps kvpress's own loader (a
    download, for the models the hub publishes state for)."""

    state_file = STATE_FILE

    @classmethod
    def hint(cls, name: str) -> str:
        return fit_hint(cls.method, name)

    def check_for_model(self, name: str) -> None:
        """Refuse (one line) missing or corrupt state, or state made for another model by name, before the
        model loads; the KV-cache shape and the weights identity are checked once it has."""
        if self.weights != HUB:
            return super().check_for_model(name)
        from kvbench.bridge.models import hub_reachable
        from kvbench.core.errors import UnknownPress

        if not hub_reachable():
            raise UnknownPress(
                f"{self.method} with weights=hub downloads its state from the Hugging Face hub, which "
                f"is not reachable; fit it instead: {fit_hint(self.method, name)}"
            )

    def post_init_from_model(self, model) -> None:
        if self.weights == HUB:  # the kvpress class's own loader
            return super(StatePress, self).post_init_from_model(model)  # ty: ignore[missing-attribute]
        super().post_init_from_model(model)
