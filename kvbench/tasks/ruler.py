"""RULER (NVIDIA/RULER, arXiv 2404.06654) generated offline: its 13 tasks, templates and metrics.

Each sample follows RULER's generator scripts (scripts/data/synthetic/*.py with the arguments of
scripts/synthetic.yaml): the same templates, answer prefixes, needle/key/value types, haystacks, few-shot
examples and tokens_to_generate. As in RULER, the size of the haystack is the largest that fits:
tokens(context + question + answer prefix) + max_new_tokens <= length, counted with the model's own
tokenizer (no special tokens, no chat template). We find it by search on the number of haystack units
(sentences, words or documents), per sample.

Substitutions and differences, all deliberate:
- Essay haystack: RULER uses Paul Graham's essays, which are not redistributable offline. We use real prose
  that ships with Python, the stdlib's `pydoc_data.topics` (~65k words; its text depends on the Python
  version). Sentences are split with a regex instead of nltk's punkt.
- Randomness: each sample draws from its own `random.Random` seeded by (task, seed, index), so its keys,
  values and answers do not depend on the other samples nor on the length; RULER draws from one global
  stream (and reuses its seed for some shuffles). The distributions are RULER's.
- Word lists: RULER's cwe switches to a larger English word list past the 8166 wonderwords words (beyond
  ~100k tokens); we stop at 8166 words there, so such a cwe context comes out shorter than asked.
- qa_1/qa_2: question i of the dataset (in file order) is sample i, as in RULER; the seed picks the
  distractor documents and their order.
- The query-agnostic split follows kvpress's RULER dataset: the context holds every instruction that comes
  before the haystack (and the few-shot example of vt/cwe); the question starts where RULER's question text
  starts; the answer prefix is RULER's without its leading space.
"""

import dataclasses
import functools
import itertools
import math
import random
import re
import string
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kvbench.core.errors import BadInput, DataFileError, UnknownTask
from kvbench.core.validation import STRICT, check_json
from kvbench.tasks import kvpress
from kvbench.tasks.base import Sample, TaskUnavailable
from kvbench.tasks.family import Family

TASKS = {
    "niah_single_1": "needle in a haystack: one number under one word key, in repeated noise",
    "niah_single_2": "needle in a haystack: one number under one word key, in essay prose",
    "niah_single_3": "needle in a haystack: one uuid under one word key, in essay prose",
    "niah_multikey_1": "needle in a haystack: find one of 4 keyed numbers in essay prose",
    "niah_multikey_2": "needle in a haystack: one keyed number among distractor needles (word keys)",
    "niah_multikey_3": "needle in a haystack: one keyed uuid among distractor needles (uuid keys)",
    "niah_multivalue": "needle in a haystack: all 4 numbers stored under one key, in essay prose",
    "niah_multiquery": "needle in a haystack: the numbers of 4 keys at once, in essay prose",
    "vt": "variable tracking: all variables a 4-hop chain of assignments gives a value",
    "cwe": "common words extraction: the 10 most frequent words of a numbered list",
    "fwe": "frequent words extraction: the 3 most frequent coded words (Zipf-distributed)",
    "qa_1": "question answering on SQuAD v2 dev, the answer's paragraph among distractors",
    "qa_2": "multi-hop question answering on HotpotQA dev (distractor), among distractor paragraphs",
}


@dataclass(frozen=True)
class Template:
    """RULER's template split at the question (constants.py's template + answer_prefix)."""

    context: str
    question: str
    answer_prefix: str  # as RULER writes it, leading space included


