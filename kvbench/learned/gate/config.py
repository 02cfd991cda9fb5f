"""The training config of `kvbench gate train`, without torch: the command checks its options at once, not
after torch is imported; the trainer imports it from here."""

from dataclasses import dataclass


@dataclass
class TrainConfig:
    keep: float = 0.5  # target keep fraction (mean gate)
    sparsity: float = 10.0
    steps: int = 200
    texts: int = 32
    val_texts: int = 4
    length: int = 512
    source: str = "code"
    lr: float = 0.02
    eval_every: int = 25
    seed: int = 0
    binarise: float = 0.0  # weight of the softness term (see the module docstring)
