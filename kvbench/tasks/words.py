"""Word material the generated task families share (agent traces, the text kinds, the held-out suites):
plain adjectives and nouns from wonderwords, people's names, cities, digit strings, and draws that keep
reserved strings out.

Sharing word pools with training kinds is allowed by the held-out rule (docs/learned-presses.md): the
vocabulary is shared, the structure is not."""

import functools
import random
import re
from collections.abc import Callable

from kvbench.tasks import ruler


@functools.cache
def word_pools() -> tuple[list[str], list[str]]:
    """(adjectives, nouns) from wonderwords: plain lowercase words of 3-9 letters, easy to read and quote."""
    adjectives, nouns, _ = ruler.word_lists()

    def plain(pool: list[str]) -> list[str]:
        return [w for w in pool if re.fullmatch(r"[a-z]{3,9}", w)]

    return plain(adjectives), plain(nouns)


def adjective(rng: random.Random) -> str:
    return rng.choice(word_pools()[0])


def noun(rng: random.Random) -> str:
    return rng.choice(word_pools()[1])


def adjective_noun(rng: random.Random, sep: str = " ") -> str:
    """ "steady lantern": names of things, keys, jobs (with sep "-")."""
    return f"{adjective(rng)}{sep}{noun(rng)}"


def two_nouns(rng: random.Random, sep: str = "_") -> str:
    """ "lantern_harbor": setting keys, identifiers, host names (with sep "-")."""
    return f"{noun(rng)}{sep}{noun(rng)}"


# People's names for authors, senders and characters.
FIRST_NAMES = (
    "Ada", "Bruno", "Clara", "Dmitri", "Elena", "Farid", "Greta", "Hiro", "Ines", "Jonas", "Keiko", "Lars",
    "Maya", "Nadia", "Omar", "Priya", "Quentin", "Rosa", "Samir", "Tessa", "Umar", "Vera", "Wendell",
    "Ximena", "Yusuf", "Zofia",
)  # fmt: skip
SURNAMES = (
    "Tanaka", "Silva", "Novak", "Okafor", "Larsen", "Moreau", "Rossi", "Kowalski", "Haddad", "Fischer",
    "Nguyen", "Costa", "Ivanova", "Murphy", "Schmidt", "Kaur", "Mendez", "Dubois", "Berg", "Ahmed", "Sato",
    "Walsh", "Horvat", "Lindqvist", "Petrov", "Keller", "Banerjee", "Ortiz", "Jansen", "Mwangi",
)  # fmt: skip
CITIES = (
    "Lyon", "Porto", "Oslo", "Leeds", "Graz", "Turku", "Kyoto", "Dakar", "Quito", "Perth", "Tampa", "Cork",
    "Split", "Ghent", "Bonn", "Lille",
)  # fmt: skip


def person(rng: random.Random) -> str:
    return f"{rng.choice(FIRST_NAMES)} {rng.choice(SURNAMES)}"


def digits(rng: random.Random, count: int) -> str:
    return str(rng.randint(10 ** (count - 1), 10**count - 1))


def free_of(reserved: list[str], draw: Callable[[], str]) -> str:
    """A line from `draw` that holds none of the reserved strings (case-insensitive, as the metric reads).

    Reserved strings are random values and compound keys (digits, hyphenated or underscored word pairs),
    which no template's fixed text contains, so a few draws suffice.
    """
    for _ in range(1000):
        line = draw()
        if not any(r.lower() in line.lower() for r in reserved):
            return line
    raise RuntimeError(f"cannot draw a line without {reserved}: a template holds one of them")
