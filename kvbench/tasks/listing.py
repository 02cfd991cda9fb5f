"""Long checkable answers, generated offline: list every item of a kind from the context, in order, or
continue a passage of the context word for word.

The decode-heavy protocol needs answers of hundreds of tokens that are scored whole: here the context holds
`ITEMS` record lines ("Crate 417 holds copper wire.") among noise and distractor records of another kind
("Barrel 52 holds ..."), and the question asks for every crate and its cargo, one line each, in the order
of the context (about 200 tokens of answer with SmolLM2's tokenizer). The score is an F1 of the records
given in order (`ordered_f1`), so a dropped, invented, misplaced or distractor record costs what it should.

`recite_log` is the one the embedded model can do: the context is a log of distinct events ("In 1932, Elena
Berg sold a piquant pilot in Oslo."), the answer starts with its first sentence and continues the log word for
word, and the score is ROUGE-L's F against the rest of it (LongBench's `rouge`). The log is as long as the
answer may be, so a press must keep the part of the context still to be recited while the answer grows.
"""

import random
import re

from kvbench.core.errors import BadInput, UnknownTask
from kvbench.tasks import ruler, words
from kvbench.tasks.base import Sample
from kvbench.tasks.family import Family
from kvbench.tasks.prompt import tokenize_sample

ITEMS = 24  # crates a sample lists
DISTRACTORS = 8  # barrels: records of another kind, never to be listed
MAX_NEW_TOKENS = 320
MIN_LENGTH = 1024
RECITE_MIN_LENGTH = 512
TASKS = {
    "list_crates": f"list the {ITEMS} crates and their cargo in the order of the context (a long answer)",
    "recite_log": "continue a log of events from the context word for word (an answer half the length)",
}
RECITE_QUESTION = "Repeat the text above word for word, from its first sentence to its last."
VERBS = ("kept", "sold", "painted", "found", "lost", "carried", "mended", "borrowed", "hid", "weighed")
QUESTION = (
    "List every crate and its cargo in the order they appear in the text, one per line, as "
    "'crate NUMBER: CARGO'. Do not list barrels."
)


def normalized(text: str) -> str:
    return " ".join(re.sub(r"[^0-9a-z]+", " ", text.lower()).split())


RECORD = re.compile(r"\b(crate|barrel)\s+(\d+)\b")


def ordered_f1(prediction: str, sample: Sample) -> float:
    """100 x the F1 of the answer's records in order. The answer is cut into segments (lines and
    sentences); a segment that names a crate or barrel number is a record given, and it matches the
    reference of that crate when it names its cargo too. The references matched in the context's order
    (the longest increasing run, `longest_increasing`) over the references is the recall; over the records
    given, the precision: a barrel listed, an invented or repeated record, a crate out of order each cost."""
    references = [normalized(reference).split() for reference in sample.references]  # crate N cargo...
    index = {words[1]: i for i, words in enumerate(references)}
    given, matched = 0, []
    for segment in re.split(r"[\n.;]+", prediction):
        text = normalized(segment)
        found = RECORD.search(text)
        if found is None:
            continue
        given += 1
        i = index.get(found.group(2)) if found.group(1) == "crate" else None
        if i is not None and f" {' '.join(references[i][2:])} " in f" {text} ":
            matched.append(i)
    hits = longest_increasing(matched)
    if hits == 0:
        return 0.0
    precision, recall = hits / given, hits / len(references)
    return 100.0 * 2 * precision * recall / (precision + recall)


def longest_increasing(values: list[int]) -> int:
    """Length of the longest strictly increasing subsequence (patience sorting)."""
    import bisect

    tails: list[int] = []
    for value in values:
        place = bisect.bisect_left(tails, value)
        tails[place : place + 1] = [value]
    return len(tails)


METRICS = {"ordered_f1": ordered_f1}


def min_length(task: str) -> int:
    return RECITE_MIN_LENGTH if task == "recite_log" else MIN_LENGTH


def draft(seed: str) -> tuple[list[str], list[str]]:
    """(record sentences in context order, references): `ITEMS` crates and `DISTRACTORS` barrels with
    distinct numbers and cargoes, shuffled together."""
    rng = random.Random(seed)
    numbers = rng.sample(range(100, 1000), ITEMS + DISTRACTORS)
    cargoes = rng.sample(words.word_pools()[1], ITEMS + DISTRACTORS)
    pairs = list(zip(numbers, cargoes, strict=True))
    crates = [(f"Crate {n} holds {c}.", f"crate {n}: {c}") for n, c in pairs[:ITEMS]]
    barrels = [(f"Barrel {n} holds {c}.", None) for n, c in pairs[ITEMS:]]
    records = crates + barrels
    rng.shuffle(records)
    return [sentence for sentence, _ in records], [reference for _, reference in records if reference]


