"""The text and held-out task families, the training mixtures, the held-out rule's checks."""

import re

import pytest
from click.testing import CliRunner

from kvbench.cli import main
from kvbench.tasks import (
    METRICS,
    family_of,
    heldout,
    load_samples,
    load_suite,
    ruler,
    score_sample,
    suite_names,
    task_names,
    text,
)
from kvbench.tasks.mixture import KINDS, MIXTURES, UnknownMixture, mixture, mixture_kinds
from kvbench.tasks.prompt import tokenize_sample

# In the order they were written: each may share no kind or layout with training or an earlier one.
HELD_OUT_SUITES = [(family.FAMILY.name, family) for family in heldout.SUITES]
HELD_OUT_FAMILIES = list(heldout.SUITES)
GENERATED = {name: g for family in [text, *HELD_OUT_FAMILIES] for name, g in family.GENERATORS.items()}
TASKS = list(GENERATED)


@pytest.fixture
def tokenizer(embedded_tokenizer):
    return embedded_tokenizer


def material(sample) -> str:
    """The context as the model reads the material: the quoted layout's "> ", the numbered layout's line
    numbers and the paginated layout's page headers removed."""
    if sample.meta["layout"] == "quoted":
        return re.sub(r"(?m)^> ?", "", sample.context)
    if sample.meta["layout"] == "numbered-lines":
        return re.sub(r"(?m)^ *\d+\t", "", sample.context)
    if sample.meta["layout"] == "paginated":
        return re.sub(r"(?m)^--- Page \d+ of \d+ ---\n", "", sample.context)
    return sample.context


def answer_at(sample) -> list[re.Match]:
    """Where the context reads the answer prefix then the reference (a space between or not)."""
    pattern = re.escape(sample.answer_prefix) + " ?" + re.escape(sample.references[0])
    return list(re.finditer(pattern, material(sample)))


# ---- generation ----


@pytest.mark.parametrize("task", TASKS)
def test_generation_is_deterministic_and_differs_across_seeds_and_samples(task, tokenizer):
    first = load_samples(task, length=512, samples=2, seed=7, tokenizer=tokenizer)
    assert first == load_samples(task, length=512, samples=2, seed=7, tokenizer=tokenizer)
    assert [s.id for s in first] == ["7-0", "7-1"]
    assert first[0].context != first[1].context and first[0].references != first[1].references
    other_seed = load_samples(task, length=512, samples=1, seed=8, tokenizer=tokenizer)[0]
    assert other_seed.context != first[0].context and other_seed.references != first[0].references
    assert all(s.task == task and s.meta["length"] == 512 for s in first)


@pytest.mark.parametrize("task", TASKS)
def test_the_answer_follows_its_prefix_once_in_the_context_and_nowhere_in_the_question(task, tokenizer):
    for sample in load_samples(task, length=1024, samples=4, seed=0, tokenizer=tokenizer):
        (reference,) = sample.references
        assert len(answer_at(sample)) == 1, sample.answer_prefix
        assert material(sample).count(sample.answer_prefix) == 1
        assert reference.lower() not in (sample.question + sample.answer_prefix).lower()
        assert sample.metric == "string_match_all"
        assert score_sample(sample, f" {reference}.") == 100
        assert score_sample(sample, " I do not know.") == 0


@pytest.mark.parametrize("task", TASKS)
def test_inputs_fill_the_length_and_grow_with_it(task, tokenizer):
    sizes = {}
    for length in (512, 2048):
        samples = load_samples(task, length=length, samples=2, seed=0, tokenizer=tokenizer)
        prompts = [tokenize_sample(tokenizer, s) for s in samples]
        tokens = [
            p.context_ids.shape[1] + p.question_ids.shape[1] + s.max_new_tokens
            for p, s in zip(prompts, samples, strict=True)
        ]
        # One more unit would not fit; the largest units (a document, a release) are ~150 tokens.
        assert all(length - 200 <= n <= length for n in tokens), tokens
        sizes[length] = min(len(s.context) for s in samples)
    assert sizes[2048] > 2.5 * sizes[512]


