"""Training the gates on the frozen model: soft gates, KL to the ungated model, a sparsity term.

Per step one training text (token ids) is teacher-forced twice: ungated (no grad: p_full) and with the gates
soft (gates.soft_gates: log g_j on later queries' logits). Loss = mean over positions of KL(p_full || p_gated)
+ sparsity x mean over (layer, KV head) of (mean_j g_j - keep)^2, so every head's mean gate is driven to
the target keep fraction, the share of entries the hard press keeps at ratio 1 - keep. Only the gates
train (Adam); the model stays frozen. The gates of the step with the lowest validation KL (at the target
keep fraction reached: |mean gate - keep| <= 0.05, else the last) are saved.

`binarise` (default 0, the shipped gates' loss) adds binarise x mean_j 4 g_j (1 - g_j), the gates'
*softness* (1 when every gate is 1/2, 0 when every gate is 0 or 1): a remedy for the soft-to-hard gap we
chose because it changes nothing else. Hard eviction removes an entry outright; a soft gate of 0.3 still
lets the model read it, so the KL the soft gates reach is not the one eviction gets (docs/studies/gate.md).
Driving the gates to 0 or 1 makes the soft forward what eviction does: with every head's mean gate at the
keep fraction, its gates of 1 are the entries the hard press keeps. The term's gradient is 0 at g = 1/2,
so from the uniform start it sharpens whatever ranking the KL makes rather than choosing one. The saved
step is the one of lowest validation KL + binarise x softness (the loss less its sparsity term; with
binarise 0 the KL alone, as before). Validation also reports the *rounded KL*: the KL with every head's gates
rounded (its top keep fraction of the text's entries at 1, the rest at 0, `RoundedGates`), the soft
forward's view of eviction, so the gap shows in training.

The data: texts of the live-cache protocol's generators (kvbench.harness.perplexity.generated_texts), by
default the standard library's source ("code") at seeds >= 10000 for training and validation, so that the
held-out texts of the study (Python reference prose, seeds 0..999) are of a source the gates never saw. The
shared data store (kvbench.learned.common.datagen) holds the context's keys and values but not its token ids,
so the soft forward over the context, which needs the ids, cannot be run from it: the gates read text instead.
"""

import math
import time
from dataclasses import asdict

import torch
import torch.nn.functional as F

from kvbench.learned.gate.config import TrainConfig  # noqa: F401 (this module's API)
from kvbench.learned.gate.gates import GateSet, soft_gates

TRAIN_SEED, VAL_SEED = 10_000, 20_000  # evaluation texts use seeds 0..999


class GateTap:
    """The gates, remembering every layer's mean gate and softness of the last forward (for the loss)."""

    def __init__(self, gates: GateSet):
        self.gates, self.seen, self.softness = gates, [], []

    def log_gates(self, layer, keys, values):
        log_g = self.gates.log_gates(layer, keys, values)
        g = log_g.exp()
        self.seen.append(g.mean(dim=(0, 2)))  # (kv_heads,) mean gate of the layer
        self.softness.append((4 * g * (1 - g)).mean())
        return log_g


class RoundedGates:
    """The gates rounded per head: log g = 0 on the top ceil(keep x entries) by gate, -inf on the rest
    (each query still sees itself: gates.gate_bias leaves the diagonal at 0)."""

    def __init__(self, gates: GateSet, keep: float):
        self.gates, self.keep = gates, keep

    def log_gates(self, layer, keys, values):
        logits = self.gates.logits(layer, keys, values)
        kept = logits.topk(math.ceil(self.keep * logits.shape[-1]), dim=-1).indices
        rounded = torch.full_like(logits, float("-inf"))
        return rounded.scatter(-1, kept, 0.0)


