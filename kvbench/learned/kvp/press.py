"""KVP press: learned per-head eviction agents scoring each prompt token from its key, value and position.

The agents of a model live in a folder (default: presses/kvp/<model name>/) made by `kvbench kvp train`, of
either architecture (compact or apple; the card says which). `--press-arg arch=apple` asks for one: agents of
the other are refused before any prompt runs.
Eviction is real: kvpress's ScorerPress keeps the int(L * (1 - ratio)) best-scored entries of every head
and the cache shrinks.
"""

import functools
import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import torch
from kvpress import ScorerPress
from kvpress.utils import compute_n_kept
from torch import nn

from kvbench.core.errors import BadInput
from kvbench.learned.common import check_made_for, load_weights
from kvbench.learned.kvp.agent import ARCHS, StackedAgents
from kvbench.learned.kvp.checkpoint import (
    CARD_FILE,
    WEIGHTS_FILE,
    KVPAgentsError,
    card_arch,
    check_agents_fit,
    check_arch,
    default_agents_dir,
    load_agents,
    load_card,
    model_shape,
    train_command_hint,
)


@functools.lru_cache(maxsize=4)
def cached_agents(directory: Path, modified_ns: int, device: torch.device) -> tuple[StackedAgents, dict, str]:
    """Agents loaded once per (folder, version on disk, device), with the digest of their weights file; a
    sweep reuses them across presses."""
    agents, card = load_agents(directory)
    digest = hashlib.sha256((directory / WEIGHTS_FILE).read_bytes()).hexdigest()[:12]
    return agents.to(device).eval().requires_grad_(False), card, digest


@dataclass
class KVPPress(ScorerPress):
    """Keep the tokens the KVP agents of the model score highest, per layer and KV head.

    agents: folder holding agents.safetensors + card.json; default presses/kvp/<model name>/.
    arch: the architecture the agents must be (compact or apple); None takes whichever the card records.
    recent_fraction: the fraction of the kept entries given to the most recent prompt tokens whatever their
        scores (as H2O's press splits its budget), the rest ranked by the agents; 0 (the paper's press) by
        default. A fraction of the budget, not a token count, so it means the same at every ratio and
        length; taken from the ratio set at each compression, so decode-time and streaming compressions
        (kvpress's DecodingPress sets the ratio per call) get it too. Measured in
        docs/studies/recent-window.md: it costs more than it gains, so it stays off.
    """

    # The agents' scores do not depend on the ratio: configs at several ratios share them in one prefill
    # (adapter.scores_shared).
    ratio_free_scores: ClassVar[bool] = True
    compression_ratio: float = 0.0
    agents: str | None = None
    arch: str | None = None
    recent_fraction: float = 0.0
    loaded: StackedAgents | None = field(default=None, init=False, repr=False, compare=False)
    state_digest: str | None = field(default=None, init=False, repr=False, compare=False)  # of the weights

    def __post_init__(self):
        super().__post_init__()
        if not 0 <= self.recent_fraction <= 1:
            raise BadInput(f"recent_fraction must be in [0, 1], got {self.recent_fraction}")
        if self.arch is not None and self.arch not in ARCHS:
            raise KVPAgentsError(f"unknown KVP arch {self.arch!r} (choose one of: {', '.join(ARCHS)})")
        if self.agents:  # a folder given by hand is read now, so a bad one fails before the model loads
            directory = Path(self.agents)
            if not (directory / CARD_FILE).is_file():
                hint = train_command_hint("MODEL")
                raise KVPAgentsError(
                    f"no KVP agents at {directory} (missing {CARD_FILE}); train them with: {hint}"
                )
            check_arch(card_arch(load_card(directory)), self.arch, directory)
            cached_agents(
                directory.resolve(), (directory / CARD_FILE).stat().st_mtime_ns, torch.device("cpu")
            )

    def check_for_model(self, name: str) -> None:
        """Refuse (one line) agents for model `name` that are missing, of another arch, made for another
        model, or whose weights are unreadable or not finite, before the model loads; their KV-cache shape
        is checked once it has."""
        directory = Path(self.agents) if self.agents else default_agents_dir(name)
        if not (directory / CARD_FILE).is_file():
            hint = train_command_hint(name)
            raise KVPAgentsError(f"no KVP agents for {name} at {directory}; train them with: {hint}")
        card = load_card(directory)
        check_arch(card_arch(card), self.arch, directory)
        check_made_for(card, name, directory, "KVP agents", train_command_hint(name), KVPAgentsError)
        load_weights(
            directory / WEIGHTS_FILE, train_command_hint(name), KVPAgentsError
        )  # finite, before the model

    def post_init_from_model(self, model: nn.Module) -> None:
        shape = model_shape(model)
        self.check_for_model(shape.name)
        directory = Path(self.agents) if self.agents else default_agents_dir(shape.name)
        card_path = directory / CARD_FILE
        agents, card, digest = cached_agents(directory.resolve(), card_path.stat().st_mtime_ns, model.device)
        check_agents_fit(card, shape, directory)
        self.loaded, self.state_digest = agents, digest

    def score(self, module, hidden_states, keys, values, attentions, kwargs) -> torch.Tensor:
        num_kv_heads = keys.shape[1]
        layer_heads = slice(module.layer_idx * num_kv_heads, (module.layer_idx + 1) * num_kv_heads)
        scores = self.loaded(keys, values, heads=layer_heads)
        length = scores.shape[-1]
        n_recent = int(compute_n_kept(length, self.compression_ratio) * self.recent_fraction)
        if n_recent:
            scores[..., length - n_recent :] = torch.finfo(scores.dtype).max
        return scores
