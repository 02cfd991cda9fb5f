"""Fitting a fitted press's state: what a fit reads (`FitConfig`), each method's module (`method`), its
options checked against its declaration (kvbench.learned.catalog) before any work, and what the state's
card records of the fit."""

import json
import math
from dataclasses import asdict, dataclass, field

from kvbench.core.errors import BadInput
from kvbench.core.validation import parse_value
from kvbench.learned.catalog import FITTED, Fit
from kvbench.learned.common import model_shape

# Each is a press name, the name of its fitting method and of its module here.
METHODS = tuple(FITTED)


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


def declared(name: str) -> Fit:
    """How fitted press `name` is fitted (its declaration, kvbench.learned.catalog); BadInput for a name that
    is no fitted press."""
    fit = FITTED[name].fit if name in FITTED else None
    if fit is None:
        raise BadInput(f"unknown fitted press {name!r}: choose one of {', '.join(METHODS)}")
    return fit


def check_prompts(name: str, prompts: int) -> None:
    """BadInput when the mixture gives fewer prompts than the method fits on."""
    needed = declared(name).min_prompts
    if prompts < needed:
        raise BadInput(
            f"fit {name} needs {needed} prompts or more, the mixture gives {prompts}: give more --samples"
        )


def method(name: str):
    """The module of fitted press `name` (kvbench/learned/fitted/NAME.py): its press class and its
    `fit(model, tokenizer, contexts, options) -> (tensors, validation)` on (1, P) context ids."""
    import importlib

    declared(name)
    return importlib.import_module(f"kvbench.learned.fitted.{name}")


def check_options(name: str, options: dict) -> dict:
    """`options` (NAME=VALUE from the command line) over the method's defaults, each of its default's type;
    BadInput for one the method does not take, for a switch that is not true or false (read as a press
    argument is, `validation.parse_value`), and for a number that is not finite, negative, or 0 where its
    default is not (a width, a step count or a learning rate of 0 fits nothing)."""
    defaults = declared(name).options
    checked = dict(defaults)
    for key, value in options.items():
        if key not in defaults:
            known = ", ".join(defaults) or "none"
            raise BadInput(f"fit {name} takes no option {key!r} (it takes: {known})")
        kind = type(defaults[key])
        try:
            checked[key] = kind(value) if kind is not bool else parse_value(str(value), key, ValueError)
            if not isinstance(checked[key], kind):
                raise ValueError(value)
        except ValueError:
            what = "true or false" if kind is bool else kind.__name__
            raise BadInput(f"fit {name}: {key}={value!r} is not {what}") from None
        number, zero_allowed = checked[key], defaults[key] == 0
        in_range = number > 0 or (number == 0 and zero_allowed)
        if kind in (int, float) and not (math.isfinite(number) and in_range):
            least = "0 or more" if zero_allowed else "above 0"
            raise BadInput(f"fit {name}: {key}={value!r} must be a finite number {least}")
    return checked


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
