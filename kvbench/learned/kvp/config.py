"""What `kvbench kvp train` offers and checks before it trains: the architectures' names, the budget
weights, the utilities and the training config. No torch here, so that the command refuses a bad option at
once, not after torch is imported; the agents, the reward and the trainer import these names from here."""

from dataclasses import dataclass

ARCH_NAMES = ("compact", "apple")  # kvbench.learned.kvp.agent.ARCHS, by name
# Budget weights that count only the budgets keeping at most this share of the prompt (reward.py).
TOP_SHARE = {"quarter": 0.25, "tenth": 0.1}
BUDGET_WEIGHTS = ("uniform", "harmonic", *TOP_SHARE)


BASELINES = ("prompt", "batch")
RECIPES = ("kvbench", "authors")


@dataclass
class TrainConfig:
    """A training run's settings. The defaults are kvbench's recipe (the shipped agents'); `AUTHORS` below
    is the authors' (apple/ml-learning-to-evict, configs/train_single_head.yaml), every setting of which is
    also an option of its own."""

    steps: int = 1000
    prompts: int = 2  # training prompts per step
    tokens: int | None = 256  # tokens drawn from each prompt per step (at most its length); None: all
    rankings: int = 16  # K Plackett-Luce samples per prompt and head
    lr: float = 3e-3
    min_lr_fraction: float = 0.1  # cosine decays to lr * min_lr_fraction
    warmup: int = 100
    weight_decay: float = 0.01
    ema: float = 0.99
    ema_burnin: int = 0  # steps during which the EMA copies the weights, before it averages them
    eval_every: int = 100
    arch: str = "compact"  # a name in ARCH_NAMES
    budget_weights: str = "uniform"  # a name in BUDGET_WEIGHTS (the training reward only)
    utility: str = "future"  # a name in UTILITIES: the target of the reward and of validation
    hidden: int | None = None  # the scorer's width; None: the architecture's default (compact 64, apple 256)
    baseline: str = "prompt"  # leave-one-out over the K rankings of a prompt, or over the step's batch
    normalise_advantages: bool = False  # z-score the advantages over what the baseline averages
    advantage_clip: float | None = None  # then clip them to +-this
    reward_floor: float | None = None  # clamp each ranking's reward (-normalised cost) from below
    loss_per_step: bool = False  # divide each ranking's log-probability by its decisions (tokens ranked)
    grad_clip: float | None = None  # clip each head's gradient norm to this
    standardise: bool = True  # keys and values standardised with each head's training statistics
    position_rows: int | None = None  # apple: its position table's rows; None: the longest training prompt
    recipe: str = "kvbench"  # the recipe the settings started from (RECIPES)
    seed: int = 0

    def problem(self) -> str | None:
        """Why these settings cannot train (a one-line message), or None."""
        if self.baseline not in BASELINES:
            return f"unknown baseline {self.baseline!r} (choose one of: {', '.join(BASELINES)})"
        if self.baseline == "prompt" and self.rankings < 2:
            return "--rankings 1 leaves no other ranking of the prompt for the baseline: use --baseline batch"
        if self.baseline == "batch" and self.prompts * self.rankings < 2:
            return "--baseline batch needs two rankings a step or more: raise --prompts"
        if self.position_rows is not None and self.arch != "apple":
            return "--position-rows sizes the apple agent's position table: it needs --arch apple"
        return None


# The authors' recipe (apple/ml-learning-to-evict): configs/train_single_head.yaml (AdamW lr 5e-5, weight
# decay 1e-3, 100 warm-up steps, cosine to 1e-6, max_grad_norm 5, EMA 0.99 after ema_burnin_steps 100,
# 4000 steps, eval every 200, batch 128, max_seq_length 6000); rl/trainers/compute_advantages.py and
# rloo_gumbel_terminal_trainer.py (one Gumbel ranking per prompt, leave-one-out baseline over the batch,
# advantages z-scored, clipped to +-2 and rewards clamped at -200 in rloo_terminal_trainer.py, its loss a
# mean over decision steps); rl/agents/kv_sorting_agent.py (raw keys and values).
AUTHORS = TrainConfig(
    steps=4000,
    prompts=128,
    tokens=None,
    rankings=1,
    lr=5e-5,
    min_lr_fraction=1e-6 / 5e-5,
    warmup=100,
    weight_decay=1e-3,
    ema=0.99,
    ema_burnin=100,
    eval_every=200,
    arch="apple",
    baseline="batch",
    normalise_advantages=True,
    advantage_clip=2.0,
    reward_floor=-200.0,
    loss_per_step=True,
    grad_clip=5.0,
    standardise=False,
    position_rows=6000,
    recipe="authors",
)
RECIPE_CONFIGS = {"kvbench": TrainConfig(), "authors": AUTHORS}


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
