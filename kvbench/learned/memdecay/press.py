"""MemDecay (Matam & Kim, arXiv 2607.10582): region-aware KV-cache eviction with per-region decay.

Every token carries the region of the chat turn it came from (system, user, assistant, tool, scratchpad).
Its retention score decays with the steps since it was last attended, at the half-life measured for its
region (`kvbench memdecay calibrate`), from the region's base priority; attention refreshes it. Whole
pages of 16 entries are evicted, the lowest-scoring first, and pinned regions are never evicted.
There is no public code: the paper's page gives the ingredients (region priorities and decay rates,
refresh on attention, page eviction, pinning, calibration from attention lifetimes), the rest is chosen
here and said in `MemDecayPress`'s docstring.
"""

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import annotated_types
import torch
from kvpress import ScorerPress
from kvpress.utils import compute_n_kept
from torch import nn

from kvbench.bridge import models
from kvbench.core import resources
from kvbench.core.errors import MemDecayError
from kvbench.core.validation import STRICT, Count, check_json, parse_json, read_text
from kvbench.learned.common import shipped_state_dir
from kvbench.presses.queries import (
    SCORED_QUERIES,
    Scored,
    attention_chunks,
    check_scored,
    query_sample,
    rotated_queries,
)
from kvbench.tasks.prompt import REGIONS

CALIBRATION_FILE = "calibration.json"


def default_calibration_dir(model_name: str) -> Path:
    """Where the shipped calibration of a model lives: presses/memdecay/<name>/ (kvbench.core.resources)."""
    return shipped_state_dir("memdecay", model_name)


def calibrate_command(model_name: str) -> str:
    out = resources.out_option(default_calibration_dir(model_name), "calibration")
    return f"kvbench memdecay calibrate --model {model_name} {out}"


@dataclass
class RegionFit:
    """One region's fit in calibration.json."""

    __pydantic_config__ = STRICT

    half_life: Annotated[float, annotated_types.Gt(0)]  # steps; the press divides ages by it
    priority: Annotated[float, annotated_types.Interval(ge=0, le=1)]
    measured: bool = True
    tokens: Count = 0


@dataclass
class Calibration:
    """The schema of calibration.json (`kvbench memdecay calibrate` writes it): checked whole when read, so
    a damaged or hand-edited file (a NaN threshold, a missing region) is refused before any work."""

    __pydantic_config__ = STRICT

    model: str
    threshold: Annotated[float, annotated_types.Gt(0)]
    regions: dict[str, RegionFit]
    max_age: Count | None = None
    identity: str | None = None  # models.model_identity; None in calibrations made before it was recorded


def load_calibration(directory: Path, model_name: str, identity: str | None = None) -> tuple[dict, str]:
    """The calibration in `directory` and the digest of its file; refuses a missing one, one that does not
    fit `Calibration` or lacks a region, or another model's: by `identity` (the loaded model's
    `models.model_identity`) where the calibration records one, so a copy of a model's folder is that
    model; else by name. Before the model loads (`identity` None), one that records an identity passes."""
    path = Path(directory) / CALIBRATION_FILE
    if not path.is_file():
        raise MemDecayError(
            f"no MemDecay calibration for {model_name} at {directory}; make it with: "
            f"{calibrate_command(model_name)}"
        )
    remake = f"make it again with: {calibrate_command(model_name)}"
    try:
        text = read_text(path, MemDecayError)
    except (OSError, UnicodeDecodeError) as error:
        raise MemDecayError(f"{path} is unreadable ({error}); {remake}") from None
    try:
        checked = check_json(Calibration, text, "", ValueError)
        missing = [name for name in REGIONS if name not in checked.regions]
        if missing:
            raise ValueError(f"no region {', '.join(missing)}")
    except ValueError as error:
        raise MemDecayError(f"{path} is corrupt ({error}); {remake}") from None
    if checked.identity is None:
        other = checked.model != model_name
    else:
        other = identity is not None and checked.identity != identity
    if other:
        made_for = checked.model + (f" (weights {checked.identity})" if checked.identity else "")
        this = model_name + (f" (weights {identity})" if checked.identity and identity else "")
        raise MemDecayError(
            f"the MemDecay calibration at {directory} was made for {made_for}, not for {this}; make one "
            f"with: {calibrate_command(model_name)}"
        )
    return parse_json(text), hashlib.sha256(text.encode()).hexdigest()[:12]


def parse_pin(pin: str) -> tuple[int, ...]:
    """'system,tool' -> region ids; an unknown name is a one-line error naming the valid ones."""
    names = [name.strip() for name in pin.split(",") if name.strip()]
    for name in names:
        if name not in REGIONS:
            raise MemDecayError(f"unknown region {name!r} in pin; valid regions: {', '.join(REGIONS)}")
    return tuple(sorted({REGIONS.index(name) for name in names}))


