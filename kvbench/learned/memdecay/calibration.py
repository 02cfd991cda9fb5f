"""Calibrate MemDecay from measured attention lifetimes: how long each region's tokens keep being attended.

The model (eager attention) reads chat-structured samples as the benchmark feeds them: the context's turns,
then the question in a last user turn. At every layer and KV head (attention averaged over its query heads),
each token j is seen by the later queries i; its age is i - j (tokens processed since it), and it counts as
attended when it gets more than `threshold` times its uniform share, 1 / (i + 1). Per region and age we count
the (query, token) pairs and the attended ones; their ratio, the fraction of the region's tokens still
attended at that age, is what decays.

- Half-life: a weighted least-squares fit of log2(fraction) = c - age / h over the ages with at least
  `MIN_PAIRS` pairs, from age 1 to the first age where the fraction is down to a quarter of age 1's, weighted
  by the attended count (about the inverse variance of a log-frequency). Measured curves drop fast (local
  attention) to a long, low plateau of occasional re-reads; the press models the plateau by refreshing a
  token's age whenever it is attended again, and decays it in between: the half-life it needs is the early
  drop's, so the fit stops at two half-lives. A fit is steadier than reading off the single age where the
  fraction halves. Half-lives are clipped to [1, 10 x the longest age measured]: a flat curve says "longer
  than we could see", not infinity. Ages count from the token's own processing (its creation).
- Attention sinks: the first `SINKS` tokens are attended at every age whatever their region; counted, they
  would give the system region (which comes first) the sink's lifetime. They are left out; the press keeps
  them by their accumulated attention.
- Base priority: the region's attended fraction over all its pairs (how often it is attended at all),
  divided by the highest region's, so priorities are in (0, 1]. A fraction, not the mean attention: the
  attention sink (the first token, a system token) would otherwise make system the only region that counts.
- A region with no tokens in the samples gets the fit of all regions pooled, marked measured: false.
"""

import datetime
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from kvbench.bridge import models
from kvbench.bridge.adapter import attention_hooks, attention_implementation, language_model
from kvbench.core.errors import BadInput, MemDecayError
from kvbench.core.validation import check_json
from kvbench.learned.memdecay.press import CALIBRATION_FILE, Calibration
from kvbench.tasks.prompt import REGIONS, tokenize_sample

CARD_FILE = "card.json"
PLOT_FILE = "attention_vs_age.png"
SINKS = 4  # the first tokens, attended at every age whatever their region (StreamingLLM's sinks)
MIN_PAIRS = 50  # (query, token) pairs an age needs before its fraction enters the fit
DEFAULT_THRESHOLD = 1.0


def sample_tokens(tokenizer, sample) -> tuple[torch.Tensor, torch.Tensor]:
    """The sample as the benchmark feeds it (`tokenize_sample`): its turns, then the question in a last
    user turn and the answer prefix; token ids and the region id of each ("user" for the question,
    "assistant" for the answer prefix)."""
    if not sample.messages:
        raise BadInput(
            f"sample {sample.task}/{sample.id} has no chat turns (Sample.messages) to calibrate on"
        )
    prompt = tokenize_sample(tokenizer, sample)
    regions = prompt.all_regions()
    assert regions is not None  # a sample of chat turns is tokenized with its regions
    return torch.cat([prompt.context_ids[0], prompt.question_ids[0]]), regions


