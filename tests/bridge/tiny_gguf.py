"""A tiny random GGUF model written with the `gguf` library, as llama.cpp lays one out: a byte-level
BPE tokenizer of 261 tokens (the 256 bytes, two merges, three ChatML specials), a two-layer decoder."""

from pathlib import Path

import numpy as np
from gguf import GGUFWriter, TokenType

MERGES = ("Ġ t", "h e")
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
ENDOFTEXT, IM_START, IM_END = 258, 259, 260  # the specials' ids
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
HIDDEN, LAYERS, HEADS, KV_HEADS, FFN, CONTEXT = 32, 2, 4, 2, 64, 4096


def byte_tokens() -> list[str]:
    """The 256 byte-level tokens in byte order, as GPT-2's bytes_to_unicode names them."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    names, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            names[byte] = chr(byte)
        else:
            names[byte] = chr(256 + extra)
            extra += 1
    return [names[byte] for byte in range(256)]


def write_tiny_gguf(path: Path, architecture: str = "qwen2", seed: int = 0, add_bos: bool = False) -> dict:
    """Write the GGUF at `path`; returns its tensors by GGUF name (what a loader must give back)."""
    rng = np.random.default_rng(seed)
    tokens = byte_tokens() + [merge.replace(" ", "") for merge in MERGES] + list(SPECIALS)
    vocab = len(tokens)
    writer = GGUFWriter(str(path), architecture)
    writer.add_name(f"tiny random {architecture}")
    writer.add_block_count(LAYERS)
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_freq_base(10000.0)
    writer.add_rope_dimension_count(HIDDEN // HEADS)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_vocab_size(vocab)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types([TokenType.NORMAL] * (256 + len(MERGES)) + [TokenType.CONTROL] * len(SPECIALS))
    writer.add_token_merges(list(MERGES))
    writer.add_bos_token_id(ENDOFTEXT)  # as Qwen2.5's GGUFs declare it
    writer.add_eos_token_id(IM_END)
    writer.add_pad_token_id(ENDOFTEXT)
    writer.add_add_bos_token(add_bos)
    writer.add_chat_template(CHAT_TEMPLATE)
    head_dim = HIDDEN // HEADS
    shapes = {
        "token_embd.weight": (vocab, HIDDEN),
        "output_norm.weight": (HIDDEN,),
        "output.weight": (vocab, HIDDEN),
    }
    for layer in range(LAYERS):
        block = f"blk.{layer}"
        shapes |= {
            f"{block}.attn_norm.weight": (HIDDEN,),
            f"{block}.attn_q.weight": (HEADS * head_dim, HIDDEN),
            f"{block}.attn_k.weight": (KV_HEADS * head_dim, HIDDEN),
            f"{block}.attn_v.weight": (KV_HEADS * head_dim, HIDDEN),
            f"{block}.attn_output.weight": (HIDDEN, HEADS * head_dim),
            f"{block}.ffn_norm.weight": (HIDDEN,),
            f"{block}.ffn_gate.weight": (FFN, HIDDEN),
            f"{block}.ffn_up.weight": (FFN, HIDDEN),
            f"{block}.ffn_down.weight": (HIDDEN, FFN),
        }
        if architecture == "qwen2":
            shapes |= {
                f"{block}.attn_q.bias": (HEADS * head_dim,),
                f"{block}.attn_k.bias": (KV_HEADS * head_dim,),
                f"{block}.attn_v.bias": (KV_HEADS * head_dim,),
            }
    tensors = {
        name: (np.ones(shape) if name.endswith("norm.weight") else rng.normal(0, 0.2, shape)).astype(
            np.float32
        )
        for name, shape in shapes.items()
    }
    for name, tensor in tensors.items():
        writer.add_tensor(name, tensor)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return tensors
