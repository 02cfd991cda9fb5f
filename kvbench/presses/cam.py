"""CaM (kvpress's CAMPress) at a compression ratio, as the registry gives every press one."""

from dataclasses import dataclass, field

from kvpress import CAMPress


@dataclass
class CAMRatioPress(CAMPress):
    """kvpress's CAMPress, its target size following the tokens seen: every `compression_interval` decoding
    steps the cache is merged and pruned back to int(seen x (1 - target_compression_ratio)) entries, where
    `seen` counts the context, the question and the tokens decoded so far (from the logical position ids).
    This is what kvpress's CompressionRatioDecodingPress does for DecodingPress (the registry's `decoding`),
    where CAMPress takes one absolute `target_size` for every sample. Everything else is CAMPress's own:
    the base press's scores, the merge windows of `merge_budget` kept neighbours, the Bernoulli merge mask
    (drawn from the generator the engine seeds per sample and config)."""

    target_compression_ratio: float = 0.5
    target_size: int = field(default=1, init=False)

    def __post_init__(self):
        super().__post_init__()
        if not 0 <= self.target_compression_ratio < 1:
            raise ValueError(f"cam: the ratio must be in [0, 1), got {self.target_compression_ratio}")

    def forward_hook(self, module, input, kwargs, output):
        seen = int(kwargs["position_ids"].max()) + 1
        self.target_size = max(1, int(seen * (1 - self.target_compression_ratio)))
        return super().forward_hook(module, input, kwargs, output)