# Prompt texts exactly as in RULER scripts/data/synthetic/constants.py.
TEMPLATES = {
    "niah": Template(
        "Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. "
        "I will quiz you about the {type_needle_v} afterwards.\n{context}\n",
        "What are all the special magic {type_needle_v} for {query} mentioned in the provided text?",
        " The special magic {type_needle_v} for {query} mentioned in the provided text are",
    ),
    "vt": Template(
        "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\n",
        "Question: Find all variables that are assigned the value {query} in the text above.",
        " Answer: According to the chain(s) of variable assignment in the text above, {num_v} variables are "
        "assigned the value {query}, they are: ",
    ),
    "cwe": Template(
        "Below is a numbered list of words. In these words, some appear more often than others. "
        "Memorize the ones that appear most often.\n{context}\n",
        "Question: What are the 10 most common words in the above list?",
        " Answer: The top 10 words that appear most often in the list are:",
    ),
    "fwe": Template(
        "Read the following coded text and track the frequency of each coded word. "
        "Find the three most frequently appeared coded words. {context}\n",
        "Question: Do not provide any explanation. Please ignore the dots '....'. "
        "What are the three most frequently appeared words in the above coded text?",
        " Answer: According to the coded text above, the three most frequently appeared words are:",
    ),
    "qa": Template(
        "Answer the question based on the given documents. Only give me the answer and do not output any "
        "other words.\n\nThe following are given documents.\n\n{context}\n\n",
        "Answer the question based on the given documents. Only give me the answer and do not output any "
        "other words.\n\nQuestion: {query}",
        " Answer:",
    ),
}

TOKENS_TO_GENERATE = {"niah": 128, "vt": 30, "cwe": 120, "fwe": 50, "qa": 32}

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NEEDLE = "One of the special magic {type_needle_v} for {key} is: {value}."
DEPTHS = [round(100 * i / 39) for i in range(40)]  # np.linspace(0, 100, 40) rounded, as RULER


@dataclass(frozen=True)
class Niah:
    haystack: str  # noise | essay | needle
    key_type: str  # words | numbers | uuids
    value_type: str
    keys: int = 1
    values: int = 1
    queries: int = 1


# scripts/synthetic.yaml
NIAH = {
    "niah_single_1": Niah("noise", "words", "numbers"),
    "niah_single_2": Niah("essay", "words", "numbers"),
    "niah_single_3": Niah("essay", "words", "uuids"),
    "niah_multikey_1": Niah("essay", "words", "numbers", keys=4),
    "niah_multikey_2": Niah("needle", "words", "numbers"),
    "niah_multikey_3": Niah("needle", "uuids", "uuids"),
    "niah_multivalue": Niah("essay", "words", "numbers", values=4),
    "niah_multiquery": Niah("essay", "words", "numbers", keys=4, queries=4),
}
VT_HOPS = 4  # one chain of 4 hops: 5 variables
VT_ICL_LENGTH = 500  # RULER's few-shot vt example fills 500 tokens
CWE_COMMON = 10
FWE_ALPHA = 2.0
FWE_ZETA = math.pi**2 / 6  # zeta(FWE_ALPHA)
QA_FILES = {"qa_1": "dev-v2.0.json", "qa_2": "hotpot_dev_distractor_v1.json"}
QA_HUB = {"qa_1": ("rajpurkar/squad_v2", None), "qa_2": ("hotpotqa/hotpot_qa", "distractor")}

# Smallest lengths that fit the template, the needles or the few-shot example plus some haystack; measured
# with SmolLM2's tokenizer (niah_multikey_3 244..419 tokens at the least haystack, vt 808, cwe 828, fwe 167),
# with margin for less efficient tokenizers. qa_2 needs its 10 HotpotQA paragraphs.
MIN_LENGTH = {"niah": 512, "vt": 1024, "cwe": 1024, "fwe": 512, "qa_1": 1024, "qa_2": 2048}


def family(task: str) -> str:
    if task in NIAH:
        return "niah"
    if task not in TASKS:
        raise UnknownTask(f"unknown RULER task {task!r}: choose one of {', '.join(TASKS)}")
    return task.split("_")[0]


def min_length(task: str) -> int:
    return MIN_LENGTH[task] if task in MIN_LENGTH else MIN_LENGTH[family(task)]


# ---- Metrics (RULER scripts/eval/synthetic/constants.py and evaluate.py) ----


