"""What `kvbench distillcache train` offers and checks before it trains: the options (architectures, starts,
credit schemes, the training config) and the data stores it reads. No torch here: the command refuses a
bad option or data store at once, not after torch and transformers are imported (10-20 s); the policy and
the trainer (policy.py, train.py) import these names from here."""

from dataclasses import dataclass, field

from kvbench.learned.common import TrainingData
from kvbench.learned.common import train_command_hint as training_hint

METHOD = "distillcache"
ARCHS = ("shared", "per-head")  # one MLP for all heads, or one per (layer, KV head) (policy.py)
INITS = ("uniform", "knorm")  # every entry scored alike at step 0, or knorm's ranking (a warm start)
CREDITS = ("sequence", "per-step")  # one keep-set at prefill, or keep-sets re-decided while decoding
TENSORS = (
    "keys",
    "values",
    "features",
    "question_ids",
    "continuation_ids",
    "log_probs",
)  # what a shard gives


@dataclass
class TrainConfig:
    steps: int = 100
    samples: int = 4  # K keep-sets per ratio and step
    ratios: list[float] = field(default_factory=lambda: [0.5, 0.75, 0.9])
    ratios_per_step: int = 2
    lr: float = 1e-2
    weight_decay: float = 0.01
    entropy_bonus: float = 0.01
    ema: float = 0.9
    eval_every: int = 25
    eval_ratios: list[float] = field(default_factory=lambda: [0.5, 0.75, 0.9])
    hidden: int = 32
    arch: str = "shared"  # or "per-head" (kvbench.learned.distillcache.policy)
    init: str = "uniform"  # or "knorm": start from knorm's ranking (DistillCachePolicy.start_as_knorm)
    credit: str = "sequence"  # or "per-step": decode-time decisions, each with its reward-to-go (per_step.py)
    interval: int = 8  # per-step: decoding steps between compressions, in training and validation
    seed: int = 0


class DistillData(TrainingData):
    """DistillCache's view of one or more data stores (kvbench.learned.common.TrainingData): shared stores
    (learned.common.datagen) or ones made by DistillCache's own datagen before them (RULER prompts only)."""

    method, label = METHOD, "DistillCache"

    def load(self, shard: dict, names=TENSORS) -> dict:
        """The shard's tensors (torch's) by name."""
        return self.read_tensors(shard, names)


def train_command_hint(name: str) -> str:
    return training_hint(METHOD, name, "weights")
