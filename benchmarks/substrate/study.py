"""The attention-substrate study (issue 29, item 3): tiny byte-level GPT-style models trained from scratch in
the 2 x 2 x 2 design (softmax / sigmoid attention, learned gate / none, RoPE / NoPE;
benchmarks.substrate.model says which variants and why), each evaluated by live-cache perplexity with no
eviction and with hard eviction by its own gates (gated models), H2O and KeyDiff (and a sliding window, as a
floor) at keep fractions 0.5, 0.25 and 0.1.

Data. The Python language reference shipped with the interpreter (`pydoc_data.topics`, ~465 kB of prose),
as UTF-8 bytes (vocabulary 256, no tokenizer to download): topics in sorted name order, every 8th topic held
out (its bytes are never trained on), the rest concatenated for training. Training draws windows of context
+ 1 bytes at uniform random starts (seeded); evaluation uses `n_eval` windows of `context` bytes at evenly
spaced starts in the held-out text, the same windows for every model.

Training. AdamW (lr 2e-3, betas 0.9/0.95, weight decay 0.1, 20 warm-up steps, cosine to 10 %), batch 16,
gradient clip 1, next-byte cross-entropy. Gated models add the sparsity term
lambda * relu(mean g - tau) (mean over layers, heads, tokens and the batch; lambda = 1, tau = 0.25): gates
above the target keep fraction on average cost loss, and cross-entropy decides which tokens keep theirs.

Live-cache protocol (what `live_cache_nll` does). Each window of T bytes is fed one byte at a time, all
windows as one batch. Every layer keeps its own cache per (window, head): keys (RoPE-rotated at their own
positions, which they keep), values, log-gates and a running H2O score. Feeding the byte at position t: its
key/value are appended, it attends to every entry in the cache (itself included), then, if the cache holds
more than the budget B, the single lowest-scored entry per (window, layer, head) is removed - so a byte
attends to at most B + 1 entries, B before it plus itself, and the cache is held at B from the moment it
fills (the budget is B = int(keep x T) entries per head and layer, fixed from the start, as kvbench's
`memory` budgets: nothing is evicted until B bytes were read). The byte's logits give the NLL of the next
byte: T - 1 predictions per window; `nll` is their mean, and `nll_late` the mean over the second half of the
window (positions T/2 .. T-2), where every budget below 0.5 is already binding. Scores (lowest evicted):

- `gate`: the entry's own learned gate g for that layer and head (gated models only).
- `h2o` (Zhang et al. 2023): the most recent B // 2 entries are always kept; among the rest, the entry with
  the least attention received so far (the sum of its weights over every query that has seen it; for
  sigmoid attention the unnormalised sigmoid weights) goes.
- `keydiff` (Park et al. 2025): the entry whose key has the highest cosine similarity to the mean key of the
  entries now in the cache goes (the most "typical" key).
- `window`: the oldest entry goes (a sliding window of B), a floor any scorer should reach.
- `none`: the full cache (B = T); equal to the model's parallel forward (tests/project/test_substrate_study.py
  checks it).

For gated models all of these run with the soft gates on (kept entries keep their log g in the logits), so
`none` is the gated model's own no-eviction reference, the one the paper's first claim compares to.
"""

import json
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.substrate.model import SubstrateConfig, SubstrateLM, attend

KEEPS = (0.5, 0.25, 0.1)
METHODS = ("gate", "h2o", "keydiff", "window")
DEFAULT_METHODS = METHODS


# ---- data ----


def language_reference() -> tuple[bytes, bytes]:
    """(train, held-out) bytes of the Python language reference (`pydoc_data.topics`), every 8th topic held
    out in sorted name order."""
    from pydoc_data.topics import topics

    names = sorted(topics)
    train = "\n\n".join(topics[n] for i, n in enumerate(names) if i % 8 != 7)
    held = "\n\n".join(topics[n] for i, n in enumerate(names) if i % 8 == 7)
    return train.encode("utf-8"), held.encode("utf-8")


def as_tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).long()


def eval_windows(held: torch.Tensor, context: int, n_eval: int) -> torch.Tensor:
    """n_eval windows of `context` bytes at evenly spaced starts in the held-out text, (n_eval, context)."""
    span = len(held) - context
    starts = [round(i * span / max(1, n_eval - 1)) for i in range(n_eval)]
    return torch.stack([held[s : s + context] for s in starts])


# ---- training ----


@dataclass(frozen=True)
class TrainSettings:
    steps: int = 200
    batch: int = 16
    lr: float = 2e-3
    warmup: int = 20
    weight_decay: float = 0.1
    gate_lambda: float = 1.0
    gate_target: float = 0.25