def postprocess(prediction: str) -> str:
    """RULER's postprocess_pred: control characters become newlines, then strip."""
    return re.sub(r"[\x00-\x1f]", "\n", prediction.strip()).strip()


def string_match_all(prediction: str, sample: Sample) -> float:
    """Percentage of the references found in the prediction (case-insensitive substring)."""
    prediction = postprocess(prediction).lower()
    return 100 * sum(ref.lower() in prediction for ref in sample.references) / len(sample.references)


def string_match_part(prediction: str, sample: Sample) -> float:
    """100 if any reference is found in the prediction (case-insensitive substring), else 0."""
    prediction = postprocess(prediction).lower()
    return 100.0 * any(ref.lower() in prediction for ref in sample.references)


METRICS = {"string_match_all": string_match_all, "string_match_part": string_match_part}


# ---- Shared pieces ----


@dataclass
class Instance:
    """RULER's full input (context + question + answer prefix) for one haystack size, and its answers."""

    context: str
    question: str
    answer_prefix: str
    references: list[str]

    @property
    def text(self) -> str:
        return self.context + self.question + self.answer_prefix


def fill(template: Template, context: str, **fields) -> Instance:
    return Instance(
        template.context.format(context=context, **fields),
        template.question.format(**fields),
        template.answer_prefix.format(**fields),
        [],
    )


def count_tokens(tokenizer, text: str) -> int:
    return len(tokenizer.encode(text, add_special_tokens=False))


def largest_fitting(
    tokens_at: Callable[[int], int], budget: int, low: int, high: int, guess: int | None
) -> int:
    """Largest n in [low, high] with tokens_at(n) <= budget, for tokens_at growing about linearly with n.

    A secant search: tokens_at is nearly affine, so from a good guess (the previous sample's answer) the line
    through two points lands on the answer, and checking its neighbour ends the search: three or four
    calls. Steps at least double while bracketing, and a bisection step follows any interpolation that did
    not halve the bracket, so a poor guess costs O(log n) calls. Raises ValueError if `low` does not fit.
    """

    def fits(n: int) -> bool:
        return tokens_at(n) <= budget

    def secant(a: int, b: int) -> float:
        """Where the line through a and b reaches the budget (b itself when the line is flat)."""
        rise = tokens_at(b) - tokens_at(a)
        return a + (budget - tokens_at(a)) * (b - a) / rise if rise > 0 else b

    if not fits(low):
        raise ValueError(f"{low} units need {tokens_at(low)} tokens, more than {budget}")
    good, step = low, 0
    bad = min(max(guess or 2 * low, low + 1), high) if low < high else high
    while fits(bad):  # bracket: extrapolate from the line through low and the last size that fits
        if bad == high:
            return high
        # At most 16x further: a nearly flat line must not make us build a huge haystack.
        good, bad = bad, min(high, 16 * bad, max(int(secant(low, bad)) + 1, bad + 2 * step, bad + 1))
        step = bad - good
    while bad - good > 1:
        width = bad - good
        middle = min(max(int(secant(good, bad)), good + 1), bad - 1)
        if fits(middle):
            good = middle
        else:
            bad = middle
        if 2 * (bad - good) > width and bad - good > 1:
            middle = (good + bad) // 2
            if fits(middle):
                good = middle
            else:
                bad = middle
    return good


@functools.cache
def essay_words() -> list[str]:
    from pydoc_data.topics import topics

    text = "\n".join(topics[name] for name in sorted(topics))
    return re.sub(r"\s+", " ", text).strip().split(" ")


def essay_sentences(num_words: int) -> list[str]:
    """The first `num_words` words of the essay (repeated if needed, as RULER), split into sentences."""
    text = " ".join(itertools.islice(itertools.cycle(essay_words()), num_words))
    return re.split(r"(?<=[.!?]) ", text)


def insert_at_depths(sentences: list[str], inserts: list[str], rng: random.Random) -> str:
    """RULER's essay insertion: each insert goes at a distinct depth (percent of the sentences)."""
    cuts = sorted(int(len(sentences) * depth / 100) for depth in rng.sample(DEPTHS, len(inserts)))
    pieces, start = [], 0
    for cut, insert in zip(cuts, inserts, strict=True):
        pieces += [*sentences[start:cut], insert]
        start = cut
    return " ".join(pieces + sentences[start:])


