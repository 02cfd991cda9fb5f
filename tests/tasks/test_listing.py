"""The long-answer task (kvbench.tasks.listing): samples that fit their length with their records in
order, and ordered_f1 against an independent reference on random and adversarial answers."""

import random
import re

import pytest

from kvbench.tasks import listing
from kvbench.tasks.base import Sample


def test_samples_fit_their_length_and_hold_their_records_in_order(embedded_tokenizer):
    from kvbench.tasks.prompt import tokenize_sample

    samples = listing.make_samples("list_crates", 1024, 3, 0, embedded_tokenizer)
    assert samples == listing.make_samples("list_crates", 1024, 3, 0, embedded_tokenizer)  # deterministic
    for sample in samples:
        prompt = tokenize_sample(embedded_tokenizer, sample)
        assert prompt.context_ids.shape[1] + prompt.question_ids.shape[1] + sample.max_new_tokens <= 1024
        assert (
            len(sample.references) == listing.ITEMS and sample.context.count("Barrel ") == listing.DISTRACTORS
        )
        places = [
            sample.context.index(f"Crate {ref.split()[1][:-1]} holds {ref.split(': ')[1]}.")
            for ref in sample.references
        ]
        assert places == sorted(places)
    answer = sum(len(embedded_tokenizer(ref).input_ids) + 1 for ref in samples[0].references)
    assert answer >= 200  # the long answer the decode-heavy protocol needs, in tokens


def reference_f1(prediction: str, references: list[str]) -> float:
    """The metric written again from its definition: segments naming `crate N` or `barrel N` are records
    given; a crate segment holding its cargo matches; the longest increasing run of matches by O(n^2)
    dynamic programming."""
    refs = [(ref.split()[1].rstrip(":"), ref.split(": ")[1].lower()) for ref in references]
    given, matched = 0, []
    for segment in re.split(r"[\n.;]+", prediction):
        words = re.sub(r"[^0-9a-z]+", " ", segment.lower()).split()
        kinds = [
            k for k in range(len(words) - 1) if words[k] in ("crate", "barrel") and words[k + 1].isdigit()
        ]
        if not kinds:
            continue
        given += 1
        kind, number = words[kinds[0]], words[kinds[0] + 1]
        for i, (ref_number, cargo) in enumerate(refs):
            if kind == "crate" and number == ref_number and f" {cargo} " in f" {' '.join(words)} ":
                matched.append(i)
                break
    best = [1] * len(matched)
    for b in range(len(matched)):
        for a in range(b):
            if matched[a] < matched[b]:
                best[b] = max(best[b], best[a] + 1)
    hits = max(best, default=0)
    if hits == 0:
        return 0.0
    precision, recall = hits / given, hits / len(refs)
    return 100 * 2 * precision * recall / (precision + recall)


def random_answer(rng: random.Random, sample: Sample) -> str:
    crates = [f"crate {ref.split()[1][:-1]}: {ref.split(': ')[1]}" for ref in sample.references]
    barrels = re.findall(r"Barrel \d+ holds \w+", sample.context)
    pool = crates + barrels + ["The grass is green", "crate 99: nothing", "Crate", "crate 1234 holds x"]
    picked = rng.sample(pool, rng.randint(0, len(pool)))
    if rng.random() < 0.5:
        picked.sort(key=lambda line: crates.index(line) if line in crates else rng.randint(0, 40))
    variants = [str.upper, str.title, lambda s: s.replace(": ", " holds "), lambda s: s + "!", str]
    return rng.choice(["\n", ". ", "; ", " "]).join(rng.choice(variants)(line) for line in picked)


def test_ordered_f1_equals_an_independent_reference(embedded_tokenizer):
    sample = listing.make_samples("list_crates", 1024, 1, 0, embedded_tokenizer)[0]
    rng = random.Random(0)
    for _ in range(5000):
        answer = random_answer(rng, sample)
        assert listing.ordered_f1(answer, sample) == pytest.approx(reference_f1(answer, sample.references)), (
            answer
        )


def test_ordered_f1_rewards_the_list_and_charges_what_is_wrong(embedded_tokenizer):
    sample = listing.make_samples("list_crates", 1024, 1, 0, embedded_tokenizer)[0]
    exact = "\n".join(sample.references)
    assert listing.ordered_f1(exact, sample) == 100.0
    assert listing.ordered_f1("", sample) == 0.0
    assert listing.ordered_f1(sample.context, sample) < 100.0  # copying the context lists the barrels too
    reversed_list = "\n".join(reversed(sample.references))
    assert listing.ordered_f1(reversed_list, sample) == pytest.approx(100 / listing.ITEMS)  # one in order


def test_recite_samples_fit_their_length_and_continue_their_log(embedded_tokenizer):
    from kvbench.tasks.prompt import tokenize_sample

    samples = listing.make_samples("recite_log", 640, 3, 0, embedded_tokenizer)
    assert samples == listing.make_samples("recite_log", 640, 3, 0, embedded_tokenizer)
    for sample in samples:
        prompt = tokenize_sample(embedded_tokenizer, sample)
        assert prompt.context_ids.shape[1] + prompt.question_ids.shape[1] + sample.max_new_tokens <= 640
        assert sample.context == f"{sample.answer_prefix} {sample.references[0]}"
        assert len(set(sample.context.split(". "))) == sample.meta["sentences"]  # distinct events
        answer = len(embedded_tokenizer(sample.references[0]).input_ids)
        assert answer >= 200 and sample.max_new_tokens == answer + listing.RECITE_SLACK
    longer = listing.make_samples("recite_log", 1024, 1, 0, embedded_tokenizer)[0]
    assert longer.meta["sentences"] > samples[0].meta["sentences"]


def test_recite_refuses_a_length_too_short(embedded_tokenizer):
    from kvbench.core.errors import BadInput

    with pytest.raises(BadInput, match="at least 512"):
        listing.make_samples("recite_log", 511, 1, 0, embedded_tokenizer)