def kl_and_gate_stats(model, gates: GateSet, ids: torch.Tensor, full_log_p: torch.Tensor | None = None):
    """(mean KL(p_full || p_gated) per position, mean gate per (layer, head) (layers, kv_heads), mean
    softness 4 g (1 - g) over every layer's gates)."""
    if full_log_p is None:
        with torch.no_grad():
            full_log_p = F.log_softmax(model(ids).logits.float(), dim=-1)
    tap = GateTap(gates)
    with soft_gates(model, tap):
        gated_log_p = F.log_softmax(model(ids).logits.float(), dim=-1)
    kl = F.kl_div(gated_log_p, full_log_p, log_target=True, reduction="none").sum(-1).mean()
    return kl, torch.stack(tap.seen), torch.stack(tap.softness).mean()


def validate(model, gates: GateSet, texts, keep: float) -> dict:
    kls, rounded_kls, means, softness = [], [], [], []
    with torch.no_grad():
        for ids in texts:
            ids = ids.to(model.device)
            full_log_p = F.log_softmax(model(ids).logits.float(), dim=-1)
            kl, mean_gate, soft = kl_and_gate_stats(model, gates, ids, full_log_p)
            rounded_kl, _, _ = kl_and_gate_stats(model, RoundedGates(gates, keep), ids, full_log_p)
            kls.append(float(kl))
            rounded_kls.append(float(rounded_kl))
            means.append(mean_gate)
            softness.append(float(soft))
    mean_gate = torch.stack(means).mean(0)
    return {
        "kl": sum(kls) / len(kls),
        "rounded_kl": sum(rounded_kls) / len(rounded_kls),
        "mean_gate": float(mean_gate.mean()),
        "gate_gap": float((mean_gate - keep).abs().max()),
        "softness": sum(softness) / len(softness),
    }


def train(model, config: TrainConfig, texts, log=print):
    """Trained gates, and the card's fields (training, data, validation). `texts`: (train, val) lists of
    (1, length) token ids: the command makes them from the live-cache protocol's generators, at TRAIN_SEED
    and VAL_SEED (layer 6 may import kvbench.harness.perplexity; this module may not); tests give random
    ids."""
    from kvbench.learned.common import model_shape

    torch.manual_seed(config.seed)
    model.requires_grad_(False)
    shape = model_shape(model)
    gates = GateSet(shape.num_layers, shape.num_kv_heads, shape.head_dim, config.keep).to(model.device)
    train_texts, val_texts = texts
    optimizer = torch.optim.Adam(gates.parameters(), lr=config.lr)
    start = time.perf_counter()
    initial = validate(model, gates, val_texts, config.keep)
    log(
        f"step 0: val KL {initial['kl']:.4f} (rounded {initial['rounded_kl']:.4f}), mean gate "
        f"{initial['mean_gate']:.3f}, softness {initial['softness']:.3f}"
    )
    best, best_state, history = None, None, [{"step": 0, **initial}]
    for step in range(1, config.steps + 1):
        ids = train_texts[(step - 1) % len(train_texts)].to(model.device)
        kl, mean_gate, softness = kl_and_gate_stats(model, gates, ids)
        sparsity = ((mean_gate - config.keep) ** 2).mean()
        loss = kl + config.sparsity * sparsity + config.binarise * softness
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % config.eval_every == 0 or step == config.steps:
            result = validate(model, gates, val_texts, config.keep)
            history.append({"step": step, **result, "train_kl": kl.item()})
            log(
                f"step {step}: train KL {kl.item():.4f}, val KL {result['kl']:.4f} (rounded "
                f"{result['rounded_kl']:.4f}), mean gate "
                f"{result['mean_gate']:.3f} (worst head off by {result['gate_gap']:.3f}), softness "
                f"{result['softness']:.3f}, {time.perf_counter() - start:.0f} s"
            )
            on_target = result["gate_gap"] <= 0.05
            objective = result["kl"] + config.binarise * result["softness"]
            if best is None or (on_target and (not best["on_target"] or objective < best["objective"])):
                best = {**result, "step": step, "on_target": on_target, "objective": objective}
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
            "rounded_kl": best["rounded_kl"],
            "mean_gate": best["mean_gate"],
            "worst_head_gate_gap": best["gate_gap"],
            "softness": best["softness"],
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