@functools.cache
def word_lists() -> tuple[list[str], list[str], list[str]]:
    """(adjectives, nouns, nouns + adjectives + verbs) from wonderwords, sorted and unique."""
    from wonderwords import RandomWord

    words = RandomWord()
    return (
        words.filter(include_categories=["adjective"]),
        words.filter(include_categories=["noun"]),
        words.filter(include_categories=["noun", "adjective", "verb"]),
    )


def random_value(kind: str, rng: random.Random) -> str:
    if kind == "numbers":
        return str(rng.randint(10**6, 10**7 - 1))
    if kind == "words":
        adjectives, nouns, _ = word_lists()
        return f"{rng.choice(adjectives)}-{rng.choice(nouns)}"
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


# ---- Needle in a haystack (niah.py) ----


def niah_draft(config: Niah, num_haystack: int, rng: random.Random) -> Instance:
    keys = [random_value(config.key_type, rng) for _ in range(max(config.keys, config.queries))]
    values = [[random_value(config.value_type, rng) for _ in range(config.values)] for _ in keys]
    needles = [
        NEEDLE.format(type_needle_v=config.value_type, key=key, value=value)
        for key, key_values in zip(keys, values, strict=True)
        for value in key_values
    ]
    rng.shuffle(needles)
    queried = rng.sample(range(len(keys)), config.queries)

    if config.haystack == "essay":
        context = insert_at_depths(essay_sentences(num_haystack), needles, rng)
    else:
        if config.haystack == "noise":
            sentences = [NOISE] * num_haystack
        else:
            sentences = [
                NEEDLE.format(
                    type_needle_v=config.value_type,
                    key=random_value(config.key_type, rng),
                    value=random_value(config.value_type, rng),
                )
                for _ in range(num_haystack)
            ]
        for index, needle in zip(
            sorted(rng.sample(range(num_haystack), len(needles)), reverse=True), needles, strict=True
        ):
            sentences.insert(index, needle)
        context = "\n".join(sentences)

    queries = [keys[i] for i in queried]
    query = ", ".join(queries[:-1]) + ", and " + queries[-1] if len(queries) > 1 else queries[0]
    template, type_needle_v = TEMPLATES["niah"], config.value_type
    if config.queries * config.values == 1:  # RULER's rewording to the singular
        template = Template(
            *(singular(part) for part in (template.context, template.question, template.answer_prefix))
        )
        type_needle_v = type_needle_v[:-1]
    draft = fill(template, context, type_needle_v=type_needle_v, query=query)
    draft.references = [value for i in queried for value in values[i]]
    return draft


def singular(text: str) -> str:
    return (
        text.replace("Some", "A").replace("are all", "is").replace("are", "is").replace("answers", "answer")
    )


# ---- Variable tracking (variable_tracking.py) ----


def vt_chain(rng: random.Random, name_length: int) -> tuple[list[str], list[str]]:
    """Variable names and the assignment statements of one chain, RULER's format (trailing spaces kept)."""
    names: list[str] = []
    while len(names) < VT_HOPS + 1:
        name = "".join(rng.choices(string.ascii_uppercase, k=name_length))
        if name not in names:
            names.append(name)
    chain = [f"VAR {names[0]} = {rng.randint(10000, 99998)}"]
    chain += [f"VAR {names[j + 1]} = VAR {names[j]} " for j in range(VT_HOPS)]
    return names, chain


def vt_draft(names: list[str], chain: list[str], num_noises: int, rng: random.Random, icl: str) -> Instance:
    sentences = [NOISE] * num_noises
    positions = sorted(rng.sample(range(len(sentences)), len(chain)))
    for j, (position, statement) in enumerate(zip(positions, chain, strict=True)):
        sentences.insert(position + j, statement)
    context = "\n".join(sentences).replace(". \n", ".\n")
    value = chain[0].split("=")[-1].strip()
    draft = fill(TEMPLATES["vt"], context, query=value, num_v=VT_HOPS + 1)
    draft.context = icl + draft.context
    draft.references = names
    return draft


