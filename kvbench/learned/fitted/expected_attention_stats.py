"""Expected attention's query statistics fitted for any model, served to kvpress's
ExpectedAttentionStatsPress, which otherwise reads them from a hub dataset (`alessiodevoto/exp_att_stats_*`).

As kvpress's own collector (`collect_queries` in kvpress/presses/expected_attention_with_stats.py): the
queries before RoPE of every layer and query head over the fitting contexts, the first `n_sink` tokens of
each context left out; their mean (layers, heads, head_dim) and covariance (layers, heads, head_dim,
head_dim, divided by N - 1), accumulated as sums rather than held. With the option `bfloat16` they are
stored in bfloat16, half the size: the precision of kvpress's collector, which runs the model in bfloat16;
the press casts them to the model's dtype whatever they are stored in.
"""

from dataclasses import dataclass

import torch
from kvpress import ExpectedAttentionStatsPress

from kvbench.bridge.adapter import query_states
from kvbench.learned.fitted.press import FittedState


def fit(model, tokenizer, contexts: list, options: dict) -> tuple[dict, dict]:
    """{"query_mean": (layers, heads, d), "query_cov": (layers, heads, d, d)}, float32 or with
    options["bfloat16"] bfloat16, and the count of queries."""
    n_sink = options["n_sink"]
    total, outer, count = {}, {}, {}

    def add(layer, before, after, keys):
        queries = before[:, n_sink:]  # (heads, tokens, d)
        total[layer] = total.get(layer, 0) + queries.sum(dim=1)
        outer[layer] = outer.get(layer, 0) + queries.transpose(1, 2) @ queries
        count[layer] = count.get(layer, 0) + queries.shape[1]

    with torch.no_grad(), query_states(model, add):
        for ids in contexts:
            model(input_ids=ids.to(model.device), logits_to_keep=1)
    layers = sorted(total)
    n = count[layers[0]]
    mean = torch.stack([total[layer] / n for layer in layers])
    cov = torch.stack(
        [
            (outer[layer] - n * mean[i, :, :, None] * mean[i, :, None, :]) / (n - 1)
            for i, layer in enumerate(layers)
        ]
    )
    dtype = torch.bfloat16 if options.get("bfloat16") else torch.float32
    return {"query_mean": mean.to(dtype), "query_cov": cov.to(dtype)}, {"queries": n}


@dataclass
class FittedExpectedAttentionStatsPress(FittedState, ExpectedAttentionStatsPress):
    """kvpress's ExpectedAttentionStatsPress with its query statistics read from fitted state (`kvbench fit
    expected_attention_stats`); its own n_sink, n_future_positions, ... as kvpress's.

    weights: folder holding state.safetensors + card.json; default presses/expected_attention_stats/<model>/.
    """

    method = "expected_attention_stats"

    def install(self, tensors: dict, model) -> None:
        self.mu = tensors["query_mean"].to(model.device, dtype=model.dtype)
        self.cov = tensors["query_cov"].to(model.device, dtype=model.dtype)
