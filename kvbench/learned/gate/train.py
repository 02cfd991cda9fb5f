"""Training the gates on the frozen model: soft gates, KL to the ungated model, a sparsity term.

Per step one training text (token ids) is teacher-forced twice: ungated (no grad: p_full) and with the gates
soft (gates.soft_gates: log g_j on later queries' logits). Loss = mean over positions of KL(p_full || p_gated)
+ sparsity x mean over (layer, KV head) of (mean_j g_j - keep)^2, so every head's mean gate is driven to
the target keep fraction, the share of entries the hard press keeps at ratio 1 - keep. Only the gates
train (Adam); the model stays frozen. The gates of the step with the lowest validation KL (at the target
keep fraction reached: |mean gate - keep| <= 0.05, else the last) are saved.

The data: texts of the live-cache protocol's generators (kvbench.perplexity.generated_texts), by default
the standard library's source ("code") at seeds >= 10000 for training and validation, so that the held-out
texts of the study (Python reference prose, seeds 0..999) are of a source the gates never saw. The shared
data store (kvbench.learned.common.datagen) holds the context's keys and values but not its token ids, so
the soft forward over the context, which needs the ids, cannot be run from it: the gates read text instead.
"""

import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from kvbench.learned.gate.gates import GateSet, soft_gates

TRAIN_SEED, VAL_SEED = 10_000, 20_000  # evaluation texts use seeds 0..999


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


class GateTap:
    """The gates, remembering every layer's gate values of the last forward (for the sparsity term)."""

    def __init__(self, gates: GateSet):
        self.gates, self.seen = gates, []

    def log_gates(self, layer, keys, values):
        log_g = self.gates.log_gates(layer, keys, values)
        self.seen.append(log_g.exp().mean(dim=(0, 2)))  # (kv_heads,) mean gate of the layer
        return log_g


def kl_and_mean_gate(model, gates: GateSet, ids: torch.Tensor, full_log_p: torch.Tensor | None = None):
    """(mean KL(p_full || p_gated) per position, mean gate per (layer, head) (layers, kv_heads))."""
    if full_log_p is None:
        with torch.no_grad():
            full_log_p = F.log_softmax(model(ids).logits.float(), dim=-1)
    tap = GateTap(gates)
    with soft_gates(model, tap):
        gated_log_p = F.log_softmax(model(ids).logits.float(), dim=-1)
    kl = F.kl_div(gated_log_p, full_log_p, log_target=True, reduction="none").sum(-1).mean()
    return kl, torch.stack(tap.seen)


def validate(model, gates: GateSet, texts, keep: float) -> dict:
    kls, means = [], []
    with torch.no_grad():
        for ids in texts:
            kl, mean_gate = kl_and_mean_gate(model, gates, ids.to(model.device))
            kls.append(float(kl))
            means.append(mean_gate)
    mean_gate = torch.stack(means).mean(0)
    return {
        "kl": sum(kls) / len(kls),
        "mean_gate": float(mean_gate.mean()),
        "gate_gap": float((mean_gate - keep).abs().max()),
    }


def train(model, config: TrainConfig, texts, log=print):
    """Trained gates, and the card's fields (training, data, validation). `texts`: (train, val) lists of
    (1, length) token ids: the command makes them from the live-cache protocol's generators, at TRAIN_SEED
    and VAL_SEED (layer 6 may import kvbench.perplexity; this module may not); tests give random ids."""
    from kvbench.learned.common import model_shape

    torch.manual_seed(config.seed)
    model.requires_grad_(False)
    shape = model_shape(model)
    gates = GateSet(shape.num_layers, shape.num_kv_heads, shape.head_dim, config.keep).to(model.device)
    train_texts, val_texts = texts
    optimizer = torch.optim.Adam(gates.parameters(), lr=config.lr)
    start = time.perf_counter()
    initial = validate(model, gates, val_texts, config.keep)
    log(f"step 0: val KL {initial['kl']:.4f}, mean gate {initial['mean_gate']:.3f}")
    best, best_state, history = None, None, [{"step": 0, **initial}]
    for step in range(1, config.steps + 1):
        ids = train_texts[(step - 1) % len(train_texts)].to(model.device)
        kl, mean_gate = kl_and_mean_gate(model, gates, ids)
        sparsity = ((mean_gate - config.keep) ** 2).mean()
        loss = kl + config.sparsity * sparsity
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % config.eval_every == 0 or step == config.steps:
            result = validate(model, gates, val_texts, config.keep)
            history.append({"step": step, **result, "train_kl": kl.item()})
            log(
                f"step {step}: train KL {kl.item():.4f}, val KL {result['kl']:.4f}, mean gate "
                f"{result['mean_gate']:.3f} (worst head off by {result['gate_gap']:.3f}), "
                f"{time.perf_counter() - start:.0f} s"
            )
            on_target = result["gate_gap"] <= 0.05
            if best is None or (on_target and (not best["on_target"] or result["kl"] < best["kl"])):
                best = {**result, "step": step, "on_target": on_target}
                best_state = {name: tensor.clone() for name, tensor in gates.state_dict().items()}
    gates.load_state_dict(best_state)
    card = {
        "model": asdict(shape),
        "training": {
            **asdict(config),
            "best_step": best["step"],
            "seconds": round(time.perf_counter() - start, 1),
            "threads": torch.get_num_threads(),
        },
        "data": {
            "source": config.source,
            "train": f"{config.texts} texts of {config.length} tokens, seeds from {TRAIN_SEED}",
            "val": f"{config.val_texts} texts of {config.length} tokens, seeds from {VAL_SEED}",
        },
        "validation": {
            "kl_ungated_start": initial["kl"],
            "kl": best["kl"],
            "mean_gate": best["mean_gate"],
            "worst_head_gate_gap": best["gate_gap"],
            "history": history,
        },
    }
    return gates, card


def soft_nll(model, gates, ids: torch.Tensor) -> float:
    """Mean next-token NLL of a text teacher-forced with soft gates (None: ungated)."""
    with torch.no_grad():
        if gates is None:
            logits = model(ids).logits
        else:
            with soft_gates(model, gates):
                logits = model(ids).logits
    return float(F.cross_entropy(logits[0, :-1].float(), ids[0, 1:]))


__all__ = ["TrainConfig", "train", "soft_nll", "validate"]