# ---- Common words extraction (common_words_extraction.py) ----


def cwe_list(rng: random.Random, num_words: int, common_repeats: int, uncommon_repeats: int):
    """A numbered list where the first 10 of `num_words` sampled words are repeated most; (text, common)."""
    words = rng.sample(word_lists()[2], num_words)
    common, uncommon = words[:CWE_COMMON], words[CWE_COMMON:]
    listed = common * common_repeats + uncommon * uncommon_repeats
    rng.shuffle(listed)
    return " ".join(f"{i + 1}. {word}" for i, word in enumerate(listed)), common


def cwe_draft(num_words: int, length: int, rng: random.Random) -> Instance:
    # Repetitions (common, uncommon): below 4096 tokens RULER uses (3, 1) in the example and (6, 1) in
    # the task, else (10, 3) and (30, 3).
    short = length < 4096
    example, answer = cwe_list(rng, 20 if short else 40, 3 if short else 10, 1 if short else 3)
    shot = fill(TEMPLATES["cwe"], example, query="")
    shot_text = shot.text + " " + " ".join(f"{i + 1}. {word}" for i, word in enumerate(answer))
    context, common = cwe_list(rng, num_words, 6 if short else 30, 1 if short else 3)
    draft = fill(TEMPLATES["cwe"], context, query="")
    draft.context = shot_text + "\n" + draft.context
    draft.references = common
    return draft


# ---- Frequent words extraction (freq_words_extraction.py) ----


def fwe_vocabulary(rng: random.Random, size: int) -> list[str]:
    """`size` distinct random 6-letter words in random order; the first is the noise '...'."""
    vocabulary: set[str] = set()
    while len(vocabulary) < size:
        vocabulary.add("".join(rng.choices(string.ascii_lowercase, k=6)))
    words = sorted(vocabulary)
    rng.shuffle(words)
    return ["...", *words[1:]]


def fwe_draft(vocabulary: list[str], num_words: int, rng: random.Random) -> Instance:
    """Word of rank k appears int(num_words * k^-alpha / zeta(alpha)) times; ranks 2-4 are the answer."""
    coded = [
        word
        for k, word in enumerate(vocabulary, start=1)
        for _ in range(int(num_words * k**-FWE_ALPHA / FWE_ZETA))
    ]
    rng.shuffle(coded)
    draft = fill(TEMPLATES["fwe"], " ".join(coded), query="")
    draft.references = vocabulary[1:4]
    return draft


# ---- Question answering (qa.py) ----


@dataclass
class QaItem:
    query: str
    answers: list[str]
    gold: list[int]  # indices in QaData.documents
    related: list[int]  # same-article paragraphs (SQuAD), preferred as distractors


@dataclass
class QaData:
    items: list[QaItem]
    documents: list[str]


# The schemas of the official files a QA task reads from --data-dir: the fields RULER's readers use, each of
# its type; others are ignored.
@dataclass
class SquadAnswer:
    __pydantic_config__ = STRICT

    text: str


@dataclass
class SquadQuestion:
    __pydantic_config__ = STRICT

    question: str
    answers: list[SquadAnswer]
    is_impossible: bool = False  # SQuAD v1.1's files lack it: every question has an answer


@dataclass
class SquadParagraph:
    __pydantic_config__ = STRICT

    context: str
    qas: list[SquadQuestion]


@dataclass
class SquadArticle:
    __pydantic_config__ = STRICT

    paragraphs: list[SquadParagraph]


@dataclass
class SquadFile:
    """SQuAD v2's dev-v2.0.json."""

    __pydantic_config__ = STRICT

    data: list[SquadArticle]


