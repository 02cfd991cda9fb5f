"""Fast KVzip (arXiv 2601.17668) fitted for any model: one gate per layer, kvpress's FastKVzipGate (low-rank
sink attention: q_proj (hidden_size -> kv_heads * group * dim, bias), k_proj (hidden_size -> kv_heads *
dim), q_norm and k_norm (dim), k_base (kv_heads, 1, sink, dim), b (kv_heads, 1, group)), the shapes of the
published `Jang-Hyun/Fast-KVzip` `q<group>_dim16_sink16` gates, served to kvpress's FastKVzipPress.

As the authors' code (Janghyun1230/FastKVzip: prefill/feature.py, optim.py, utils.py, load_data.py): the
gate reads the attention's input hidden state of each context token and is trained to output the token's
KVzip score in each KV head (the most attention any query of the request to repeat the context, and the
repeated context, pays it, over the KV group's query heads: kvbench's reconstruction score) with binary
cross-entropy (utils.loss_fn "cnt": mean over tokens, sum over heads, sum over layers), SGD with momentum
0.9 at lr 0.2 under utils.lr_schedule (1 % warm-up, halved at 50 %, quartered at 75 %), batches of 1000
tokens reshuffled every pass, every 100th token held out (load_data.split_fn). The gate trained is
kvpress's own module, so what is served is what was trained (optim.py's training gate adds `b` twice,
kvpress's once).
"""

from dataclasses import dataclass

import torch
from kvpress import FastKVzipPress
from kvpress.presses.fastkvzip_press import FastKVzipGate
from transformers import DynamicCache

from kvbench.bridge.adapter import attention_hooks
from kvbench.learned.common.datagen import reconstruction_prompt_ids, reconstruction_score
from kvbench.learned.fitted.press import FittedState


def kvzip_targets(model, context_ids: torch.Tensor, repeat_ids: list[int]):
    """(attention inputs (layers, P, hidden_size), KVzip scores (layers, kv_heads, P)) of the P context
    tokens: the context prefilled, then KVzip's reconstruction pass (repeat_ids + the context) on its
    cache."""
    cache, hidden = DynamicCache(), {}

    def capture(module, args, kwargs, output):
        hidden[module.layer_idx] = kwargs["hidden_states"][0].float().cpu()

    with torch.no_grad():
        with attention_hooks(model, capture):
            model(input_ids=context_ids.to(model.device), past_key_values=cache, logits_to_keep=1)
        scores = reconstruction_score(model, cache, repeat_ids + context_ids[0].tolist())
    return torch.stack([hidden[i] for i in sorted(hidden)]), scores


def gates_for(layers: int, hidden_size: int, kv_heads: int, group: int, dim: int, sink: int, dtype):
    return torch.nn.ModuleList(
        FastKVzipGate(i, hidden_size, kv_heads, group, dtype, dim, sink) for i in range(layers)
    )


def learning_rate_factor(step: int, steps: int) -> float:
    """utils.lr_schedule of the authors' code."""
    if step < 0.01 * steps:
        return 0.01 * step
    if step >= 0.75 * steps:
        return 0.25
    return 0.5 if step >= 0.5 * steps else 1.0


