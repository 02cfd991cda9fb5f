"""Fitted presses: kvpress's own press classes whose state kvpress downloads from a hub (Q-Filters, KVzap,
Fast KVzip, expected attention's query statistics, DuoAttention), with that state fitted here for any
model, offline, on kvbench's generated training text (a training mixture at seeds >= 1000, never
evaluation's 0..999).

A fitted press is one module (`qfilter.py`, `kvzap.py`, `fastkvzip.py`, ...) holding its
`fit(model, tokenizer, contexts, options) -> (tensors, validation)` (the contexts' token ids, read once in
order; `kvbench fit` hands them through a progress bar) and its press: kvpress's class
with only the loader replaced (press.py's `FittedState` hands the fitted tensors to the class through
`install`; the scoring is kvpress's). fitting.py holds what every fit shares; a press's declaration (its
options, what it fits, its line in the registry) is in kvbench.learned.catalog. State is written in the
learned presses' one format: `state.safetensors` + `card.json` (method, the model's shape and weights
identity, data, recipe, seed, the state file's sha256), default folder presses/<method>/<model>/, matched
to the model by its weights identity.
"""

from kvbench.learned.fitted.fitting import (
    METHODS,
    FitConfig,
    card_of,
    check_options,
    check_prompts,
    describe_card,
    method,
)
from kvbench.learned.fitted.press import HUB, STATE_FILE, FittedState, fit_hint, save_fitted

__all__ = [
    "HUB",
    "METHODS",
    "STATE_FILE",
    "FitConfig",
    "FittedState",
    "card_of",
    "check_options",
    "check_prompts",
    "describe_card",
    "fit_hint",
    "method",
    "save_fitted",
]
