"""Fitted presses: kvpress's own press classes whose state kvpress downloads from a hub (Q-Filters, KVzap,
Fast KVzip, expected attention's query statistics, DuoAttention), with that state fitted here for any
model, offline, on kvbench's generated training text (a training mixture at seeds >= 1000, never
evaluation's 0..999).

A fitted press is one module (`qfilter.py`, `kvzap.py`, `fastkvzip.py`, ...) holding a `Method`
(its `fit(model, tokenizer, contexts, options) -> (tensors, validation)`) and its press: kvpress's class
with only the loader replaced (`FittedState.post_init_from_model` hands the fitted tensors to the class
through `install`; the scoring is kvpress's). State is written in the learned presses' one format:
`state.safetensors` + `card.json` (method, the model's shape and weights identity, data, recipe, seed, the
state file's sha256), default folder presses/<method>/<model>/, matched to the model by its weights
identity.
"""

import functools
import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kvbench.core import resources
from kvbench.core.errors import BadInput
from kvbench.learned.common import (
    ModelShape,
    check_fits,
    check_made_for,
    load_weights,
    model_shape,
    read_card,
    save_learned_state,
    shipped_state_dir,
    state_folder,
    state_version,
)

STATE_FILE = "state.safetensors"
HUB = "hub"  # `--press-arg weights=hub`: kvpress's own download, where the hub publishes the model's state
# Each is a press name, the name of its fitting method and of its module here.
METHODS = ("qfilter", "kvzap", "fastkvzip", "expected_attention_stats", "duo_attention")


@dataclass
class FitConfig:
    """What a fit reads: `samples` prompts of every part of training mixture `mixture` (each at its own
    length, or at `length`), drawn at `seed` (>= 1000: evaluation's seeds are 0..999) as datagen draws them,
    and the method's own `options`."""

    mixture: str = "broad"
    samples: int = 1
    length: int | None = None
    seed: int = 10_000
    options: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.seed < 1000:
            raise BadInput(f"--seed {self.seed}: evaluation uses seeds 0..999, so fitting starts at 1000")


@dataclass(frozen=True)
class Method:
    """A fitted press: `fit(model, tokenizer, contexts, options) -> (tensors, validation)` on (1, P) context
    ids, the options it takes with their defaults, and what one line of `kvbench fit` says it fits."""

    name: str
    fit: Callable
    defaults: dict
    description: str
    min_prompts: int = 1  # kvzap holds prompts out to validate


def check_prompts(name: str, prompts: int) -> None:
    """BadInput when the mixture gives fewer prompts than the method fits on."""
    needed = method(name).min_prompts
    if prompts < needed:
        raise BadInput(
            f"fit {name} needs {needed} prompts or more, the mixture gives {prompts}: give more --samples"
        )


def fit_hint(method: str, name: str) -> str:
    """The command that makes `method`'s state for model `name`, for error messages."""
    out = resources.out_option(shipped_state_dir(method, name), "weights")
    return f"kvbench fit {method} --model {name} {out}"


def method(name: str) -> Method:
    import importlib

    if name not in METHODS:
        raise BadInput(f"unknown fitted press {name!r}: choose one of {', '.join(METHODS)}")
    return importlib.import_module(f"kvbench.learned.fitted.{name}").METHOD


def check_options(name: str, options: dict) -> dict:
    """`options` (NAME=VALUE from the command line) over the method's defaults, each of its default's type;
    BadInput for one the method does not take, and for a number that is not finite, negative, or 0 where
    its default is not (a width, a step count or a learning rate of 0 fits nothing)."""
    defaults = method(name).defaults
    checked = dict(defaults)
    for key, value in options.items():
        if key not in defaults:
            known = ", ".join(defaults) or "none"
            raise BadInput(f"fit {name} takes no option {key!r} (it takes: {known})")
        kind = type(defaults[key])
        try:
            checked[key] = kind(value) if kind is not bool else str(value).lower() in ("1", "true", "yes")
        except ValueError:
            raise BadInput(f"fit {name}: {key}={value!r} is not {kind.__name__}") from None
        number, zero_allowed = checked[key], defaults[key] == 0
        in_range = number > 0 or (number == 0 and zero_allowed)
        if kind in (int, float) and not (math.isfinite(number) and in_range):
            least = "0 or more" if zero_allowed else "above 0"
            raise BadInput(f"fit {name}: {key}={value!r} must be a finite number {least}")
    return checked