def gate_loss(gate, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """utils.loss_fn "cnt": binary cross-entropy of the gate's scores on x (N, hidden) against y (kv_heads,
    N), mean over tokens, summed over heads."""
    predicted = gate(x[None])[0]  # (kv_heads, N)
    return torch.nn.functional.binary_cross_entropy(predicted, y, reduction="none").mean(-1).sum()


def fit(model, tokenizer, contexts: list, options: dict) -> tuple[dict, dict]:
    """Each layer's gate ("layers.<i>.q_proj.weight", ...) and its fit on the held-out tokens."""
    repeat = reconstruction_prompt_ids(tokenizer)
    pairs = [kvzip_targets(model, ids, repeat) for ids in contexts]
    x = torch.cat([hidden for hidden, _ in pairs], dim=1)  # (layers, N, hidden)
    y = torch.cat([scores for _, scores in pairs], dim=2).clamp(0, 1)  # (layers, kv_heads, N)
    held = (torch.arange(x.shape[1]) + 1) % 100 == 0
    x_train, y_train, x_test, y_test = x[:, ~held], y[..., ~held], x[:, held], y[..., held]
    config = model.config
    kv_heads = config.num_key_value_heads
    torch.manual_seed(options["seed"])
    gates = gates_for(
        x.shape[0],
        x.shape[2],
        kv_heads,
        config.num_attention_heads // kv_heads,
        options["dim"],
        options["sink"],
        torch.float32,
    )
    optimizer = torch.optim.SGD(gates.parameters(), lr=options["lr"], momentum=0.9)
    n, batch, steps = x_train.shape[1], options["batch_size"], options["steps"]
    passes = max(1, n // batch)
    for step in range(steps):
        if step % passes == 0:
            order = torch.randperm(n)
        rows = order[(step % passes) * batch : (step % passes + 1) * batch]
        loss = sum(gate_loss(gate, x_train[i, rows], y_train[i][:, rows]) for i, gate in enumerate(gates))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        for group in optimizer.param_groups:
            group["lr"] = options["lr"] * learning_rate_factor(step, steps)
        optimizer.step()
    validation = {"train_tokens": int(n), "held_out_tokens": int(held.sum())}
    if held.any():
        validation.update(held_out(gates, x_test, y_test))
    tensors = {f"layers.{key}": value for key, value in gates.state_dict().items()}
    return tensors, validation


def held_out(gates, x: torch.Tensor, y: torch.Tensor) -> dict:
    """The gates' loss and the authors' accuracy (gate and target on the same side of 0.05) on x, y, means
    over layers."""
    with torch.no_grad():
        losses = [float(gate_loss(gate, x[i], y[i])) for i, gate in enumerate(gates)]
        agree = [
            float(((gate(x[i][None])[0] >= 0.05) == (y[i] >= 0.05)).float().mean())
            for i, gate in enumerate(gates)
        ]
    return {
        "held_out_loss": round(sum(losses) / len(losses), 4),
        "held_out_accuracy": round(sum(agree) / len(agree), 4),
    }


def gate_states(tensors: dict) -> list[dict]:
    """The fitted tensors as the published file's "module" list: one state dict per layer."""
    layers = sorted({int(key.split(".")[1]) for key in tensors})
    return [
        {key.split(".", 2)[2]: value for key, value in tensors.items() if key.split(".")[1] == str(layer)}
        for layer in layers
    ]


@dataclass
class FittedFastKVzipPress(FittedState, FastKVzipPress):
    """kvpress's FastKVzipPress with its gates read from fitted state (`kvbench fit fastkvzip`).

    weights: folder holding state.safetensors + card.json; default presses/fastkvzip/<model name>/.
    """

    method = "fastkvzip"

    def install(self, tensors: dict, model) -> None:
        """The gates as kvpress's load_fastkvzip builds them from a published file, their projections in the
        model's dtype; the sink keys and norms in float32 as there, or in the model's dtype where it is
        wider (float32 sink keys cannot multiply float64 queries)."""
        gates: list[torch.nn.Module] = []
        for index, state in enumerate(gate_states(tensors)):
            dim = state["q_norm.weight"].shape[-1]
            kv_heads, _, sink, _ = state["k_base"].shape
            group = state["q_proj.weight"].shape[0] // state["k_proj.weight"].shape[0]
            gate = FastKVzipGate(
                index, state["q_proj.weight"].shape[1], kv_heads, group, model.dtype, dim, sink
            )
            gate.load_state_dict(state)
            if model.dtype.itemsize > 4:
                gate = gate.to(model.dtype)
            gates.append(gate.to(model.device))
        self.gates = gates
