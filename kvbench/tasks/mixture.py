"""Training mixtures for learned presses, and the rule that keeps held-out task kinds out of them.

A mixture is a list of parts: a task at a length with a number of prompts. Every task has a *kind* (what its
context is made of and what its question asks); a held-out suite may only hold tasks whose kinds appear in
no mixture (see TRAINING.md), which tests assert through `KINDS`.
"""

from dataclasses import dataclass


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

MIXTURES: dict[str, list[Part]] = {
    # What the agents shipped before the mixture were trained on: RULER's offline generators at 1k.
    "ruler": [Part(task, 1024, 12) for task in RULER_TRAINING_TASKS],
}

# task -> kind. RULER's tasks share kinds by generator family (needle in a haystack, variable tracking, word
# counting); other families add theirs.
KINDS: dict[str, str] = {
    **{task: "ruler-niah" for task in RULER_TRAINING_TASKS if task.startswith("niah")},
    "vt": "ruler-variable-tracking",
    "cwe": "ruler-word-frequency",
    "fwe": "ruler-word-frequency",
}


def mixture_kinds(name: str) -> set[str]:
    return {KINDS[part.task] for part in MIXTURES[name]}
