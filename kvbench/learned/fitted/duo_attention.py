"""DuoAttention's head patterns (arXiv 2410.10819) fitted for any model, served to kvpress's
DuoAttentionPress, which otherwise downloads them from mit-han-lab's repository for a few models.

As kvpress's own calibration without a download (`duo_attention_on_the_fly` in
kvpress/presses/duo_attention_press.py, its "experimental" scoring; the paper's optimisation of gate values
is not reproduced): per context, the mean query and the mean key before RoPE of every head, each repeated
over `q_len` positions with RoPE applied; a head's score is the area under the cumulated attention of the
last position over them, averaged over the KV group's query heads and over the contexts. Sink and recent
windows are kvpress's there: 128 and 256 tokens. The press makes the heads of lowest score streaming heads,
as many as its `head_compression_ratio` asks.
"""

from dataclasses import dataclass

import torch
from kvpress import DuoAttentionPress
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from kvbench.bridge.adapter import language_model, query_states
from kvbench.learned.fitted.press import FittedState

SINK_SIZE, RECENT_SIZE = 128, 256  # kvpress's on-the-fly calibration's


def fit(model, tokenizer, contexts: list, options: dict) -> tuple[dict, dict]:
    """{"head_scores": (layers, kv_heads), "windows": (sink_size, recent_size)} and the score range."""
    q_len = options["q_len"]
    config = model.config
    groups = config.num_attention_heads // config.num_key_value_heads
    rotary = language_model(model).rotary_emb
    scores = torch.zeros(config.num_hidden_layers, config.num_key_value_heads, dtype=torch.float64)

    def add(layer, before, after, keys):
        q = before.mean(dim=1, keepdim=True).repeat(1, q_len, 1)[None]  # (1, heads, q_len, d)
        k = keys.mean(dim=1, keepdim=True).repeat(1, q_len, 1)[None]
        cos, sin = rotary(q, torch.arange(q_len)[None])
        q, k = apply_rotary_pos_emb(q, k, cos.double(), sin.double())
        k = k.repeat_interleave(groups, dim=1)
        weights = (q[:, :, -1:] @ k.transpose(2, 3) / q.shape[-1] ** 0.5).softmax(dim=-1).squeeze()
        area = torch.cumsum(weights, dim=1).mean(1)  # area under the cumulated attention curve
        scores[layer] += area.view(-1, groups).mean(1) / len(contexts)

    with torch.no_grad(), query_states(model, add):
        for ids in contexts:
            model(input_ids=ids.to(model.device), logits_to_keep=1)
    windows = torch.tensor([SINK_SIZE, RECENT_SIZE])
    return {"head_scores": scores.float(), "windows": windows}, {
        "score_min": round(float(scores.min()), 4),
        "score_max": round(float(scores.max()), 4),
    }


@dataclass
class FittedDuoAttentionPress(FittedState, DuoAttentionPress):
    """kvpress's DuoAttentionPress with its head patterns read from fitted state (`kvbench fit
    duo_attention`) through its own loader (`load_attention_pattern`).

    weights: folder holding state.safetensors + card.json; default presses/duo_attention/<model name>/.
    """

    method = "duo_attention"

    def install(self, tensors: dict, model) -> None:
        sink, recent = (int(size) for size in tensors["windows"])
        patterns = (sink, recent, tensors["head_scores"].double().numpy())
        self.load_attention_pattern = lambda model: patterns  # the loader kvpress's post_init calls
        DuoAttentionPress.post_init_from_model(self, model)
