"""What the generated-offline families (kvbench.tasks.text and the held-out suites of kvbench.tasks.heldout)
share: text sources that ship with Python and its packages, instruction layouts, and the sample builder
that fills a length (the word pools are kvbench.tasks.words).

A task is a `Generator`: from a sample seed and a number of units (records, paragraphs, lines, e-mails...)
it drafts the material, the instruction, the question, the answer prefix and the one reference, which
appears verbatim in the material. A `Layout` (the instruction wrapper) places the instruction around the
material: in the same user turn, in a system turn, after the material, and so on; each sample draws its
layout from its family's pool, so one generator is seen under several wrappers.

As in RULER (kvbench.tasks.ruler), the input is the largest that fits: the input as the engine builds it
(chat template, question, answer prefix; `tasks.prompt.tokenize_sample`) + max_new_tokens <= length, found by
search on the number of units. Generators pick what is asked first, from the sample's own
`random.Random`, and then grow the material around it, so a longer input only adds units and the answer
stays at about the same relative depth. The sources depend on the Python version (`pydoc_data.topics`, the
standard library's source), as RULER's essay haystack here does.
"""

import functools
import importlib.util
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kvbench.core.errors import BadInput, UnknownTask
from kvbench.tasks import ruler, words
from kvbench.tasks.base import Sample
from kvbench.tasks.prompt import input_token_count

# ---- Sources ----


@dataclass(frozen=True)
class Section:
    """A titled section of the Python language reference (`pydoc_data.topics`), its prose paragraphs only."""

    title: str
    paragraphs: tuple[str, ...]


HEADING_RULE = re.compile(r"^([*=\-~^+#])\1{2,}$")


@functools.cache
def sections() -> tuple[Section, ...]:
    """Every section of the stdlib's reference topics with at least one prose paragraph, titles unique.

    A section starts at an underlined heading; its prose paragraphs are the blocks that are not indented
    (indented blocks are grammar and code) with their hard line breaks joined, so a quoted run of words
    reads the same in the material and in a prediction.
    """
    from pydoc_data.topics import topics

    found: dict[str, list[str]] = {}
    for name in sorted(topics):
        title = None
        for block in re.split(r"\n\s*\n", topics[name]):
            rows = block.splitlines()
            if len(rows) >= 2 and HEADING_RULE.match(rows[-1].strip()):
                title = " ".join(row.strip() for row in rows[:-1])
                found.setdefault(title, [])
                continue
            if title is None or not rows or rows[0].startswith(" ") or len(block.split()) < 12:
                continue
            paragraph = re.sub(r"\s+", " ", block).strip()
            if paragraph not in found[title]:
                found[title].append(paragraph)
    return tuple(Section(title, tuple(paragraphs)) for title, paragraphs in found.items() if paragraphs)


@functools.cache
def paragraphs() -> tuple[str, ...]:
    """All prose paragraphs of `sections()`, in order, each once."""
    return tuple(dict.fromkeys(p for section in sections() for p in section.paragraphs))


@functools.cache
def prose_sentences() -> tuple[str, ...]:
    """Sentences of 6-30 words from the reference prose, ending with a full stop, for e-mail bodies etc."""
    return tuple(
        s
        for p in paragraphs()
        for s in re.split(r"(?<=[.!?]) ", p)
        if 6 <= len(s.split()) <= 30 and s[0].isupper() and s.endswith(".")
    )


# Pure-Python standard library modules, read from the running interpreter's files: plain code with
# docstrings and comments, a few thousand lines each at most.
CODE_MODULES = (
    "textwrap", "colorsys", "calendar", "bisect", "heapq", "shlex", "statistics", "fractions", "string",
    "glob", "fnmatch", "difflib", "csv", "json.encoder", "json.decoder", "gettext", "imghdr", "ipaddress",
    "locale", "netrc", "numbers", "operator", "optparse", "pprint", "queue", "quopri", "random", "reprlib",
    "sched", "secrets", "selectors", "shutil", "smtplib", "stringprep", "tabnanny", "tempfile", "timeit",
    "tokenize", "trace", "uuid", "wave", "zipapp",
)  # fmt: skip


@functools.cache
def code_lines() -> tuple[str, ...]:
    """The source lines of CODE_MODULES (those this Python has), each file opened by a `# File:` comment."""
    lines: list[str] = []
    for module in CODE_MODULES:
        spec = importlib.util.find_spec(module)
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            continue
        lines.append(f"# File: Lib/{module.replace('.', '/')}.py")
        lines += [line.rstrip() for line in Path(spec.origin).read_text(encoding="utf-8").splitlines()]
    return tuple(lines)


# ---- Drafts, layouts, generators ----


@dataclass(frozen=True)
class Draft:
    """One sample before layout."""

    body: str  # the material: records, prose, code...
    instruction: str  # what the material is, and how to answer
    question: str
    answer_prefix: str
    reference: str  # appears verbatim in `body`


@dataclass(frozen=True)
class Placed:
    context: str
    question: str
    messages: list[dict] | None = None