@dataclass
class LifetimeStats:
    """Per (region, age): (query, token) pairs seen, pairs above the threshold, and relative attention."""

    max_age: int
    threshold: float = DEFAULT_THRESHOLD
    pairs: torch.Tensor = field(init=False)
    attended: torch.Tensor = field(init=False)
    attention: torch.Tensor = field(init=False)  # sum of attention x entries seen (1 = uniform share)
    tokens: torch.Tensor = field(init=False)  # tokens per region

    def __post_init__(self):
        shape = (len(REGIONS), self.max_age + 1)
        self.pairs, self.attended, self.attention = (
            torch.zeros(shape, dtype=torch.float64) for _ in range(3)
        )
        self.tokens = torch.zeros(len(REGIONS), dtype=torch.float64)

    def add(self, weights: torch.Tensor, regions: torch.Tensor) -> None:
        """Count one layer of one sequence: `weights` (kv_heads, L, L) causal attention averaged over each KV
        head's query heads, `regions` (L,) the region of each token."""
        heads, length, _ = weights.shape
        query = torch.arange(length).unsqueeze(1)
        age = query - torch.arange(length).unsqueeze(0)
        # Later queries only (a token's own query is not reuse), and no attention sink (see the module doc).
        counted = (age >= 1) & (age <= self.max_age) & (torch.arange(length) >= SINKS).unsqueeze(0)
        index = (regions.unsqueeze(0) * (self.max_age + 1) + age)[counted]
        seen = (query + 1).to(weights.dtype)
        attended = (weights > self.threshold / seen).sum(dim=0)[counted].double()
        relative = (weights * seen).sum(dim=0)[counted].double()
        size = self.pairs.numel()
        self.pairs += heads * torch.bincount(index, minlength=size).view_as(self.pairs).double()
        self.attended += torch.bincount(index, weights=attended, minlength=size).view_as(self.pairs)
        self.attention += torch.bincount(index, weights=relative, minlength=size).view_as(self.pairs)

    def add_tokens(self, regions: torch.Tensor) -> None:
        self.tokens += torch.bincount(regions, minlength=len(REGIONS)).double()


def fit_half_life(attended: torch.Tensor, pairs: torch.Tensor) -> float:
    """Half-life (in steps) of the attended fraction attended/pairs along age (index); see the module doc."""
    max_age = len(pairs) - 1
    ages = torch.arange(len(pairs), dtype=torch.float64)
    use = (pairs >= MIN_PAIRS) & (attended > 0) & (ages >= 1)
    longest = 10.0 * max_age
    if use.sum() < 2:
        return longest
    x, weight = ages[use], attended[use]
    y = torch.log2(attended[use] / pairs[use])
    below = (y <= y[0] - 2).nonzero()  # the first age at a quarter of the first fraction or less
    if len(below):
        end = max(int(below[0]) + 1, 2)
        x, weight, y = x[:end], weight[:end], y[:end]
    x_mean, y_mean = (weight * x).sum() / weight.sum(), (weight * y).sum() / weight.sum()
    slope = (weight * (x - x_mean) * (y - y_mean)).sum() / (weight * (x - x_mean) ** 2).sum()
    if slope >= 0:
        return longest
    return float(min(max(-1.0 / float(slope), 1.0), longest))


def fit_calibration(stats: LifetimeStats) -> dict:
    """Half-life and base priority per region (REGIONS order) from the counts; see the module doc."""
    pooled = fit_half_life(stats.attended.sum(0), stats.pairs.sum(0))
    measured = stats.pairs.sum(1) > 0
    fraction = torch.where(measured, stats.attended.sum(1) / stats.pairs.sum(1).clamp_min(1), 0.0)
    pooled_fraction = stats.attended.sum() / stats.pairs.sum().clamp_min(1)
    fraction = torch.where(measured, fraction, pooled_fraction)
    priorities = fraction / fraction.max()
    regions = {}
    for g, name in enumerate(REGIONS):
        half_life = fit_half_life(stats.attended[g], stats.pairs[g]) if measured[g] else pooled
        regions[name] = {
            "half_life": round(half_life, 2),
            "priority": round(float(priorities[g]), 4),
            "measured": bool(measured[g]),
            "tokens": int(stats.tokens[g]),
        }
    return {"threshold": stats.threshold, "max_age": stats.max_age, "regions": regions}