@dataclass
class HotpotExample:
    """One example of HotpotQA's hotpot_dev_distractor_v1.json (a list of them)."""

    __pydantic_config__ = STRICT

    question: str
    answer: str
    context: list[tuple[str, list[str]]]  # (title, sentences) per paragraph


def squad_data(articles: list[dict]) -> QaData:
    """RULER's read_squad on SQuAD v2's official JSON `data` list; unanswerable questions are dropped."""
    documents = sorted({p["context"] for article in articles for p in article["paragraphs"]})
    index = {document: i for i, document in enumerate(documents)}
    items = []
    for article in articles:
        article_docs = [index[p["context"]] for p in article["paragraphs"]]
        for paragraph in article["paragraphs"]:
            gold = index[paragraph["context"]]
            for qa in paragraph["qas"]:
                if not qa["is_impossible"]:
                    answers = [a["text"] for a in qa["answers"]]
                    items.append(
                        QaItem(qa["question"], answers, [gold], [i for i in article_docs if i != gold])
                    )
    return QaData(items, documents)


def hotpot_data(examples: list[dict]) -> QaData:
    """RULER's read_hotpotqa on HotpotQA's official JSON: every paragraph of the example is gold."""

    def document(title: str, sentences: list[str]) -> str:
        return f"{title}\n{''.join(sentences)}"

    documents = sorted({document(t, s) for example in examples for t, s in example["context"]})
    index = {doc: i for i, doc in enumerate(documents)}
    items = [
        QaItem(e["question"], [e["answer"]], [index[document(t, s)] for t, s in e["context"]], [])
        for e in examples
    ]
    return QaData(items, documents)


def squad_from_hub() -> dict:
    """SQuAD v2 dev from the hub, regrouped into the official JSON's articles and paragraphs."""
    import datasets

    articles: dict[str, dict[str, list]] = {}
    for row in datasets.load_dataset(*QA_HUB["qa_1"], split="validation"):
        paragraphs = articles.setdefault(row["title"], {})
        paragraphs.setdefault(row["context"], []).append(
            {
                "question": row["question"],
                "answers": [{"text": text} for text in row["answers"]["text"]],
                "is_impossible": not row["answers"]["text"],
            }
        )
    return {
        "data": [
            {"paragraphs": [{"context": context, "qas": qas} for context, qas in paragraphs.items()]}
            for paragraphs in articles.values()
        ]
    }


def hotpot_from_hub() -> list[dict]:
    """HotpotQA dev (distractor) from the hub, in the official JSON's shape."""
    import datasets

    return [
        {
            "question": row["question"],
            "answer": row["answer"],
            "context": list(zip(row["context"]["title"], row["context"]["sentences"], strict=True)),
        }
        for row in datasets.load_dataset(*QA_HUB["qa_2"], split="validation")
    ]


def from_hub(task: str):
    return squad_from_hub() if task == "qa_1" else hotpot_from_hub()


def reads_data_dir(task: str) -> bool:
    return task in QA_FILES


def check_data(task: str, data_dir: Path | None) -> None:
    """Read a QA task's local SQuAD or HotpotQA file now, so a malformed one fails before any model loads."""
    if task in QA_FILES and data_dir is not None and (Path(data_dir) / QA_FILES[task]).is_file():
        qa_data(task, Path(data_dir))


@functools.cache
def qa_data(task: str, data_dir: Path | None) -> QaData:
    """The dataset of a QA task from `data_dir/<official file name>`, else from the hub."""
    path = data_dir / QA_FILES[task] if data_dir else None
    if path and path.is_file():
        raw = read_qa_file(task, path)
    else:
        try:
            raw = from_hub(task)
        except Exception as error:
            where = f"no {path}" if path else f"no --data-dir with {QA_FILES[task]}"
            hub = QA_HUB[task][0]
            raise TaskUnavailable(f"{task}: {where}, and the hub dataset {hub} failed ({error})") from None
    return squad_data(raw["data"]) if task == "qa_1" else hotpot_data(raw)


