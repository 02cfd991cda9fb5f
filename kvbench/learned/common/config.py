"""The settings of a datagen run, checked without torch: the command line refuses bad ones before its heavy
imports (kvbench.learned.common.datagen, which makes the data, imports torch)."""

from dataclasses import dataclass

from kvbench.core.errors import BadInput
from kvbench.tasks.mixture import Part

# kvbench: the context's tokens are ranked, the question's and at most `gen_tokens` answer tokens' queries
# (capped by the task's answer length) are their future, the mean over them; a store both learned presses
# train from. authors: the whole prompt (context, question, chat template, answer prefix) is ranked, the
# greedy generation's queries alone (up to `gen_tokens`, to the tokenizer's stop token) are its future, the
# sum over them (apple/ml-learning-to-evict: entrypoints/datagen/unroll_and_store.py,
# configs/preprocess_ruler.yaml, rl/rewards/oracle.py); a KVP-only store.
TARGETS = ("kvbench", "authors")
DEFAULT_GEN_TOKENS = {"kvbench": 32, "authors": 300}


@dataclass
class DatagenConfig:
    """One datagen run's settings; BadInput when its parts repeat a (task, length) or make no validation
    prompt, which training needs."""

    parts: list[Part]  # (task, length, samples) in the order they were given
    seed: int = 10_000  # evaluation uses seeds 0..999
    gen_tokens: int = 32  # cap on the greedy continuation (also capped by the task's own max_new_tokens)
    val_fraction: float = 0.1  # the first round(fraction * samples) samples of each part validate
    reconstruction: bool = False  # also store KVZip's reconstruction attention (one more pass a prompt)
    target: str = "kvbench"  # a name in TARGETS: what is ranked and what counts as its future

    def __post_init__(self):
        self.parts = [Part(**part) if isinstance(part, dict) else part for part in self.parts]
        if self.target not in TARGETS:
            raise BadInput(f"unknown target {self.target!r} (choose one of: {', '.join(TARGETS)})")
        if self.target == "authors" and self.reconstruction:
            raise BadInput(
                "--reconstruction scores the context of --target kvbench; --target authors has none"
            )
        pairs = [(part.task, part.length) for part in self.parts]
        duplicate = next((pair for pair in pairs if pairs.count(pair) > 1), None)
        if duplicate:
            raise BadInput(f"the mixture holds task {duplicate[0]!r} at length {duplicate[1]} twice")
        if not any(self.validation_count(part.samples) for part in self.parts):
            fewest = next(n for n in range(1, 10**6) if self.validation_count(n))
            raise BadInput(
                f"--val-fraction {self.val_fraction:g} of {max(part.samples for part in self.parts)} samples "
                f"makes no validation prompt, which training needs: give --samples {fewest} or more, or a "
                "larger --val-fraction"
            )

    def validation_count(self, samples: int) -> int:
        """How many of a part's `samples` validate: the first round(val_fraction x samples)."""
        return round(self.val_fraction * samples)

    def part_seeds(self) -> list[int]:
        """Each part's sample seed: `seed` for a task's first part, seed + k for its k-th after that."""
        tasks = [part.task for part in self.parts]
        return [self.seed + tasks[:index].count(part.task) for index, part in enumerate(self.parts)]
