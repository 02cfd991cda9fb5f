"""KVzap (arXiv 2601.07891) fitted for any model: per-layer surrogates from the attention's input hidden
state to the KVzip+ score of the token's entry in each KV head, linear (hidden_size -> kv_heads) and
2-layer MLP (hidden_size -> hidden_dim -> kv_heads), the shapes of the published `nvidia/KVzap-{linear,mlp}-*`
(kvpress's KVzapModel), served to kvpress's KVzapPress (`model_type` picks which).

As the authors' code (kvpress's kvzap/data.py and kvzap/train.py): one eager forward over the context,
KVzip's request to repeat it, and the context again; the target of context token j in a KV head is
log max over the repeated context's queries t and the group's query heads h of a[h, t, j] ||W_o,h v_j|| /
||x_t|| (x_t: the query token's attention input; the attention floored at float32's smallest normal so the
log is finite); `tokens` tokens a prompt sampled at random. The linear surrogate is ridge regression
(sklearn's Ridge: alpha 1, intercept), solved in closed form; the MLP is trained with AdamW, MSE, cosine
schedule, gradient norm clipped at 1, 5 % of the tokens for validation, as skorch there.
"""

import math
from dataclasses import dataclass

import torch
from kvpress import KVzapPress
from kvpress.presses.kvzap_press import KVzapConfig, KVzapModel
from transformers import DynamicCache

from kvbench.bridge import models
from kvbench.bridge.adapter import attention_hooks, attention_implementation
from kvbench.core.errors import TrainingFileError
from kvbench.learned.common.datagen import reconstruction_prompt_ids
from kvbench.learned.fitted.press import FittedState

TYPES = ("linear", "mlp")