def read_qa_file(task: str, path: Path):
    """An official QA file, checked against its schema (`SquadFile`, `HotpotExample`): one line naming the
    file and the first bad field if it does not fit. As the readers take it: dicts, defaults filled in."""
    try:
        text = path.read_bytes()
    except OSError as error:
        raise DataFileError(f"{path}: unreadable ({error.strerror})") from None
    if task == "qa_1":
        return dataclasses.asdict(check_json(SquadFile, text, str(path), DataFileError))
    return [
        dataclasses.asdict(example)
        for example in check_json(list[HotpotExample], text, str(path), DataFileError)
    ]


def qa_draft(data: QaData, item: QaItem, num_docs: int, rng: random.Random) -> Instance:
    """The gold documents, then same-article ones, then random others: `num_docs` in all, shuffled."""
    if num_docs - len(item.gold) > len(item.related):
        taken = set(item.gold + item.related)
        others = [i for i in range(len(data.documents)) if i not in taken]
        chosen = item.gold + item.related + rng.sample(others, num_docs - len(item.gold) - len(item.related))
    else:
        chosen = item.gold + rng.sample(item.related, num_docs - len(item.gold))
    documents = [data.documents[i] for i in chosen]
    rng.shuffle(documents)
    context = "\n\n".join(f"Document {i + 1}:\n{document}" for i, document in enumerate(documents))
    draft = fill(TEMPLATES["qa"], context, query=item.query)
    draft.references = item.answers
    return draft


# ---- Samples ----


def make_samples(
    task: str, length: int, samples: int, seed: int, tokenizer, data_dir: Path | None
) -> list[Sample]:
    """`samples` RULER samples of `task` whose input fills `length` tokens of `tokenizer`."""
    kind = family(task)
    if length < min_length(task):
        raise BadInput(f"{task} needs a length of at least {min_length(task)} tokens, got {length}")
    max_new_tokens = TOKENS_TO_GENERATE[kind]
    data = qa_data(task, Path(data_dir) if data_dir else None) if kind == "qa" else None
    if data and samples > len(data.items):
        raise BadInput(f"{task} has {len(data.items)} questions, {samples} samples asked")

    result, size = [], None
    for i in range(samples):
        draft_at, low, high = drafter(
            task, length, f"{task}/{seed}/{i}", tokenizer, data.items[i] if data else None, data
        )
        # Samples differ little, so the previous sample's haystack size is a good first guess.
        size = fit(draft_at, tokenizer, length - max_new_tokens, low, high, size, task, length)
        draft = draft_at(size)
        result.append(
            Sample(
                task=task,
                id=f"{seed}-{i}",
                context=draft.context,
                question=draft.question,
                answer_prefix=draft.answer_prefix.lstrip(),
                references=draft.references,
                max_new_tokens=max_new_tokens,
                metric="string_match_part" if kind == "qa" else "string_match_all",
                meta={"length": length},
            )
        )
    return result


