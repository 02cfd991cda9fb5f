"""ZeroSCROLLS' official metrics, per answer, as the hub's `tau/zero_scrolls` `metrics/` files define them
(the SCROLLS metric and its `_compute_helper`, plus `exp_similarity`, `concordance_index` and `accuracy`).
Each takes the prediction and the references (several rows of the dataset may share an id: their outputs
are the references, as `drop_duplicates_in_input` gathers them) and returns a score in [0, 100], the best
over the references.

- `rouge`: ROUGE-1, ROUGE-2 and ROUGE-L F-measures x 100 of Google's `rouge_score` without a stemmer, each
  the best over the references, then their geometric mean. The official score is the geometric mean of the
  three means over the task's answers; kvbench averages per-answer scores, so its task mean is the mean of
  per-answer geometric means (never above the official figure for the same answers). The official
  pre-processing (one sentence a line, nltk's `sent_tokenize`) only moves whitespace, which none of these
  three ROUGE types reads: it is left out, and with it the punkt data nltk would fetch.
- `f1`: SQuAD's token F1 after lower-casing, removing punctuation and the articles a/an/the, collapsing
  spaces and transliterating to ASCII (`unidecode`, applied last as the official `normalize_answer` does).
- `accuracy`: the first standalone capital A-D (regex `\\b[A-D]\\b`) of the prediction equals that of the
  reference.
- `exp_similarity`: with p and g the first percentages (`\\d+\\.?\\d*%`) of prediction and reference (g = 0
  when the reference has none), 0.5 ** (|p - g| / 10); 0 when the prediction has none.
- `concordance_index`: the integers of each text (every character but ASCII digits, whitespace and commas
  dropped, then split on commas and whitespace); 0 unless the prediction holds the reference's IDs, else the
  concordance index (lifelines' `concordance_index`, no censoring) of the two orders: the share of pairs of
  IDs both lists put in the same order. The reference is a permutation of 1..n, n >= 2 (checked when rows
  are read), so no pair ties and lifelines reduces to that share; it is not a dependency.
"""

import re
import string
from collections import Counter

ARTICLES = re.compile(r"\b(a|an|the)\b")
PUNCTUATION = frozenset(string.punctuation)
LETTER = re.compile(r"\b[A-D]\b")
PERCENTAGE = re.compile(r"\d+\.?\d*%")
NOT_ID = re.compile(r"[^0-9\s,]")
ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")


def normalize_answer(text: str) -> str:
    from unidecode import unidecode

    text = "".join(ch for ch in text.lower() if ch not in PUNCTUATION)
    return unidecode(" ".join(ARTICLES.sub(" ", text).split()))


def token_f1(prediction: str, reference: str) -> float:
    prediction_tokens = normalize_answer(prediction).split()
    reference_tokens = normalize_answer(reference).split()
    same = sum((Counter(prediction_tokens) & Counter(reference_tokens)).values())
    if same == 0:
        return 0.0
    precision = 1.0 * same / len(prediction_tokens)
    recall = 1.0 * same / len(reference_tokens)
    return (2 * precision * recall) / (precision + recall)


def f1(prediction: str, references: list[str]) -> float:
    return 100.0 * max(token_f1(prediction, reference) for reference in references)


_SCORER = []


def rouge_scorer():
    if not _SCORER:
        from rouge_score import rouge_scorer as module

        _SCORER.append(module.RougeScorer(list(ROUGE_TYPES), use_stemmer=False))
    return _SCORER[0]


def rouge(prediction: str, references: list[str]) -> float:
    scores = [rouge_scorer().score(reference, prediction) for reference in references]
    best = {key: max(score[key].fmeasure * 100 for score in scores) for key in ROUGE_TYPES}
    return (best["rouge1"] * best["rouge2"] * best["rougeL"]) ** (1.0 / 3.0)


def find_letter(text: str) -> str | None:
    match = LETTER.search(text)
    return None if match is None else match.group()


def accuracy(prediction: str, references: list[str]) -> float:
    return 100.0 * max(find_letter(prediction) == find_letter(reference) for reference in references)


def find_percentage(text: str) -> float | None:
    match = PERCENTAGE.search(text)
    return None if match is None else float(match.group(0).replace("%", ""))


def exp_similarity_score(prediction: str, reference: str) -> float:
    expected = find_percentage(reference)
    expected = 0 if expected is None else expected
    predicted = find_percentage(prediction)
    if predicted is None:
        return 0.0
    return 0.5 ** (abs(expected - predicted) / 10)


def exp_similarity(prediction: str, references: list[str]) -> float:
    return 100 * max(exp_similarity_score(prediction, reference) for reference in references)


def summary_ids(text: str) -> list[int]:
    """The integers of `text` as the official `normalize_answer_ci` reads them."""
    return [int(item) for item in NOT_ID.sub("", text).replace(",", " ").split()]


def positions(ids: list[int]) -> list[int]:
    """Position (from 1) of each ID 1..n in `ids`, a permutation of 1..n."""
    order = [-1] * len(ids)
    for position, summary in enumerate(ids, 1):
        order[summary - 1] = position
    return order


def concordance_index_score(prediction: str, reference: str) -> float:
    predicted, expected = summary_ids(prediction), summary_ids(reference)
    if sorted(expected) != sorted(predicted):
        return 0.0
    gold, guess = positions(expected), positions(predicted)
    pairs = [(a, b) for a in range(len(gold)) for b in range(a + 1, len(gold))]
    concordant = sum((gold[a] < gold[b]) == (guess[a] < guess[b]) for a, b in pairs)
    return concordant / len(pairs)


def concordance_index(prediction: str, references: list[str]) -> float:
    return 100.0 * max(concordance_index_score(prediction, reference) for reference in references)


SCORERS = {
    "rouge": rouge,
    "f1": f1,
    "accuracy": accuracy,
    "exp_similarity": exp_similarity,
    "concordance_index": concordance_index,
}
