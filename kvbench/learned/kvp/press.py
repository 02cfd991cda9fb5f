"""KVP press: learned per-head eviction agents scoring each prompt token from its key, value and position.

The agents of a model live in a folder (default: presses/kvp/<model name>/) made by `kvbench kvp train`, of
either architecture (compact or apple; the card says which). `--press-arg arch=apple` asks for one: agents of
the other are refused before any prompt runs.
Eviction is real: the int(L * (1 - ratio)) best-scored entries of every head are kept, in cache order, and
the cache shrinks. Each entry is scored at its true position in the text, also when the cache was compressed
before (decode-time, streaming, multi-turn, live-cache perplexity): each layer's kept positions are tracked.
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
    sinks, window: absolute numbers of entries every head keeps whatever their scores, inside its budget:
        the first `sinks` tokens of the text and the latest `window` ones. The authors run their agents with
        4 and 16 (SamplerAgentPress(n_sinks, n_running_window) in notebooks/inference_demo.ipynb of
        apple/ml-learning-to-evict); kvbench's `kvp` uses 0 and 0 (docs/learned-presses.md). When the
        budget holds fewer, the sinks go first, then the latest tokens of the window.
    recent_fraction: kvbench's own option: the fraction of the kept entries given to the most recent tokens
        whatever their scores (as H2O's press splits its budget), taken from the ratio set at each
        compression. 0 by default; docs/studies/recent-window.md measured that it costs more than it gains.

    Positions: each layer's state holds the true position of every entry of its cache per head, gathered
    with the kept indices at each compression; entries added since are the latest tokens, at the positions
    up to the current one (kwargs' position_ids). A prefill from position 0 starts the state afresh, and so
    does `post_init_from_model`, which the engine calls for every prompt.
    """

    # The agents' scores do not depend on the ratio: configs at several ratios share them in one prefill
    # (adapter.scores_shared).
    ratio_free_scores: ClassVar[bool] = True
    compression_ratio: float = 0.0
    agents: str | None = None
    arch: str | None = None
    sinks: int = 0
    window: int = 0
    recent_fraction: float = 0.0
    loaded: StackedAgents | None = field(default=None, init=False, repr=False, compare=False)
    state_digest: str | None = field(default=None, init=False, repr=False, compare=False)  # of the weights
    kept_positions: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self):
        super().__post_init__()
        if not 0 <= self.recent_fraction <= 1:
            raise BadInput(f"recent_fraction must be in [0, 1], got {self.recent_fraction}")
        for name in ("sinks", "window"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise BadInput(f"{name} must be a whole number of entries >= 0, got {value!r}")
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
        self.kept_positions = {}

    def entry_positions(self, module, hidden_states, keys, kwargs) -> torch.Tensor:
        """The true positions (batch, kv_heads, L) of the L entries of `keys`: the tracked ones of the
        entries kept at the layer's last compression, then the latest tokens up to the current position."""
        batch, num_kv_heads, length, _ = keys.shape
        current = kwargs.get("position_ids")
        if current is None:
            current = kwargs.get("cache_position")
        last = length - 1 if current is None else int(current.flatten()[-1])
        cache_position = kwargs.get("cache_position")
        prefill = cache_position is not None and int(cache_position[0]) == 0
        fresh = prefill and hidden_states.shape[1] == length
        kept = None if fresh else self.kept_positions.get(module.layer_idx)
        if kept is not None and (kept.shape[:2] != (batch, num_kv_heads) or kept.shape[2] > length):
            raise ValueError(
                f"KVP tracks {kept.shape[2]} entries of layer {module.layer_idx}, the cache holds {length}"
            )
        added = length - (0 if kept is None else kept.shape[2])
        latest = torch.arange(last - added + 1, last + 1, device=keys.device).expand(batch, num_kv_heads, -1)
        return latest if kept is None else torch.cat([kept.to(keys.device), latest], dim=2)

    def score(self, module, hidden_states, keys, values, attentions, kwargs) -> torch.Tensor:
        batch, num_kv_heads, length, _ = keys.shape
        layer_heads = slice(module.layer_idx * num_kv_heads, (module.layer_idx + 1) * num_kv_heads)
        positions = self.entry_positions(module, hidden_states, keys, kwargs)
        last = int(positions.amax()) if length else 0
        lengths = torch.full((batch,), last + 1, device=keys.device)
        scores = self.loaded(keys, values, heads=layer_heads, positions=positions, lengths=lengths)
        n_recent = int(compute_n_kept(length, self.compression_ratio) * self.recent_fraction)
        if n_recent:
            scores[..., length - n_recent :] = torch.finfo(scores.dtype).max
        if self.window:  # ranked by position above every agent's score, the latest first
            in_window = positions > last - self.window
            above = scores.amax() + 1 + (positions - (last - self.window)).to(scores.dtype)
            scores = torch.where(in_window, above, scores)
        if self.sinks:
            scores = scores.masked_fill(positions < self.sinks, float("inf"))
        return scores

    def compress(self, module, hidden_states, keys, values, attentions, kwargs):
        """kvpress's ScorerPress.compress keeping the chosen entries in cache order, and their positions."""
        positions = self.entry_positions(module, hidden_states, keys, kwargs)
        if self.compression_ratio == 0:
            self.kept_positions[module.layer_idx] = positions
            return keys, values
        scores = self.score(module, hidden_states, keys, values, attentions, kwargs)
        n_kept = compute_n_kept(keys.shape[2], self.compression_ratio)
        indices = scores.topk(n_kept, dim=-1).indices.sort(dim=-1).values
        self.kept_positions[module.layer_idx] = positions.gather(2, indices)
        indices = indices.unsqueeze(-1).expand(-1, -1, -1, keys.shape[-1])
        return keys.gather(2, indices).contiguous(), values.gather(2, indices).contiguous()