def drafter(task: str, length: int, sample_seed: str, tokenizer, item: QaItem | None, data: QaData | None):
    """(draft_at(haystack size) -> Instance, smallest size, largest size) for one sample."""

    def rng(part: str = "") -> random.Random:
        return random.Random(f"{sample_seed}/{part}")

    kind = family(task)
    if kind == "niah":
        config = NIAH[task]
        low = 1 if config.haystack == "essay" else max(config.keys, config.queries) * config.values
        return functools.cache(lambda n: niah_draft(config, n, rng())), low, 10**7
    if kind == "vt":
        # RULER prepends one solved example with 3-letter names, sized to fill VT_ICL_LENGTH tokens.
        example_names, example_chain = vt_chain(rng("example chain"), 3)
        example_at = functools.cache(lambda n: vt_draft(example_names, example_chain, n, rng("example"), ""))
        example = example_at(
            fit(example_at, tokenizer, VT_ICL_LENGTH, VT_HOPS + 1, 10**7, None, task, length)
        )
        icl = example.text + " " + " ".join(example.references) + "\n\n"
        names, chain = vt_chain(rng("chain"), 5)
        return functools.cache(lambda n: vt_draft(names, chain, n, rng(), icl)), VT_HOPS + 1, 10**7
    if kind == "cwe":
        return functools.cache(lambda n: cwe_draft(n, length, rng())), CWE_COMMON, len(word_lists()[2])
    if kind == "fwe":
        vocabulary = fwe_vocabulary(rng("vocabulary"), (length - TOKENS_TO_GENERATE["fwe"]) // 50)
        # 27 words: the fewest where the third answer word appears at all (int(27 / 16 / zeta(2)) = 1).
        return functools.cache(lambda n: fwe_draft(vocabulary, n, rng())), 27, 10**7
    return functools.cache(lambda n: qa_draft(data, item, n, rng())), len(item.gold), len(data.documents)


def fit(
    draft_at, tokenizer, budget: int, low: int, high: int, guess: int | None, task: str, length: int
) -> int:
    """The largest haystack size whose full input fits `budget` tokens."""
    tokens_at = functools.cache(lambda n: count_tokens(tokenizer, draft_at(n).text))
    try:
        return largest_fitting(tokens_at, budget, low, high, guess)
    except ValueError:
        raise BadInput(
            f"{task} does not fit in {length} tokens with this tokenizer: use a larger length"
        ) from None


# ---- kvpress's evaluation ----


class KvpressRuler(kvpress.Dataset):
    """`ruler` (`benchmarks/ruler/`, and `generate.sh`): metrics.json is `{task: {"string_match": score}}`
    per RULER task (`niah_single_1`, ..., `qa_2`; string_match_part for `qa_*`, string_match_all otherwise,
    mean x 100 rounded to 2); columns `question`, `answer_prefix`, `answer`, `task`, `max_new_tokens`.
    kvbench's RULER task T at length L is `ruler`, data_dir L, task T."""

    name = "ruler"
    exports = "RULER"
    columns = ("question", "answer_prefix", "answer", "task", "max_new_tokens")
    reads = ("task",)
    schema = dict[str, dict[str, float]]

    def target(self, row):
        if row["task"] not in TASKS:
            return None
        if row["length"] is None:
            raise BadInput(f"task {row['task']!r} has no context length: kvpress's ruler is named by it")
        return kvpress.Target(self.name, str(row["length"]), row["task"])

    def cells(self, row):
        return {**super().cells(row), "task": row["task"]}

    def metrics(self, rows):
        tasks = kvpress.grouped(rows, lambda row: row["task"])
        return {
            task: {"string_match": kvpress.mean2([r["score"] for r in tasks[task]])} for task in sorted(tasks)
        }

    def check_config(self, config, path):
        if not kvpress.is_whole(config.data_dir):
            raise DataFileError(
                f"{path}: field 'data_dir': ruler's is its context length (got {config.data_dir!r})"
            )

    def check_metrics(self, metrics, path):
        for task, scores in metrics.items():
            if "string_match" not in scores:
                raise DataFileError(f"{path}: field '{task}.string_match': missing")

    def task(self, config, line):
        return line["task"] if line["task"] in TASKS else None

    def sample(self, task, line, config, where):
        metric = "string_match_part" if task.startswith("qa_") else "string_match_all"
        return kvpress.scored(
            task, kvpress.references_of(line, self.answer, where), metric, {"length": self.length(config)}
        )

    def length(self, config):
        return int(str(config.data_dir))

    def sample_id(self, task, line, index, config):
        return f"{task}-{index}"

    def figures(self, metrics):
        return {task: scores["string_match"] for task, scores in metrics.items()}

    def label(self, row):
        return row["task"]


FAMILY = Family(
    "ruler",
    kinds={  # RULER's tasks share kinds by generator: a needle sentence in some haystack is one kind
        **{task: "ruler-niah" for task in NIAH},
        "vt": "ruler-variable-tracking",
        "cwe": "ruler-word-frequency",
        "fwe": "ruler-word-frequency",
        "qa_1": "ruler-document-qa",
        "qa_2": "ruler-document-qa",
    },
    kvpress=(KvpressRuler(),),
)