def lr_at(step: int, s: TrainSettings) -> float:
    if step < s.warmup:
        return s.lr * (step + 1) / s.warmup
    progress = (step - s.warmup) / max(1, s.steps - s.warmup)
    return s.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train_model(
    cfg: SubstrateConfig, train: torch.Tensor, settings: TrainSettings, seed: int
) -> tuple[SubstrateLM, dict]:
    """Train a fresh model from seed; returns the model (eval mode) and its training record."""
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed + 1)
    model = SubstrateLM(cfg)
    opt = torch.optim.AdamW(
        model.parameters(), lr=settings.lr, betas=(0.9, 0.95), weight_decay=settings.weight_decay
    )
    t0 = time.perf_counter()
    losses, gate_means = [], []
    model.train()
    for step in range(settings.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, settings)
        starts = torch.randint(0, len(train) - cfg.context - 1, (settings.batch,), generator=gen)
        chunk = torch.stack([train[s : s + cfg.context + 1] for s in starts.tolist()])
        logits, gates = model(chunk[:, :-1])
        ce = F.cross_entropy(logits.reshape(-1, cfg.vocab), chunk[:, 1:].reshape(-1))
        loss = ce
        if gates:
            mean_g = torch.stack([g.mean() for g in gates]).mean()
            loss = loss + settings.gate_lambda * torch.relu(mean_g - settings.gate_target)
            gate_means.append(mean_g.item())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(ce.item())
    model.eval()
    tail = losses[-20:]
    record = {
        "train_s": round(time.perf_counter() - t0, 1),
        "train_ce_last20": sum(tail) / len(tail),
        "gate_mean_last20": (sum(gate_means[-20:]) / len(gate_means[-20:])) if gate_means else None,
    }
    return model, record


# ---- live-cache evaluation ----


@torch.no_grad()
def live_cache_nll(model: SubstrateLM, windows: torch.Tensor, method: str, budget: int) -> torch.Tensor:
    """Per-prediction NLL (n, T - 1) of the windows (n, T) under the live-cache protocol (module docstring):
    byte by byte, each layer's cache per (window, head) held at `budget` entries by `method`'s scores."""
    return live_cache_nll_many(model, windows, [(method, budget)])[0]


@torch.no_grad()
def live_cache_nll_many(
    model: SubstrateLM, windows: torch.Tensor, plans: Sequence[tuple[str, int]]
) -> list[torch.Tensor]:
    """`live_cache_nll` for several (method, budget) plans in one batched pass (each plan its own copy of the
    windows along the batch; rows never interact, so it equals one pass per plan)."""
    cfg = model.cfg
    for method, _ in plans:
        if method == "gate" and not cfg.gate:
            raise ValueError("gate eviction needs a gated model")
        if method not in (*METHODS, "none"):
            raise ValueError(f"unknown method {method!r}")
    n0, t_len = windows.shape
    windows = windows.repeat(len(plans), 1)
    n = windows.shape[0]
    h_, dh = cfg.n_head, cfg.head_dim
    caches = [
        {
            "k": torch.zeros(n, h_, t_len, dh),
            "v": torch.zeros(n, h_, t_len, dh),
            "lg": torch.zeros(n, h_, t_len),
            "alive": torch.zeros(n, h_, t_len, dtype=torch.bool),
            "acc": torch.zeros(n, h_, t_len),
        }
        for _ in range(cfg.n_layer)
    ]
    row_method = [m for m, _ in plans for _ in range(n0)]
    row_budget = torch.tensor([b for _, b in plans for _ in range(n0)])
    position_ids = torch.arange(t_len)
    nll = torch.zeros(n, t_len - 1)
    for t in range(t_len):
        h = model.embed(windows[:, t : t + 1])
        for block, c in zip(model.blocks, caches, strict=True):
            x = block.ln1(h)
            q, k, v = block.heads(x, position_ids[t : t + 1])
            c["k"][:, :, t] = k[:, :, 0]
            c["v"][:, :, t] = v[:, :, 0]
            lg = block.log_gate(x)
            if lg is not None:
                c["lg"][:, :, t] = lg[:, :, 0]
            c["alive"][:, :, t] = True
            out, w = attend(
                q,
                c["k"],
                c["v"],
                cfg.attention,
                c["alive"].unsqueeze(-2),
                c["lg"] if cfg.gate else None,
                cfg.sigmoid_bias,
            )
            c["acc"] += w[:, :, 0]
            h = block.mix(h, out)
            evict_rows(c, row_method, row_budget, t)
        if t + 1 < t_len:
            logp = torch.log_softmax(model.logits(h)[:, 0], dim=-1)
            nll[:, t] = -logp.gather(1, windows[:, t + 1 : t + 2])[:, 0]
    return [nll[p * n0 : (p + 1) * n0] for p in range(len(plans))]