@dataclass(frozen=True)
class Layout:
    """An instruction wrapper: where the instruction and the material go, and how the question follows."""

    name: str
    place: Callable[[Draft], Placed]


@dataclass(frozen=True)
class Generator:
    description: str
    kind: str  # what the context is made of and what the question asks; see kvbench.tasks.mixture
    draft: Callable[[str, int], Draft]  # (sample seed, units) -> Draft, deterministic
    max_new_tokens: int
    min_units: int = 1
    max_units: Callable[[], int] = lambda: 10**4  # how many units the source can give
    min_length: int = 512


def fixed(count: int) -> Callable[[], int]:
    return lambda: count


def in_window(size: int, units: int, target: int, depth: float) -> int:
    """First index of a window of `units` consecutive units out of `size` (cyclic) that puts `target` at
    about `depth` (0 = first, 1 = last) of the window."""
    return (target - min(int(depth * units), units - 1)) % size


def place_at(units: list[str], needle: str, depth: float) -> list[str]:
    """`units` with `needle` inserted at about `depth` (0 = first, 1 = last)."""
    index = min(int(depth * (len(units) + 1)), len(units))
    return [*units[:index], needle, *units[index:]]


def fillers(seed: str, count: int, reserved: list[str], draw: Callable[[random.Random], str]) -> list[str]:
    """`count` units from `draw`, the k-th from its own `random.Random` (so that more units only add
    units), each redrawn until it holds none of the reserved strings (the asked key and its value)."""
    units = []
    for k in range(count):
        rng = random.Random(f"{seed}/unit/{k}")
        units.append(words.free_of(reserved, lambda rng=rng: draw(rng)))
    return units


def with_needle(
    seed: str,
    units: int,
    needle: str,
    depth: float,
    reserved: list[str],
    draw: Callable[[random.Random], str],
) -> list[str]:
    """`units` units: `units - 1` fillers from `draw` (free of the reserved strings) and `needle` at about
    `depth`, as every held-out generator lays out its material."""
    return place_at(fillers(seed, units - 1, reserved, draw), needle, depth)


# ---- Samples ----


def as_sample(task: str, draft: Draft, layout: Layout, max_new_tokens: int, length: int, sample_id: str):
    placed = layout.place(draft)
    return Sample(
        task=task,
        id=sample_id,
        context=placed.context,
        question=placed.question,
        answer_prefix=draft.answer_prefix,
        references=[draft.reference],
        max_new_tokens=max_new_tokens,
        metric="string_match_all",
        meta={"length": length, "layout": layout.name},
        messages=placed.messages,
    )


def family_api(generators: dict[str, Generator], layouts: tuple[Layout, ...]):
    """What a generated family module exposes to the task registry (kvbench.tasks): TASKS, KINDS, METRICS,
    min_length(task) and make_samples(task, length, samples, seed, tokenizer, data_dir), from its
    generators and layouts. Every generated task is scored by RULER's string_match_all on its one
    reference."""

    def min_length(task: str) -> int:
        return generators[task].min_length

    def family_samples(task: str, length: int, samples: int, seed: int, tokenizer, data_dir=None):
        return make_samples(generators, layouts, task, length, samples, seed, tokenizer)

    tasks = {name: generator.description for name, generator in generators.items()}
    kinds = {name: generator.kind for name, generator in generators.items()}
    return tasks, kinds, {"string_match_all": ruler.string_match_all}, min_length, family_samples


def make_samples(
    generators: dict[str, Generator],
    layouts: tuple[Layout, ...],
    task: str,
    length: int,
    samples: int,
    seed: int,
    tokenizer,
) -> list[Sample]:
    """`samples` samples of `task` whose input + max_new_tokens fill `length` tokens at most."""
    if task not in generators:
        raise UnknownTask(f"unknown task {task!r}: choose one of {', '.join(generators)}")
    generator = generators[task]
    if length < generator.min_length:
        raise BadInput(f"{task} needs a length of at least {generator.min_length} tokens, got {length}")
    result, units = [], None
    for i in range(samples):
        sample_seed, sample_id = f"{task}/{seed}/{i}", f"{seed}-{i}"
        layout = layouts[random.Random(f"{sample_seed}/layout").randrange(len(layouts))]
        draft_at = functools.cache(functools.partial(generator.draft, sample_seed))

        def sample_at(n: int, draft_at=draft_at, layout=layout, sample_id=sample_id) -> Sample:
            return as_sample(task, draft_at(n), layout, generator.max_new_tokens, length, sample_id)

        tokens_at = functools.cache(lambda n, sample_at=sample_at: input_token_count(tokenizer, sample_at(n)))
        low, budget = generator.min_units, length - generator.max_new_tokens
        if tokens_at(low) > budget:
            raise BadInput(f"{task} does not fit in {length} tokens with this tokenizer: use a larger length")
        # Samples differ little, so the previous sample's size is a good first guess.
        units = ruler.largest_fitting(tokens_at, budget, low, generator.max_units(), units)
        result.append(sample_at(units))
    return result
