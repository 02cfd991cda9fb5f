"""Shared fixtures: the embedded tokenizer/model and tiny random-init models saved as local folders."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from kvbench.models import load_model, load_tokenizer


@pytest.fixture(scope="session")
def embedded_tokenizer():
    return load_tokenizer()


@pytest.fixture(scope="session")
def embedded_model():
    return load_model()


def tiny_config(architecture: str, vocab_size: int):
    shape = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=vocab_size,
        head_dim=16,  # kvpress reads config.head_dim, which Qwen2Config does not define
        max_position_embeddings=8192,
        eos_token_id=2,
        pad_token_id=2,
        bos_token_id=None,
    )
    return LlamaConfig(**shape) if architecture == "llama" else Qwen2Config(**shape)


@pytest.fixture(scope="session", params=["llama", "qwen2"])
def tiny_model_dir(request, tmp_path_factory, embedded_tokenizer):
    """A random-init model with the embedded tokenizer, saved as a local folder (loadable by name)."""
    torch.manual_seed(0)
    config = tiny_config(request.param, len(embedded_tokenizer))
    model = (LlamaForCausalLM if request.param == "llama" else Qwen2ForCausalLM)(config)
    folder = tmp_path_factory.mktemp(f"tiny-{request.param}")
    model.save_pretrained(folder)
    embedded_tokenizer.save_pretrained(folder)
    return str(folder)