@dataclass
class EntryState:
    """What MemDecay remembers of each entry of one layer's cache, per (batch, KV head, entry)."""

    region: torch.Tensor  # long: index in REGIONS
    age: torch.Tensor  # float: steps since the entry was last attended (or created)
    attention: torch.Tensor  # float: attention accumulated over every query seen so far

    def gather(self, indices: torch.Tensor) -> "EntryState":
        return EntryState(*(t.gather(2, indices) for t in (self.region, self.age, self.attention)))


def query_attention(
    module: nn.Module, hidden_states: torch.Tensor, keys: torch.Tensor, position: int, scored: Scored = "all"
):
    """Yield (rows, stands_for, weights) chunk by chunk: the attention of the queries of `hidden_states` (the
    last tokens, at the positions ending at `position`) that `query_sample` picks (`scored`), over the cache
    `keys`, averaged over the query heads of each KV head, shape (batch, kv_heads, len(rows), seen); `rows`
    are the queries' indices in `hidden_states`, `stands_for` how many queries each stands for. Query t of n
    sees the entries up to its own, L - n + t (the new entries are at the end of the cache, in order); `seen`
    is the number of entries the chunk's last query sees: the weights of later entries are exactly 0 and
    left out."""
    n, length = hidden_states.shape[1], keys.shape[2]
    batch, kv_heads = keys.shape[:2]
    index, stands_for = query_sample(n, scored, keys.device)
    positions = torch.arange(position - n + 1, position + 1, device=keys.device)[index]
    cos, sin = module.rotary_emb(hidden_states, positions.unsqueeze(0))
    queries = rotated_queries(module, hidden_states[:, index], cos, sin, kv_heads)
    key_positions = torch.arange(length, device=keys.device).expand(batch, kv_heads, length)
    for start, weights in attention_chunks(queries, keys, length - n + index, key_positions):
        chunk = slice(start, start + weights.shape[3])
        yield index[chunk], stands_for[chunk], weights.mean(dim=2)


def retention_scores(
    state: EntryState, priorities: torch.Tensor, half_lives: torch.Tensor, beta: float, pinned: tuple
) -> torch.Tensor:
    """b_g * 2^(-age / h_g) + beta * attention / mean attention of the head's entries; pinned: +inf."""
    decay = priorities[state.region] * torch.exp2(-state.age / half_lives[state.region])
    relative = state.attention / state.attention.mean(dim=-1, keepdim=True).clamp_min(1e-30)
    scores = decay + beta * relative
    for region in pinned:
        scores = scores.masked_fill(state.region == region, float("inf"))
    return scores


def select_pages(scores: torch.Tensor, n_kept: int, page_size: int) -> torch.Tensor:
    """Indices (ascending) of the `n_kept` entries kept per head: pinned entries (score +inf) first, earliest
    first if they overflow the budget; then pages of `page_size` consecutive entries ranked by the mean score
    of their entries (ties: the earlier page), whole pages first; the first page that does not fit keeps its
    best entries (ties: the earlier entry). That is, the first n_kept entries in the order (pinned first, page
    score desc, page asc, entry score desc, entry asc); a pinned entry's page scores +inf, so the rest of it
    comes right after the pinned entries."""
    length = scores.shape[-1]
    page = torch.arange(length, device=scores.device).expand_as(scores) // page_size
    pages = length // page_size + 1
    sums = scores.new_zeros(*scores.shape[:-1], pages).scatter_add_(-1, page, scores)
    sizes = torch.bincount(page[(0,) * (scores.dim() - 1)], minlength=pages).clamp_min(1).to(scores.dtype)
    page_scores = (sums / sizes).gather(-1, page)
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices  # least significant key first
    for key, descending in ((page, False), (page_scores, True), (scores == float("inf"), True)):
        order = order.gather(
            -1, torch.sort(key.gather(-1, order), dim=-1, descending=descending, stable=True)[1]
        )
    return order[..., :n_kept].sort(dim=-1).values