@pytest.mark.parametrize("family", [text, *HELD_OUT_FAMILIES])
def test_each_sample_draws_its_layout_from_its_family(family, tokenizer):
    layouts = {layout.name for layout in family.LAYOUTS}
    drawn = set()
    for task in family.TASKS:
        for sample in load_samples(task, length=512, samples=4, seed=0, tokenizer=tokenizer):
            drawn.add(sample.meta["layout"])
            if sample.messages:  # a chat layout: the material is one of the turns
                assert any(sample.references[0] in m["content"] for m in sample.messages)
    assert drawn == layouts


def test_bad_lengths_and_unknown_tasks_are_rejected(tokenizer):
    with pytest.raises(ValueError, match="at least 512"):
        text.make_samples("text_csv_table", 256, 1, 0, tokenizer, None)
    with pytest.raises(ValueError, match="unknown task 'text_nope'"):
        text.make_samples("text_nope", 1024, 1, 0, tokenizer, None)


def test_the_families_are_registered_and_listed():
    listed = CliRunner().invoke(main, ["tasks"]).output
    for task in TASKS:
        assert task in listed
        assert family_of(task) in (text, *HELD_OUT_FAMILIES)
    assert METRICS["string_match_all"] is ruler.string_match_all


# ---- mixtures and the held-out rule ----


def suite_tasks() -> dict[str, list[str]]:
    return {name: load_suite(name).tasks for name in suite_names()}


def test_every_task_of_every_family_mixture_and_suite_has_a_kind():
    tasks = {part.task for parts in MIXTURES.values() for part in parts}
    tasks |= {task for tasks in suite_tasks().values() for task in tasks}
    assert tasks <= set(task_names()) == set(KINDS)


@pytest.mark.parametrize(("suite_name", "family"), HELD_OUT_SUITES)
def test_the_held_out_suites_are_calibrated_size_and_their_family_only(suite_name, family):
    suite = load_suite(suite_name)
    assert suite.length == 1024 and suite.samples >= 20 and len(suite.tasks) >= 4
    assert all(family_of(task) is family for task in suite.tasks)
    assert len({KINDS[task] for task in suite.tasks}) == len(suite.tasks)


def test_each_held_out_suite_shares_no_kind_or_layout_with_training_or_an_earlier_held_out_suite():
    seen_kinds = set().union(*(mixture_kinds(name) for name in MIXTURES))
    seen_layouts = {x.name for x in text.LAYOUTS}
    for suite, family in HELD_OUT_SUITES:
        kinds = {KINDS[task] for task in load_suite(suite).tasks}
        layouts = {x.name for x in family.LAYOUTS}
        assert kinds & seen_kinds == set() and layouts & seen_layouts == set(), suite
        seen_kinds |= kinds
        seen_layouts |= layouts


def test_mixture_parts_are_valid_tasks_at_valid_lengths():
    for name, parts in MIXTURES.items():
        assert parts, name
        assert len({(p.task, p.length) for p in parts}) == len(parts), f"{name}: a (task, length) twice"
        for part in parts:
            assert family_of(part.task).min_length(part.task) <= part.length and part.samples >= 1


def test_broad_adds_the_text_kinds_at_several_lengths_to_rulers():
    broad = mixture("broad")
    assert {p.task for p in mixture("ruler")} <= {p.task for p in broad}
    assert set(text.TASKS) <= {p.task for p in broad}
    assert {p.length for p in broad} == {512, 1024, 2048}
    assert len(mixture_kinds("broad")) > len(mixture_kinds("ruler")) + len(text.TASKS) - 1


def test_an_unknown_mixture_is_a_one_line_key_error():
    with pytest.raises(KeyError) as error:
        mixture("nope")
    assert isinstance(error.value, UnknownMixture)
    assert str(error.value) == "unknown mixture 'nope': choose one of ruler, text, broad"
    with pytest.raises(KeyError):
        mixture_kinds("nope")
