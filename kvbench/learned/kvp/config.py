"""What `kvbench kvp train` offers and checks before it trains: the architectures' names, the budget
weights, the utilities and the training config. No torch here, so that the command refuses a bad option at
once, not after torch is imported; the agents, the reward and the trainer import these names from here."""

from dataclasses import dataclass

ARCH_NAMES = ("compact", "apple")  # kvbench.learned.kvp.agent.ARCHS, by name
# Budget weights that count only the budgets keeping at most this share of the prompt (reward.py).
TOP_SHARE = {"quarter": 0.25, "tenth": 0.1}
BUDGET_WEIGHTS = ("uniform", "harmonic", *TOP_SHARE)


@dataclass
class TrainConfig:
    steps: int = 1000
    prompts: int = 2  # training prompts per step
    tokens: int = 256  # tokens drawn from each prompt per step (at most its length)
    rankings: int = 16  # K Plackett-Luce samples per prompt and head
    lr: float = 3e-3
    min_lr_fraction: float = 0.1  # cosine decays to lr * min_lr_fraction
    warmup: int = 100
    weight_decay: float = 0.01
    ema: float = 0.99
    eval_every: int = 100
    arch: str = "compact"  # a name in ARCH_NAMES
    budget_weights: str = "uniform"  # a name in BUDGET_WEIGHTS (the training reward only)
    utility: str = "future"  # a name in UTILITIES: the target of the reward and of validation
    hidden: int | None = None  # the scorer's width; None: the architecture's default (compact 64, apple 256)
    seed: int = 0


# What the ranking cost counts as a token's utility, and the stored tensors it is made of: the attention the
# question and the answer pay to it (the paper's future attention), KVZip's reconstruction score
# (question-agnostic; needs datagen's --reconstruction), or both, each scaled to sum 1 over the prompt's
# tokens, averaged.
UTILITY_TENSORS = {
    "future": ("utility",),
    "reconstruction": ("reconstruction",),
    "mixed": ("utility", "reconstruction"),
}
UTILITIES = tuple(UTILITY_TENSORS)
