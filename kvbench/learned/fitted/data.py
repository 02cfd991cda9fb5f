"""The text a fitted press is fitted on: the contexts of a training mixture's prompts, drawn as datagen
draws them (the k-th part of a task at seed + k), so the held-out rule and the seed rule of the learned
presses hold (docs/learned-presses.md)."""

from kvbench.learned.common.datagen import check_seed_changes_samples
from kvbench.tasks import load_samples
from kvbench.tasks.mixture import mixture
from kvbench.tasks.prompt import tokenize_sample


def mixture_contexts(tokenizer, name: str, samples: int, seed: int, length: int | None = None) -> list:
    """The (1, P) context ids of `samples` prompts of every part of mixture `name` (at `length` if given;
    parts that then repeat a task draw the same prompts once), part by part."""
    contexts, seen, drawn = [], set(), {}
    for part in mixture(name):
        at = length or part.length
        if (part.task, at) in seen:
            continue
        seen.add((part.task, at))
        part_seed = seed + drawn.get(part.task, 0)
        drawn[part.task] = drawn.get(part.task, 0) + 1
        check_seed_changes_samples(part.task, at, part_seed, tokenizer)
        for sample in load_samples(
            part.task, length=at, samples=samples, seed=part_seed, tokenizer=tokenizer
        ):
            contexts.append(tokenize_sample(tokenizer, sample).context_ids)
    return contexts
