"""Training mixtures for learned presses, and the rule that keeps held-out task kinds out of them.

A mixture is a list of parts: a task at a length with a number of prompts. Every task has a *kind* (what its
context is made of, how the asked value is written in it, and what the question asks); a held-out suite may
only hold tasks whose kinds appear in no mixture (the rule is in docs/learned-presses.md), which tests assert
through `KINDS`. Training draws seeds >= 1000; evaluation uses 0..999."""

from dataclasses import dataclass

from kvbench.core.errors import BadInput
from kvbench.tasks import text
from kvbench.tasks.registry import BUILT_IN


@dataclass(frozen=True)
class Part:
    task: str
    length: int  # context tokens, as the task generator understands it
    samples: int  # prompts of this (task, length)


# Not qa_1/qa_2: their samples are the datasets' questions in order whatever the seed (overlap evaluation).
RULER_TRAINING_TASKS = (
    "niah_single_1",
    "niah_single_2",
    "niah_single_3",
    "niah_multikey_1",
    "niah_multikey_2",
    "niah_multikey_3",
    "niah_multivalue",
    "niah_multiquery",
    "vt",
    "cwe",
    "fwe",
)

# Prompts per training kind at each length. The embedded model answers few 2k prompts and datagen costs
# grow faster than the length there, so 2048 gets few; 512 and 1024 carry the breadth.
TEXT_LENGTHS = {512: 6, 1024: 8, 2048: 2}

MIXTURES: dict[str, list[Part]] = {
    # What the agents shipped before the mixture were trained on: RULER's offline generators at 1k.
    "ruler": [Part(task, 1024, 12) for task in RULER_TRAINING_TASKS],
    # The text kinds alone at 512-2048 (docs/learned-presses.md): made apart, they train beside `ruler`'s data
    # (`kvbench kvp train --data RULER_DIR --data TEXT_DIR`), which is then `broad`.
    "text": [Part(task, length, samples) for task in text.TASKS for length, samples in TEXT_LENGTHS.items()],
}
MIXTURES["broad"] = MIXTURES["ruler"] + MIXTURES["text"]


# task -> kind, for every task of kvbench's families, as each declares them (`Family.kinds`).
KINDS: dict[str, str] = {task: kind for module in BUILT_IN for task, kind in module.FAMILY.kinds.items()}


class UnknownMixture(BadInput, KeyError):
    """A mixture name that is not in MIXTURES; str() is the one-line message (KeyError's would quote it)."""

    def __str__(self) -> str:
        return self.args[0]


def mixture(name: str) -> list[Part]:
    """The parts of mixture `name`; UnknownMixture (a KeyError) with a one-line message if there is none."""
    if name not in MIXTURES:
        raise UnknownMixture(f"unknown mixture {name!r}: choose one of {', '.join(MIXTURES)}")
    return MIXTURES[name]


def mixture_kinds(name: str) -> set[str]:
    return {KINDS[part.task] for part in mixture(name)}