def evict_rows(c: dict, row_method: list[str], row_budget: torch.Tensor, t: int) -> None:
    """Remove the lowest-scored live entry per (row, head) of one layer's cache, in every row whose cache
    holds more than its budget (budget + 1 entries); rows have their own method and budget, each method's
    scores computed once over the rows that use it."""
    over = (t + 1 > row_budget) & torch.tensor([m != "none" for m in row_method])
    if not bool(over.any()):
        return
    alive = c["alive"]
    score = torch.full(alive.shape, float("inf"))
    for method in set(row_method) - {"none"}:
        rows = torch.tensor([m == method for m in row_method]) & over
        if not bool(rows.any()):
            continue
        part = {key: val[rows] for key, val in c.items()}
        budgets = row_budget[rows]
        score[rows] = method_score(part, method, budgets, t)
    score = score.masked_fill(~alive, float("inf"))
    idx = score.argmin(-1, keepdim=True)
    evicted = torch.zeros_like(alive).scatter_(-1, idx, True) & over.view(-1, 1, 1)
    alive &= ~evicted


def method_score(c: dict, method: str, budgets: torch.Tensor, t: int) -> torch.Tensor:
    """Scores (rows, H, T) of one method on a layer cache's rows (lowest evicted); budgets (rows,)."""
    alive = c["alive"]
    positions = torch.arange(alive.shape[-1])
    if method == "gate":
        return c["lg"].clone()
    if method == "h2o":
        recent = positions.view(1, 1, -1) > (t - budgets // 2).view(-1, 1, 1)
        return c["acc"].masked_fill(recent, float("inf"))
    if method == "keydiff":
        keys = c["k"] * alive.unsqueeze(-1)
        anchor = keys.sum(-2, keepdim=True) / alive.sum(-1, keepdim=True).unsqueeze(-1)
        return -F.cosine_similarity(c["k"], anchor, dim=-1)
    if method == "window":
        return positions.to(torch.float32).expand_as(alive).clone()
    raise ValueError(f"unknown method {method!r}")


# ---- the study ----


def design(gates: Sequence[bool] = (False, True)) -> list[SubstrateConfig]:
    return [
        SubstrateConfig(attention=a, gate=g, rope=r)
        for a in ("softmax", "sigmoid")
        for g in gates
        for r in (True, False)
    ]


def evaluate(
    model: SubstrateLM,
    windows: torch.Tensor,
    keeps: Sequence[float] = KEEPS,
    methods: Sequence[str] = DEFAULT_METHODS,
) -> list[dict]:
    """One row per (method, keep), plus the `none` reference."""
    t_len = windows.shape[1]
    late = slice(t_len // 2, None)
    rows = []
    plan = [("none", 1.0)] + [(m, k) for k in keeps for m in methods if m != "gate" or model.cfg.gate]
    budgets = [t_len if method == "none" else int(keep * t_len) for method, keep in plan]
    nlls = live_cache_nll_many(model, windows, list(zip([m for m, _ in plan], budgets, strict=True)))
    for (method, keep), budget, nll in zip(plan, budgets, nlls, strict=True):
        rows.append(
            {
                "method": method,
                "keep": keep,
                "budget": budget,
                "nll": nll.mean().item(),
                "nll_late": nll[:, late].mean().item(),
                "ppl": math.exp(nll.mean().item()),
                "ppl_late": math.exp(nll[:, late].mean().item()),
            }
        )
    return rows


def run_study(
    out: Path,
    seeds: Sequence[int] = (0, 1, 2),
    settings: TrainSettings = TrainSettings(),
    n_eval: int = 32,
    configs: Sequence[SubstrateConfig] | None = None,
    threads: int = 1,
    log=print,
) -> Path:
    """Train and evaluate every (config, seed); appends one JSON line per (model, method, keep) to
    out/rows.jsonl, skipping models already there (a rerun resumes). Returns the rows file."""
    torch.set_num_threads(threads)
    out.mkdir(parents=True, exist_ok=True)
    rows_path = out / "rows.jsonl"
    done = set()
    if rows_path.exists() and rows_path.read_text().strip():
        from benchmarks.substrate.summary import load  # checks every row against the file's schema

        done = {(r["model"], r["seed"]) for r in load(rows_path)}
    train_b, held_b = language_reference()
    train, held = as_tensor(train_b), as_tensor(held_b)
    configs = list(configs) if configs is not None else design()
    for seed in seeds:
        for cfg in configs:
            if (cfg.name, seed) in done:
                continue
            random.seed(seed)
            model, record = train_model(cfg, train, settings, seed)
            windows = eval_windows(held, cfg.context, n_eval)
            t0 = time.perf_counter()
            rows = evaluate(model, windows)
            eval_s = round(time.perf_counter() - t0, 1)
            with rows_path.open("a") as f:
                for r in rows:
                    row = {
                        "model": cfg.name,
                        "attention": cfg.attention,
                        "gate": cfg.gate,
                        "rope": cfg.rope,
                        "seed": seed,
                        **r,
                        **record,
                        "eval_s": eval_s,
                        "config": cfg.to_dict(),
                        "settings": settings.__dict__,
                        "n_eval": n_eval,
                    }
                    f.write(json.dumps(row) + "\n")
            ref = rows[0]["ppl"]
            gate_mean = record["gate_mean_last20"]
            log(
                f"{cfg.name} seed {seed}: train {record['train_s']} s, eval {eval_s} s, "
                f"ppl {ref:.3f}, gate {gate_mean}"
            )
    return rows_path
