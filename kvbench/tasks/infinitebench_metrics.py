"""InfiniteBench's per-task scorers, as OpenBMB/InfiniteBench `src/compute_scores.py` defines them: each
takes the prediction and the label that `src/eval_utils.py`'s `get_answer` gives (the row's `answer`, or
[option text, letter] for the two multiple-choice tasks) and returns a score in [0, 1].

Summaries are scored with ROUGE-Lsum's F-measure as HF `evaluate`'s "rouge" computes it (Google's
`rouge_score`, no stemmer; several references: the best), the library compute_scores.py loads."""

import re
import string
from collections import Counter

# compute_scores.py normalize_zh_answer, verbatim.
CN_PUNCTUATION = (
    "！？｡。＂＃＄％＆＇（）＊＋，－／：；＜＝＞＠［＼］＾＿｀｛"
    "｜｝～｟｠｢｣､、〃》「」『』【】〔〕〖〗〘〙〚〛〜〝〞〟〰"
    "〾〿–—‘’‛“”„‟…‧﹏."
)


def normalize_answer(text: str) -> str:
    """Lower case, punctuation and the articles a/an/the removed, whitespace collapsed."""
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def normalize_zh_answer(text: str) -> str:
    """Lower case, ASCII and Chinese punctuation removed, all whitespace removed."""
    punctuation = set(string.punctuation + CN_PUNCTUATION)
    return "".join("".join(ch for ch in text.lower() if ch not in punctuation).split())


def f1_score(prediction: list, ground_truth: list) -> float:
    common = Counter(prediction) & Counter(ground_truth)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(prediction), same / len(ground_truth)
    return 2 * precision * recall / (precision + recall)


def qa_f1(prediction: str, labels: list[str]) -> float:
    """Best token F1 over the labels, after `normalize_answer`."""
    tokens = normalize_answer(prediction).split()
    return max((f1_score(tokens, normalize_answer(label).split()) for label in labels), default=0.0)


def qa_f1_zh(prediction: str, labels: list[str]) -> float:
    """Best character F1 over the labels, after `normalize_zh_answer` (one character, one token)."""
    chars = list(normalize_zh_answer(prediction))
    return max((f1_score(chars, list(normalize_zh_answer(label))) for label in labels), default=0.0)


def first_int(prediction: str) -> str:
    """The first run of ASCII digits, or ''."""
    return next((item for item in re.split("[^0-9]", prediction) if item), "")


def first_label(label):
    return label[0] if isinstance(label, list) else label


def words_without(prediction: str, characters: str) -> list[str]:
    for character in characters:
        prediction = prediction.replace(character, " ")
    return prediction.split()


def kv_retrieval(prediction: str, label) -> float:
    return float(first_label(label) in words_without(prediction, "\n:\"'.,?!{}"))


def passkey(prediction: str, label) -> float:
    """Also number_string's: the label equals the first integer of the prediction."""
    return float(first_label(label) == first_int(prediction))


def code_run(prediction: str, label) -> float:
    words = words_without(prediction.strip(), "\n.`'\":")
    if not words:
        return 0.0
    try:
        return float(first_label(label) == int(words[-1]))
    except ValueError:
        return 0.0


CODE_DEBUG_PREFIXES = ("answer is:", "is:", "answer:", "correct option is:")


def code_debug(prediction: str, label: list) -> float:
    """label = [function name, letter]."""
    prediction = prediction.strip()
    function, letter = label[0], label[1]
    if prediction[:2] in (f"{letter}.", f"{letter}:"):
        return 1.0
    for junk in ("\n", "`", "'", '"', "-", "*", "Option", "option"):
        prediction = prediction.replace(junk, " ")
    while "  " in prediction:
        prediction = prediction.replace("  ", " ")
    for prefix in CODE_DEBUG_PREFIXES:
        index = prediction.find(prefix)
        if index == -1:
            continue
        if len(prediction) < index + len(prefix) + 1:
            return 0.0
        rest = prediction[index + len(prefix) + 1 :]
        return float(rest.startswith(letter) or rest.startswith(function))
    return 0.0


def math_find(prediction: str, label) -> float:
    """The first number of the prediction equals the label (an int, or a float)."""
    label = first_label(label)
    if isinstance(label, bool) or not isinstance(label, (int, float)):
        raise TypeError(f"Expected int or float, got {type(label)}")
    found = re.search(r"\d+\.\d+|\d+", prediction)
    if found is None:
        return 0.0
    number = found.group(0).strip()
    if isinstance(label, int):
        return float("." not in number and int(number) == label)  # compute_scores raises there: 0 here
    return float(float(number) == label)


def longdialogue_qa_eng(prediction: str, label: list) -> float:
    words = [word.upper() for word in words_without(prediction.strip(), "\n:\"'.,?!{}")]
    return float(label[0] in words)


CHOICE_PREFIXES = ("answer is:", "answer:", "answer is", "option is")


def longbook_choice_eng(prediction: str, label: list) -> float:
    """label = [option text, letter]."""
    prediction = prediction.strip()
    if prediction == "":
        return 0.0
    if prediction[0] in "ABCD":
        return float(prediction[0] in label)
    if prediction in label:
        return 1.0
    for junk in ("\n", '"', "'", ".", ",", "?", "!", "{", "}"):
        prediction = prediction.replace(junk, " ")
    while "  " in prediction:
        prediction = prediction.replace("  ", " ")
    for prefix in CHOICE_PREFIXES:
        index = prediction.find(prefix)
        if index == -1:
            continue
        if len(prediction) < index + len(prefix) + 1:
            return 0.0
        after = prediction[index + len(prefix) + 1 :]
        return float(any(after.startswith(option) for option in label))
    for word in prediction.split():
        if word in "ABCD":
            return float(word in label)
    return 0.0


def math_calc(prediction: str, label: list) -> float:
    """The share of the label's values that the prediction's integers (signs dropped) give in order, up to
    the first wrong one."""
    if label and isinstance(label[0], list):
        label = label[0]
    numbers = [int(item) for item in re.split("[^0-9]", prediction) if item]
    count = 0
    for expected, got in zip(label, numbers, strict=False):
        if expected != got:
            break
        count += 1
    return count / len(label)


def longbook_sum_eng(prediction: str, label) -> float:
    """ROUGE-Lsum F-measure (rouge_score, no stemmer), best over the references."""
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rougeLsum"], use_stemmer=False)
    references = label if isinstance(label, list) else [label]
    return max(scorer.score(reference, prediction)["rougeLsum"].fmeasure for reference in references)


SCORERS = {
    "passkey": passkey,
    "number_string": passkey,
    "kv_retrieval": kv_retrieval,
    "longbook_sum_eng": longbook_sum_eng,
    "longbook_choice_eng": longbook_choice_eng,
    "longbook_qa_eng": qa_f1,
    "longbook_qa_chn": qa_f1_zh,
    "longdialogue_qa_eng": longdialogue_qa_eng,
    "math_find": math_find,
    "math_calc": math_calc,
    "code_run": code_run,
    "code_debug": code_debug,
}
