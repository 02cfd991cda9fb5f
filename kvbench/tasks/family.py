"""What a built-in task family declares beside the functions of its module (`FAMILY_API` of
kvbench.tasks.registry): a module ends with `FAMILY = Family(...)`, and `BUILT_IN` of the registry lists the
modules. The registry registers each under its name, the training mixtures' `KINDS` (kvbench.tasks.mixture)
read its kinds, and `kvbench export` / `kvbench import` (kvbench.harness.interop) its kvpress datasets. The
checks and the interface every family of a published dataset shares are here too (`check_request`,
`published_api`)."""

from collections.abc import Callable
from dataclasses import dataclass

from kvbench.core.errors import BadInput
from kvbench.tasks.kvpress import Dataset


@dataclass(frozen=True)
class Family:
    """A family's declaration. `kinds`: task -> kind, what its context is made of and what it asks (for the
    training mixtures and the held-out rule, kvbench.tasks.mixture)."""

    name: str  # in the task registry and `kvbench tasks`; a held-out family's is its suite's
    kinds: dict[str, str]
    kvpress: tuple[Dataset, ...] = ()  # the datasets of kvpress's evaluation that carry its rows
    not_kvpress: str = ""  # why kvpress's dataset of this family's name is not this family's (refused)


def check_request(dataset: str, length: int, samples: int, min_length: int) -> None:
    """BadInput in one line unless `length` is at least `min_length` tokens and `samples` at least 1;
    `dataset` names what needs the length (`LooGLE`, or the task)."""
    if length < min_length:
        raise BadInput(f"{dataset} needs length >= {min_length} tokens, got {length}")
    if samples < 1:
        raise BadInput(f"samples must be at least 1, got {samples}")


def published_api(min_length: int) -> tuple[Callable[[str], int], Callable[[str], bool]]:
    """`min_length(task)` and `reads_data_dir(task)` (`FAMILY_API`) of a family of published datasets: each
    of its tasks needs `min_length` tokens and reads its files from --data-dir (else the hub)."""
    return (lambda task: min_length), (lambda task: True)