@dataclass
class MemDecayPress(ScorerPress):
    """Keep the pages of highest region-aware retention score, per layer and KV head.

    score = b_g * 2^(-age / h_g) + beta * (accumulated attention / its mean over the head's entries)

    Choices (the paper's page is silent on them; arXiv 2607.10582 has no public code):
    - Attention received is computed from the queries of the `hidden_states` the press is given (post-RoPE,
      at the last positions ending at the current one), over the whole cache, averaged over the query heads
      of each KV head, so every KV head has its own ages and accumulated attention.
    - A token is "attended" when a query gives it more than `threshold` times its uniform share (1 / the
      entries that query sees): a relative threshold keeps ages comparable across context lengths. The
      threshold is the calibration's, the one its half-lives were measured with.
    - age = steps (tokens processed) since the last query that attended the token, or since the token
      itself was processed if none did.
    - The accumulated attention is divided by its mean over the head's entries (exactly 1 after a prefill:
      each query spreads one unit) so that beta means the same at every length. beta=0.1 (default): the
      region prior and its decay rank the tokens, as the paper's policy; accumulated attention breaks ties and
      keeps heavy hitters (a token with 10x the mean attention gains as much as a max-priority token just
      attended). beta=0 is the pure decay policy.
    - Pages: `page_size` (16, a common KV-cache page size; the paper evicts pages but its abstract gives no
      size) consecutive entries of the current cache; page score = the mean of its entries' scores (the page
      is worth what it holds on average; a max would let one sink token keep 15 others). The budget
      int(L * (1 - ratio)) is exact: whole pages by score, then the best entries of the next page. Kept
      entries stay in position order.
    - pin: comma-separated regions whose tokens are always kept: they go first, then the rest of their pages
      (a page that holds a pinned token is open anyway), then the other pages. If the pinned tokens exceed
      the budget, the budget wins and the earliest pinned tokens are kept.
    - Regions: the engine gives one per context and question token through `use_regions` (the question is
      "user" up to the assistant header, the answer prefix "assistant"; none given: the whole context is
      "user", the single user turn it is rendered in). Entries beyond those (generation) are "assistant" when
      they arrive while decoding (the forward that triggers compression is one token) and "user" otherwise
      (a chunk fed whole). The question's own ids matter under decode-time compression, where kvpress's
      DecodingPress buffers the question's hidden states with the decoded ones.
    - Repeated compression (decode-time, streaming): each layer keeps region, age and accumulated attention
      per entry and gathers them with the kept indices; new entries at the end start at age 0 when
      processed. `post_init_from_model` resets this state.
    - `scored_queries` (64 by default; "all": every query): a prefill is scored with a sample of its
      queries (`kvbench.presses.queries.query_sample`: the last 32 exactly, one per stratum of the earlier
      ones, its attention weighted by the stratum's size in the accumulated attention). Ages are exact for
      tokens the last 32 queries attend; an older token's age counts from the last sampled query that
      attended it, so it can be older than the exact one by up to a stratum (31 steps at 1k), where the
      region's decay has already brought it down by 2^(-31/h). The exact scoring costs +80 % of a 1k
      prefill on CPU, the sample a few percent (docs/studies/performance.md has both on the memory board).
      Decode-time calls bring fewer than 64 new tokens: scored exactly.

    calibration: folder holding calibration.json (made by `kvbench memdecay calibrate`); default
    presses/memdecay/<model name>/.
    """

    compression_ratio: float = 0.0
    beta: float = 0.1
    pin: str = ""
    calibration: str | None = None
    page_size: int = 16
    scored_queries: Scored = SCORED_QUERIES
    pinned: tuple = field(default=(), init=False, repr=False, compare=False)
    regions: torch.Tensor | None = field(default=None, init=False, repr=False, compare=False)
    threshold: float | None = field(default=None, init=False, repr=False, compare=False)
    priorities: torch.Tensor | None = field(default=None, init=False, repr=False, compare=False)
    half_lives: torch.Tensor | None = field(default=None, init=False, repr=False, compare=False)
    layer_state: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    state_digest: str | None = field(default=None, init=False, repr=False, compare=False)  # of calibration

    def __post_init__(self):
        super().__post_init__()
        if self.beta < 0:
            raise MemDecayError(f"beta must be >= 0, got {self.beta}")
        if self.page_size < 1:
            raise MemDecayError(f"page_size must be >= 1, got {self.page_size}")
        try:
            check_scored(self.scored_queries, "memdecay")
        except ValueError as error:
            raise MemDecayError(str(error)) from None
        self.pinned = parse_pin(str(self.pin or ""))

    def check_for_model(self, name: str) -> None:
        """Refuse (one line) a missing calibration, or one made for another model, before the model loads."""
        directory = Path(self.calibration) if self.calibration else default_calibration_dir(name)
        load_calibration(directory, name)

    def post_init_from_model(self, model: nn.Module) -> None:
        name = models.model_name(model)
        directory = Path(self.calibration) if self.calibration else default_calibration_dir(name)
        calibration, self.state_digest = load_calibration(directory, name, models.model_identity(model))
        self.set_calibration(calibration)
        self.layer_state = {}

    def set_calibration(self, calibration: dict) -> None:
        """Region priorities and half-lives (in REGIONS order) and the attention threshold they go with."""
        self.threshold = float(calibration["threshold"])
        regions = calibration["regions"]
        self.priorities = torch.tensor([float(regions[name]["priority"]) for name in REGIONS])
        self.half_lives = torch.tensor([float(regions[name]["half_life"]) for name in REGIONS])

    def use_regions(self, regions: torch.LongTensor) -> None:
        """One region id (index in REGIONS) per context token, in order; called before the prefill."""
        self.regions = regions.detach().long().cpu().flatten()

    def new_regions(self, positions: torch.Tensor, decoding: bool) -> torch.Tensor:
        known = self.regions if self.regions is not None else torch.zeros(0, dtype=torch.long)
        later = REGIONS.index("assistant" if decoding else "user")
        inside = positions < len(known)
        regions = torch.full_like(positions, later)
        regions[inside] = known[positions[inside]]
        return regions

    @torch.no_grad()
    def observe(self, module, hidden_states, keys, kwargs) -> EntryState:
        """The state of every entry of `keys` after the queries of `hidden_states` (not stored)."""
        batch, kv_heads, length, _ = keys.shape
        device = keys.device
        old = self.layer_state.get(module.layer_idx)
        kept = 0 if old is None else old.region.shape[2]
        if length < kept:
            raise ValueError(
                f"cache of layer {module.layer_idx} shrank to {length} below {kept} tracked entries"
            )
        added = length - kept  # processed since the last call; step s = 0..added-1, the current is added-1
        n = min(hidden_states.shape[1], added)
        position_ids = kwargs.get("position_ids")
        current = kwargs["cache_position"] if position_ids is None else position_ids
        current = int(current.flatten()[-1])
        decoding = kwargs["hidden_states"].shape[1] == 1
        positions = torch.arange(current - added + 1, current + 1)
        region = self.new_regions(positions, decoding).to(device).expand(batch, kv_heads, added)
        # The step at which each entry was last attended; earlier calls' entries: -1 - age.
        last = torch.arange(added, device=device, dtype=torch.float32).expand(batch, kv_heads, added)
        attention = torch.zeros(batch, kv_heads, added, device=device)
        if old is not None:
            region = torch.cat([old.region, region], dim=2)
            last = torch.cat([-1 - old.age, last], dim=2)
            attention = torch.cat([old.attention, attention], dim=2)
        if n:
            chunks = query_attention(module, hidden_states[:, -n:], keys, current, self.scored_queries)
            for rows, stands_for, weights in chunks:
                seen = (length - n + rows + 1).to(torch.float32)  # entries each query sees
                attended = weights > (self.threshold / seen).view(1, 1, -1, 1)
                steps = (added - n + rows).to(torch.float32).view(1, 1, -1, 1)
                width = weights.shape[-1]  # later entries: weight 0, neither attended nor accumulated
                latest = torch.where(attended, steps, float("-inf")).amax(dim=2)
                received = (weights * stands_for.view(1, 1, -1, 1)).sum(dim=2)
                last = torch.cat([torch.maximum(last[..., :width], latest), last[..., width:]], dim=-1)
                attention = torch.cat([attention[..., :width] + received, attention[..., width:]], -1)
        return EntryState(region, (added - 1) - last, attention)

    def state_scores(self, state: EntryState) -> torch.Tensor:
        device = state.age.device
        return retention_scores(
            state, self.priorities.to(device), self.half_lives.to(device), self.beta, self.pinned
        )

    def score(self, module, hidden_states, keys, values, attentions, kwargs) -> torch.Tensor:
        """Retention score of every entry (the state this call would store is not stored)."""
        return self.state_scores(self.observe(module, hidden_states, keys, kwargs))

    def compress(self, module, hidden_states, keys, values, attentions, kwargs):
        if self.priorities is None:
            raise MemDecayError("MemDecayPress has no calibration: use it as a press on a model (post_init)")
        state = self.observe(module, hidden_states, keys, kwargs)
        length = keys.shape[2]
        n_kept = compute_n_kept(length, self.compression_ratio)
        if n_kept < length:
            indices = select_pages(self.state_scores(state), n_kept, self.page_size)
            state = state.gather(indices)
            indices = indices.unsqueeze(-1)
            keys = keys.gather(2, indices.expand(-1, -1, -1, keys.shape[3])).contiguous()
            values = values.gather(2, indices.expand(-1, -1, -1, values.shape[3])).contiguous()
        self.layer_state[module.layer_idx] = state
        return keys, values