def save_fitted(directory: Path, name: str, tensors: dict, card: dict) -> dict:
    """Write `tensors` and their card (the state file's sha256 added) as the learned presses' state; returns
    the card."""
    from safetensors.torch import save

    state = {key: tensor.detach().cpu().contiguous() for key, tensor in tensors.items()}
    card = {"method": name, **card, "state_sha256": hashlib.sha256(save(state)).hexdigest()}
    save_learned_state(directory, STATE_FILE, state, card)
    return card


def load_fitted(directory: Path, name: str, shape: ModelShape) -> tuple[dict, dict, str]:
    """The fitted tensors, their card and the digest of the state file; refused in one line when missing,
    corrupt, or made for another model (KV-cache shape or weights) than `shape`."""
    hint = fit_hint(name, shape.name)
    card = read_card(directory, name, hint)
    check_fits(card, shape, directory, f"{name} state", hint)
    path = Path(directory) / STATE_FILE
    tensors = load_weights(path, hint)
    return tensors, card, hashlib.sha256(path.read_bytes()).hexdigest()[:12]


@functools.lru_cache(maxsize=8)
def cached_state(directory: Path, name: str, shape: ModelShape, modified_ns: int):
    """The fitted state loaded once per (folder, method, model, version on disk)."""
    return load_fitted(directory, name, shape)


@dataclass
class FittedState:
    """Mixed into a kvpress press class ahead of it: the press reads fitted state from `weights` (a folder;
    default presses/<method>/<model>/) instead of downloading it; `install(tensors, model)` hands the state
    to the class in the form its own loader would. `weights="hub"` keeps kvpress's own loader (a
    download, for the models the hub publishes state for)."""

    weights: str | None = None

    method = ""  # the fitted method, e.g. "qfilter"

    def check_for_model(self, name: str) -> None:
        """Refuse (one line) missing or corrupt state, or state made for another model by name, before the
        model loads; the KV-cache shape and the weights identity are checked once it has."""
        if self.weights == HUB:
            from kvbench.bridge.models import hub_reachable
            from kvbench.core.errors import UnknownPress

            if not hub_reachable():
                raise UnknownPress(
                    f"{self.method} with weights=hub downloads its state from the Hugging Face hub, which "
                    f"is not reachable; fit it instead: {fit_hint(self.method, name)}"
                )
            return
        directory, hint = state_folder(self.weights, self.method, name), fit_hint(self.method, name)
        check_made_for(read_card(directory, self.method, hint), name, directory, f"{self.method} state", hint)
        load_weights(directory / STATE_FILE, hint)

    def post_init_from_model(self, model) -> None:
        if self.weights == HUB:
            return super().post_init_from_model(model)  # ty: ignore[missing-attribute]
        shape = model_shape(model)
        directory, modified = state_version(state_folder(self.weights, self.method, shape.name))
        tensors, _, self.state_digest = cached_state(directory, self.method, shape, modified)
        self.install(tensors, model)

    def install(self, tensors: dict, model) -> None:
        raise NotImplementedError


def card_of(model, config: FitConfig, contexts: list, seconds: float, validation: dict) -> dict:
    """What a fitted state's card records beside the method and the state's sha256."""
    return {
        "model": asdict(model_shape(model)),
        "data": {
            "mixture": config.mixture,
            "samples_per_part": config.samples,
            "length": config.length,
            "seed": config.seed,
            "prompts": len(contexts),
            "prompt_tokens": sum(int(ids.shape[-1]) for ids in contexts),
        },
        "recipe": config.options,
        "seconds": round(seconds, 1),
        "validation": validation,
    }


def describe_card(card: dict) -> str:
    return json.dumps({key: card[key] for key in ("data", "recipe", "validation") if key in card})
