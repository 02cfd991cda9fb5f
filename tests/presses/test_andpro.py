"""AnDPro against a plain-loop reference of the official scoring (per query head, chunk sums built
explicitly) and of AdaKV's global top-k over the heads x tokens of a layer."""

import math

import pytest
import torch
from kvpress import AdaKVPress
from kvpress.utils import compute_n_kept
from transformers import DynamicCache
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from kvbench.bridge.models import load_model
from kvbench.presses import build_press
from kvbench.presses.andpro import AnDProPress, projection_scores
from tests.conftest import prefill_into_cache


def reference_scores(attention, values, chunk, window):
    """One sequence: pooled attention (heads, window, length), values (kv heads, length, dim) -> token scores
    (kv heads, length), protected tokens as +inf. Written from the paper's definitions with plain loops."""
    heads, n_queries, length = attention.shape
    kv_heads, _, dim = values.shape
    group = heads // kv_heads
    n_chunks = math.ceil(length / chunk)
    protected = {0} | {c for c in range(n_chunks) if min((c + 1) * chunk, length) - 1 >= length - window}
    candidates = [c for c in range(n_chunks) if c not in protected]
    chunk_scores = torch.zeros(kv_heads, n_chunks, dtype=torch.float64)
    for h in range(heads):
        v = values[h // group].double()
        for i in range(n_queries):
            shares = torch.zeros(n_chunks, dim, dtype=torch.float64)  # U[i, c]
            for j in range(length):
                shares[j // chunk] += attention[h, i, j].double() * v[j]
            anchor = sum(shares[c] for c in candidates)  # o_i
            for c in range(n_chunks):
                chunk_scores[h // group, c] += torch.dot(shares[c], anchor)
    scores = torch.zeros(kv_heads, length, dtype=torch.float64)
    for j in range(length):
        scores[:, j] = math.inf if j // chunk in protected else chunk_scores[:, j // chunk]
    return scores


@pytest.mark.parametrize("length", [48, 50, 51])  # a multiple of the chunk size, and two that are not
def test_projection_scores_match_the_loop_reference(length):
    torch.manual_seed(0)
    heads, kv_heads, window, dim = 4, 2, 8, 6
    attention = torch.rand(2, heads, window, length).softmax(-1)
    values = torch.randn(2, kv_heads, length, dim)
    scores = projection_scores(attention, values, chunk_size=4, window_size=window)
    for row in range(2):
        expected = reference_scores(attention[row], values[row], 4, window)
        protected = expected.isinf()
        assert (scores[row][protected] == torch.finfo(scores.dtype).max).all()
        assert torch.allclose(scores[row][~protected].double(), expected[~protected], rtol=1e-4, atol=1e-6)
    # The whole window and the first chunk are protected, nothing else.
    protected = (scores[0] == torch.finfo(scores.dtype).max)[0]
    assert protected[:4].all() and protected[-window:].all() and not protected[4 : length - window - 3].any()


def reference_pooled_attention(module, hidden_states, keys, position_embeddings, window, kernel):
    """Window attention written out: post-RoPE queries, causal softmax, max over a kernel of keys."""
    batch, length, _ = hidden_states.shape
    heads, dim = module.config.num_attention_heads, module.head_dim
    queries = module.q_proj(hidden_states).view(batch, length, heads, dim).transpose(1, 2)
    cos, sin = position_embeddings
    queries, _ = apply_rotary_pos_emb(queries, queries, cos, sin)
    queries = queries[:, :, -window:].double()
    keys = keys.double().repeat_interleave(heads // keys.shape[1], dim=1)
    logits = queries @ keys.transpose(2, 3) / math.sqrt(dim)
    for i in range(window):
        logits[:, :, i, length - window + i + 1 :] = -math.inf
    attention = logits.softmax(-1)
    pooled = torch.empty_like(attention)
    for j in range(length):
        pooled[..., j] = attention[..., max(0, j - kernel // 2) : j + kernel // 2 + 1].amax(-1)
    return pooled


def capture_layer(model, layer_idx=0):
    """Hook that records what a layer's press receives (registered before the press's, so runs first)."""
    seen = {}

    def hook(module, args, kwargs, output):
        layer = kwargs["past_key_values"].layers[layer_idx]
        seen.update(
            module=module,
            hidden_states=kwargs["hidden_states"],
            position_embeddings=kwargs["position_embeddings"],
            keys=layer.keys.clone(),
            values=layer.values.clone(),
        )

    attention = model.model.layers[layer_idx].self_attn
    return seen, attention.register_forward_hook(hook, with_kwargs=True)


def test_andpro_keeps_the_global_top_k_of_the_reference_scores(tiny_model_dir):
    model, _ = load_model(tiny_model_dir)
    press = build_press("andpro", 0.5)
    assert isinstance(press, AdaKVPress) and press.alpha_safeguard == 0
    assert isinstance(press.press, AnDProPress) and press.compression_ratio == 0.5
    torch.manual_seed(0)
    ids = torch.randint(3, 1000, (1, 122))
    seen, handle = capture_layer(model)
    try:
        with press(model):
            model.model(input_ids=ids, past_key_values=DynamicCache())
    finally:
        handle.remove()
    module = seen["module"]
    pooled = reference_pooled_attention(
        module, seen["hidden_states"], seen["keys"], seen["position_embeddings"], 32, 7
    )
    expected = reference_scores(pooled[0], seen["values"][0], 4, 32)  # (kv heads, length)
    kv_heads, length = expected.shape
    n_kept = compute_n_kept(length, 0.5)
    threshold = expected.flatten().topk(kv_heads * n_kept).values[-1]

    kept = torch.ones(kv_heads, length, dtype=torch.bool)
    _, head_indices, seq_indices = module.masked_key_indices
    kept[head_indices, seq_indices] = False
    assert kept.sum() == kv_heads * n_kept  # the layer's budget, shared by its heads
    assert kept[expected > threshold].all() and not kept[expected < threshold].any()
    assert kept[:, :4].all() and kept[:, -32:].all()  # sinks chunk and window


def test_andpro_changes_what_the_next_token_sees(tiny_model_dir):
    model, _ = load_model(tiny_model_dir)
    torch.manual_seed(1)
    ids = torch.randint(3, 1000, (1, 120))
    logits = []
    for press in (None, build_press("andpro", 0.75)):
        cache = prefill_into_cache(model, press, ids)
        logits.append(model(input_ids=ids[:, -1:], past_key_values=cache).logits)
    for layer in model.model.layers:
        layer.self_attn.masked_key_indices = None
    assert not torch.allclose(logits[0], logits[1])


@pytest.mark.parametrize(
    "args", [dict(window_size=0), dict(chunk_size=0), dict(kernel_size=6), dict(no_such_arg=1)]
)
def test_bad_andpro_arguments_are_one_line_errors(args):
    with pytest.raises(ValueError) as info:
        build_press("andpro", 0.5, **args)
    assert "\n" not in str(info.value)


def test_andpro_refuses_a_prompt_no_longer_than_its_window(tiny_model_dir):
    model, _ = load_model(tiny_model_dir)
    with pytest.raises(ValueError, match="window") as info, build_press("andpro", 0.5)(model):
        model.model(input_ids=torch.randint(3, 1000, (1, 20)), past_key_values=DynamicCache())
    assert "\n" not in str(info.value)