def sample_at(task: str, sample_id: str, seed: str, fillers: int) -> Sample:
    """The sample with `fillers` noise sentences spread evenly around its records."""
    records, references = draft(seed)
    gaps = len(records) + 1
    sizes = [fillers * (k + 1) // gaps - fillers * k // gaps for k in range(gaps)]
    sentences = [ruler.NOISE] * sizes[0]
    for record, size in zip(records, sizes[1:], strict=True):
        sentences += [record] + [ruler.NOISE] * size
    return Sample(
        task=task,
        id=sample_id,
        context=" ".join(sentences),
        question=QUESTION,
        answer_prefix="",
        references=references,
        max_new_tokens=MAX_NEW_TOKENS,
        metric="ordered_f1",
        meta={"items": ITEMS},
    )


def log_sentences(seed: str, count: int) -> list[str]:
    """`count` events of a log, each a sentence of a person, a verb, a thing, a city and a year."""
    rng = random.Random(seed)
    return [
        f"In {rng.randint(1900, 2020)}, {words.person(rng)} {rng.choice(VERBS)} a "
        f"{words.adjective_noun(rng)} in {rng.choice(words.CITIES)}."
        for _ in range(count)
    ]


def recite_sample(task: str, sample_id: str, seed: str, sentences: int, tokenizer) -> Sample:
    """The log of `sentences` events as the context; the answer begins with its first sentence (the answer
    prefix) and the reference is the rest, given `RECITE_SLACK` tokens more than its length to end in."""
    log = log_sentences(seed, sentences)
    rest = " ".join(log[1:])
    return Sample(
        task=task,
        id=sample_id,
        context=" ".join(log),
        question=RECITE_QUESTION,
        answer_prefix=log[0],
        references=[rest],
        max_new_tokens=len(tokenizer(rest)["input_ids"]) + RECITE_SLACK,
        metric="rouge",
        meta={"sentences": sentences},
    )


RECITE_SLACK = 16


def fitted_samples(task: str, length: int, samples: int, seed: int, tokenizer, build, low: int, high: int):
    """`samples` samples `build(sample_id, seed_text, n)`, each with the largest n in [low, high] whose input
    (as the engine builds it) + its max_new_tokens fill `length` tokens at most; deterministic in (task,
    length, seed, tokenizer). BadInput when even `low` does not fit."""
    result, n = [], None
    for i in range(samples):
        seed_text, sample_id = f"{task}/{seed}/{i}", f"{seed}-{i}"

        def tokens_at(k: int, seed_text=seed_text, sample_id=sample_id) -> int:
            sample = build(sample_id, seed_text, k)
            prompt = tokenize_sample(tokenizer, sample)
            return prompt.context_ids.shape[1] + prompt.question_ids.shape[1] + sample.max_new_tokens

        if tokens_at(low) > length:
            raise BadInput(f"{task} does not fit in {length} tokens with this tokenizer: use a larger length")
        n = ruler.largest_fitting(tokens_at, length, low, high, n)
        result.append(build(sample_id, seed_text, n))
    return result


def make_samples(task: str, length: int, samples: int, seed: int, tokenizer, data_dir=None) -> list[Sample]:
    """`samples` samples of `task` filling `length` tokens at most with their answer (`fitted_samples`):
    list_crates grows its noise around the records, recite_log its log."""
    if task not in TASKS:
        raise UnknownTask(f"unknown task {task!r}: choose one of {', '.join(TASKS)}")
    if length < min_length(task):
        raise BadInput(f"{task} needs a length of at least {min_length(task)} tokens, got {length}")
    if task == "recite_log":

        def log(sample_id: str, seed_text: str, n: int) -> Sample:
            return recite_sample(task, sample_id, seed_text, n, tokenizer)

        return fitted_samples(task, length, samples, seed, tokenizer, log, 2, length)

    def records(sample_id: str, seed_text: str, n: int) -> Sample:
        return sample_at(task, sample_id, seed_text, n)

    return fitted_samples(task, length, samples, seed, tokenizer, records, 0, 10 * length)


FAMILY = Family("listing", kinds={task: "listing" for task in TASKS})
