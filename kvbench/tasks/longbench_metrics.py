"""LongBench v1 per-answer metrics, each in [0, 1], matching THUDM/LongBench `metrics.py` score for score.

Reimplemented (not imported) so kvbench needs neither jieba nor the LongBench repo; the Chinese variants
are left out because kvbench runs the 16 English datasets only.
"""

import difflib
import re
import string
from collections import Counter

from rouge import Rouge

ARTICLES = re.compile(r"\b(a|an|the)\b")
PUNCTUATION = frozenset(string.punctuation)
NUMBER = re.compile(r"\d+")
PARAGRAPH = re.compile(r"Paragraph (\d+)")
ROUGE_L = Rouge(
    metrics=["rouge-l"]
)  # rouge-l alone: same F as the official all-metrics call, a third of the work


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lowercase, drop punctuation, then articles, then collapse whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in PUNCTUATION)
    return " ".join(ARTICLES.sub(" ", text).split())


def token_f1(prediction_tokens: list[str], reference_tokens: list[str]) -> float:
    common = sum((Counter(prediction_tokens) & Counter(reference_tokens)).values())
    if common == 0:
        return 0.0
    precision = common / len(prediction_tokens)
    recall = common / len(reference_tokens)
    return 2 * precision * recall / (precision + recall)


def qa_f1_score(prediction: str, reference: str) -> float:
    return token_f1(normalize_answer(prediction).split(), normalize_answer(reference).split())


def rouge_score(prediction: str, reference: str) -> float:
    """ROUGE-L F of the `rouge` package; 0 where it raises (empty text, or a sentence so long that its
    recursive LCS overflows), as the official bare `except` does."""
    try:
        return ROUGE_L.get_scores([prediction], [reference], avg=True)["rouge-l"]["f"]
    except (ValueError, RecursionError):
        return 0.0


def classification_score(prediction: str, reference: str, all_classes: list[str]) -> float:
    """1/k when the reference is among the k class names found in the prediction, else 0.

    Class names that are strict substrings of the reference are not counted. The official loop removes
    them from the list it is iterating over, so the entry right after a removed one is never checked;
    we replay that so scores match the published ones.
    """
    found = [name for name in all_classes if name in prediction]
    kept, skip_next = [], False
    for name in found:
        if not skip_next and name in reference and name != reference:
            skip_next = True
            continue
        kept.append(name)
        skip_next = False
    return 1.0 / len(kept) if reference in kept else 0.0


def share_of_numbers_equal_to(prediction: str, target: str) -> float:
    """Fraction of the integers written in the prediction that equal `target`; 0 when there are none."""
    numbers = NUMBER.findall(prediction)
    if not numbers:
        return 0.0
    return sum(number == target for number in numbers) / len(numbers)


def retrieval_score(prediction: str, reference: str) -> float:
    """Reference "Paragraph 12": the share of numbers in the prediction that are 12."""
    return share_of_numbers_equal_to(prediction, PARAGRAPH.findall(reference)[0])


def count_score(prediction: str, reference: str) -> float:
    return share_of_numbers_equal_to(prediction, str(reference))


def fuzz_ratio(a: str, b: str) -> int:
    """fuzzywuzzy's `fuzz.ratio` as LongBench's official scores ran it: its pure-Python path (LongBench
    does not install python-Levenshtein), i.e. difflib's SequenceMatcher ratio (Ratcliff-Obershelp
    matching, autojunk on) on 0-100, rounded half to even by Python's round; equal strings score 100 (two
    empty ones too), an empty one against another 0.

    fuzzywuzzy itself is GPL and unmaintained, and rapidfuzz's `fuzz.ratio` is not a drop-in: it measures
    the Indel (longest common subsequence) similarity, which differs from SequenceMatcher's matching blocks
    on most code lines and is not rounded; the stdlib's difflib is what fuzzywuzzy called.
    """
    if a == b:
        return 100
    if not a or not b:
        return 0
    return round(100 * difflib.SequenceMatcher(None, a, b).ratio())


def code_sim_score(prediction: str, reference: str) -> float:
    """fuzz.ratio between the reference line and the first predicted line that is code, i.e. has no
    backtick (markdown fence) and no `#` or `//` (comment); an empty line if there is none."""
    lines = prediction.lstrip("\n").split("\n")
    code_line = next((line for line in lines if "`" not in line and "#" not in line and "//" not in line), "")
    return fuzz_ratio(code_line, reference) / 100