def kvzip_plus_targets(model, context_ids: torch.Tensor, repeat_ids: list[int]):
    """(hidden states (layers, P, hidden_size), KVzip+ targets (layers, P, kv_heads)) of the P context
    tokens, from one eager forward over context + repeat_ids + context."""
    length = context_ids.shape[-1]
    ids = torch.cat([context_ids[0], torch.tensor(repeat_ids), context_ids[0]])[None].to(model.device)
    start = length + len(repeat_ids)  # the repeated context's first query
    kv_heads = model.config.num_key_value_heads
    cache = DynamicCache()
    hidden, targets = {}, {}

    def capture(module, args, kwargs, output):
        states = kwargs["hidden_states"][0].float()  # (T, hidden_size)
        weights = output[1][0, :, start:, :length].float()  # (heads, repeated queries, context)
        weights = weights / states[start:].norm(dim=-1)[None, :, None]
        values = cache.layers[module.layer_idx].values[0, :, :length].float()  # (kv_heads, P, d)
        heads, head_dim = weights.shape[0], values.shape[-1]
        values = values.repeat_interleave(heads // kv_heads, dim=0)  # repeat_kv
        w_o = module.o_proj.weight.float().T.reshape(heads, head_dim, -1)  # (heads, d, hidden_size)
        written = torch.einsum("hid,hti->htd", w_o, values).norm(dim=-1)  # ||W_o,h v_j||: (heads, P)
        scores = (weights * written[:, None, :]).amax(dim=1)  # max over the repeated queries
        scores = scores.reshape(kv_heads, -1, length).amax(dim=1)  # max over the KV group
        hidden[module.layer_idx] = states[:length].cpu()
        targets[module.layer_idx] = scores.clamp_min(torch.finfo(torch.float32).tiny).log().T.cpu()

    with torch.no_grad(), attention_hooks(model, capture), attention_implementation(model, "eager"):
        model(input_ids=ids, past_key_values=cache, logits_to_keep=1)
    layers = sorted(hidden)
    return torch.stack([hidden[i] for i in layers]), torch.stack([targets[i] for i in layers])


def ridge(x: torch.Tensor, y: torch.Tensor, alpha: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """sklearn's Ridge(alpha).fit(x, y): weight (outputs, inputs), intercept (outputs,), the intercept not
    penalised (x and y centred)."""
    x, y = x.double(), y.double()
    x_mean, y_mean = x.mean(dim=0), y.mean(dim=0)
    xc, yc = x - x_mean, y - y_mean
    weight = torch.linalg.solve(xc.T @ xc + alpha * torch.eye(x.shape[1], dtype=x.dtype), xc.T @ yc).T
    return weight, y_mean - weight @ x_mean


def surrogate(kind: str, n_layers: int, hidden_size: int, kv_heads: int, hidden_dim: int) -> KVzapModel:
    """kvpress's KVzapModel of `kind` for these sizes, as the published artefacts build it."""
    config = KVzapConfig(
        input_dim=hidden_size,
        output_dim=kv_heads,
        n_modules=n_layers,
        hidden_dim=hidden_dim if kind == "mlp" else None,
    )
    return KVzapModel(config)


def train_mlp(x, y, options: dict, seed: int) -> tuple[KVzapModel, float]:
    """The MLP surrogate trained as kvzap/train.py trains it; and its validation MSE."""
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    mlp = surrogate("mlp", x.shape[1], x.shape[2], y.shape[2], options["hidden_dim"]).float()
    order = torch.randperm(x.shape[0], generator=generator)
    n_val = max(1, math.ceil(0.05 * x.shape[0]))
    val, train = order[:n_val], order[n_val:]
    optimizer = torch.optim.AdamW(mlp.parameters(), lr=options["lr"])
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=options["epochs"])
    batch = options["batch_size"]
    for _ in range(options["epochs"]):
        shuffled = train[torch.randperm(len(train), generator=generator)]
        for start in range(0, len(shuffled), batch):
            rows = shuffled[start : start + batch]
            loss = torch.nn.functional.mse_loss(mlp(x[rows]), y[rows])
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(mlp.parameters(), 1.0)
            optimizer.step()
        schedule.step()
    with torch.no_grad():
        return mlp, float(torch.nn.functional.mse_loss(mlp(x[val]), y[val]))


def r_squared(predicted: torch.Tensor, target: torch.Tensor) -> float:
    """1 - residual / total sum of squares, over every (token, layer, head) of the held-out prompts."""
    return float(1 - ((predicted - target) ** 2).sum() / ((target - target.mean()) ** 2).sum())


def fit(model, tokenizer, contexts: list, options: dict) -> tuple[dict, dict]:
    """Both surrogates' tensors ("linear.layers.0.weight", ..., "mlp.layers.0.0.weight", ...) and their R^2
    on the held-out prompts (every tenth, at least one), KVzap's measure of fit."""
    repeat = reconstruction_prompt_ids(tokenizer)
    generator = torch.Generator().manual_seed(options["seed"])
    xs, ys, held_x, held_y = [], [], [], []
    for index, ids in enumerate(contexts):
        x, y = kvzip_plus_targets(model, ids, repeat)
        x, y = x.transpose(0, 1), y.transpose(0, 1)  # (P, layers, ...): the surrogate's batch first
        if index % 10 == 9 or (index == len(contexts) - 1 and not held_x):
            held_x.append(x)
            held_y.append(y)
            continue
        rows = torch.randperm(x.shape[0], generator=generator)[: options["tokens"]]
        xs.append(x[rows])
        ys.append(y[rows])
    x, y, hx, hy = torch.cat(xs), torch.cat(ys), torch.cat(held_x), torch.cat(held_y)
    n_layers, hidden_size, kv_heads = x.shape[1], x.shape[2], y.shape[2]
    linear = surrogate("linear", n_layers, hidden_size, kv_heads, 0).float()
    with torch.no_grad():
        for layer, module in enumerate(linear.layers):
            weight, bias = ridge(x[:, layer], y[:, layer], options["alpha"])
            module.weight.copy_(weight)
            module.bias.copy_(bias)
    mlp, val_mse = train_mlp(x, y, options, options["seed"])
    with torch.no_grad():
        validation = {
            "r2_linear": round(r_squared(linear(hx), hy), 4),
            "r2_mlp": round(r_squared(mlp(hx), hy), 4),
            "mlp_val_mse": round(val_mse, 4),
            "train_tokens": int(x.shape[0]),
            "held_out_tokens": int(hx.shape[0]),
        }
    tensors = {
        f"{kind}.{key}": value
        for kind, net in zip(TYPES, (linear, mlp), strict=True)
        for key, value in net.state_dict().items()
    }
    return tensors, validation


@dataclass
class FittedKVzapPress(FittedState, KVzapPress):
    """kvpress's KVzapPress (model_type "linear" or "mlp") with its surrogate read from fitted state
    (`kvbench fit kvzap`, which fits both).

    weights: folder holding state.safetensors + card.json; default presses/kvzap/<model name>/.
    """

    method = "kvzap"

    def install(self, tensors: dict, model) -> None:
        prefix = f"{self.model_type}."
        state = {key[len(prefix) :]: value for key, value in tensors.items() if key.startswith(prefix)}
        if not state:
            raise TrainingFileError(f"{self.weights or 'kvzap state'} holds no {self.model_type} surrogate")
        first = state["layers.0.weight" if self.model_type == "linear" else "layers.0.0.weight"]
        last = state["layers.0.weight" if self.model_type == "linear" else "layers.0.2.weight"]
        n_layers = len({key.split(".")[1] for key in state})
        hidden_dim = first.shape[0] if self.model_type == "mlp" else 0
        kvzap = surrogate(self.model_type, n_layers, first.shape[1], last.shape[0], hidden_dim)
        try:
            kvzap.load_state_dict(state)
        except RuntimeError as error:
            raise TrainingFileError(f"{self.weights or 'kvzap state'}: {models.first_line(error)}") from None
        self.kvzap_model = kvzap.to(model.device).eval()
        self.kvzap_model_name = f"{self.model_type}:{self.state_digest}"