@torch.no_grad()
def measure(model, tokenizer, samples, threshold: float = DEFAULT_THRESHOLD, log=print) -> LifetimeStats:
    """Run the model over each sample's turns and count attention by region and age at every layer."""
    encoded = [sample_tokens(tokenizer, sample) for sample in samples]
    stats = LifetimeStats(max_age=max(len(ids) for ids, _ in encoded) - 1, threshold=threshold)
    config = model.config.get_text_config()
    groups = config.num_attention_heads // config.num_key_value_heads
    regions = None

    def hook(module, args, kwargs, output):
        weights = output[1][0].float()  # (heads, L, L)
        stats.add(weights.view(-1, groups, *weights.shape[1:]).mean(dim=1), regions)
        return output[0], None  # drop the weights: only one layer's are held at a time

    with attention_hooks(model, hook), attention_implementation(model, "eager"):
        for number, (ids, regions) in enumerate(encoded, 1):
            stats.add_tokens(regions)
            language_model(model)(input_ids=ids.unsqueeze(0).to(model.device), output_attentions=True)
            log(f"sample {number}/{len(encoded)}: {len(ids)} tokens")
    return stats


def write_calibration(directory: Path, model, stats: LifetimeStats, card: dict) -> dict:
    """calibration.json (what the press reads), card.json (how it was made) and the plot; atomic writes."""
    calibration = {
        "model": models.model_name(model),
        "identity": models.model_identity(model),
        **fit_calibration(stats),
    }
    # Never write what the press would refuse to read (a half-life of 0 from samples of one token).
    check_json(Calibration, json.dumps(calibration), "the measured calibration", MemDecayError)
    directory.mkdir(parents=True, exist_ok=True)
    card = {
        "model": calibration["model"],
        **card,
        "date": datetime.date.today().isoformat(),
        "threshold": stats.threshold,
    }
    for name, content in ((CALIBRATION_FILE, calibration), (CARD_FILE, card)):
        tmp = directory / (name + ".tmp")
        tmp.write_text(json.dumps(content, indent=1) + "\n")
        os.replace(tmp, directory / name)
    plot_lifetimes(stats, calibration, directory / PLOT_FILE)
    return calibration


def plot_lifetimes(stats: LifetimeStats, calibration: dict, path: Path) -> None:
    """Per region: attended fraction and mean relative attention vs age, with the fitted decay."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (fraction_axis, attention_axis) = plt.subplots(1, 2, figsize=(11, 4))
    ages = torch.arange(stats.max_age + 1)
    lowest = 1.0
    for g, name in enumerate(REGIONS):
        use = (stats.pairs[g] >= MIN_PAIRS) & (ages >= 1)
        if not use.any():
            continue
        fraction = stats.attended[g][use] / stats.pairs[g][use]
        lowest = min(lowest, float(fraction[fraction > 0].min()))
        (line,) = fraction_axis.plot(ages[use], fraction, label=name, lw=1)
        half_life = calibration["regions"][name]["half_life"]
        fitted = ages[use][ages[use] <= 4 * half_life]  # the fit's range and a little beyond
        decay = fraction[0] * 2.0 ** (-(fitted - fitted[0]) / half_life)
        fraction_axis.plot(fitted, decay, ls="--", color=line.get_color(), lw=1.5)
        attention_axis.plot(ages[use], stats.attention[g][use] / stats.pairs[g][use], label=name, lw=1)
    fraction_axis.set_ylim(bottom=lowest / 2)
    fraction_axis.set(
        xscale="log", yscale="log", xlabel="age (tokens since the token)", ylabel="fraction attended"
    )
    fraction_axis.set_title(
        f"above {stats.threshold:g}x uniform share (dashed: fitted half-life)", fontsize=9
    )
    attention_axis.set(xscale="log", yscale="log", xlabel="age", ylabel="mean attention / uniform share")
    fraction_axis.legend()
    figure.suptitle(f"MemDecay calibration: {calibration['model']}")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
