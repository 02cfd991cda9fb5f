"""GGUF files as models: what a file declares (read from its header), whether transformers can load it, and
its conversion, once, into a plain transformers folder.

transformers reads a GGUF with `from_pretrained(folder, gguf_file=...)` and dequantises it to float32; that
takes from seconds (135M parameters) to minutes (1.5B), so the result is saved once as safetensors under the
kvbench cache and later loads read that. The tokenizer transformers derives from a GGUF can get the special
tokens wrong (SmolLM2's: eos `<|im_start|>`, a prepended BOS, five tokens past the vocabulary; Qwen2.5's:
eos `<|endoftext|>`, so generation never stops at `<|im_end|>`): the conversion sets them from the file's
own `tokenizer.ggml.*` fields, which both files state correctly.
"""

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from kvbench.core.errors import ModelNotFound, WriteError

# Architectures transformers' GGUF loader renames before it looks them up (modeling_gguf_pytorch_utils).
RENAMED = {"qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe"}
NO_KV_CACHE = ("t5", "t5encoder", "umt5", "mamba")  # nothing for a press to compress


@dataclass(frozen=True)
class GgufInfo:
    """What a GGUF file's header declares, read without loading its tensors."""

    architecture: str
    context_length: int | None
    tokenizer_model: str | None  # gpt2 (byte-level BPE), llama (SentencePiece), ...
    bos_id: int | None
    eos_id: int | None
    pad_id: int | None
    unk_id: int | None
    add_bos: bool


def is_gguf(path: Path) -> bool:
    """Whether `path` is a file that starts as a GGUF does (its magic), whatever its name."""
    try:
        with path.open("rb") as file:
            return file.read(4) == b"GGUF"
    except OSError:
        return False


def read_info(path: Path) -> GgufInfo:
    """The header fields kvbench needs; ModelNotFound in one line for a file gguf cannot parse."""
    from gguf import GGUFReader

    try:
        fields = GGUFReader(path).fields
    except Exception as error:  # gguf raises ValueError, struct.error, IndexError... on a damaged header
        raise ModelNotFound(
            f"{path} is not a GGUF file gguf can read ({type(error).__name__}: {error})"
        ) from None

    def value(key: str):
        field = fields.get(key)
        return None if field is None else field.contents()

    architecture = value("general.architecture")
    if not isinstance(architecture, str):
        raise ModelNotFound(f"{path} declares no general.architecture: not a model GGUF")
    return GgufInfo(
        architecture=architecture,
        context_length=value(f"{architecture}.context_length"),
        tokenizer_model=value("tokenizer.ggml.model"),
        bos_id=value("tokenizer.ggml.bos_token_id"),
        eos_id=value("tokenizer.ggml.eos_token_id"),
        pad_id=value("tokenizer.ggml.padding_token_id"),
        unk_id=value("tokenizer.ggml.unknown_token_id"),
        add_bos=bool(value("tokenizer.ggml.add_bos_token")),
    )


def check_loadable(path: Path, info: GgufInfo) -> None:
    """Refuse, in one line and before any work, a GGUF that transformers cannot load as a causal LM with a
    KV cache: an architecture its GGUF loader does not read, or one with no attention cache."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    supported = sorted(set(GGUF_SUPPORTED_ARCHITECTURES) - {"general", "tokenizer"} - set(NO_KV_CACHE))
    if info.architecture in NO_KV_CACHE:
        raise ModelNotFound(
            f"{path}: architecture {info.architecture!r} has no attention KV cache to compress"
        )
    if info.architecture not in supported and RENAMED.get(info.architecture) not in supported:
        raise ModelNotFound(
            f"{path}: transformers cannot read GGUF files of architecture {info.architecture!r} "
            f"(it reads {', '.join(supported)})"
        )
    if info.tokenizer_model is None:
        raise ModelNotFound(f"{path} carries no tokenizer (tokenizer.ggml.model): kvbench needs one")


def tokenizer_from_gguf(gguf_tokenizer, info: GgufInfo, vocab_size: int):
    """The tokenizer transformers derived from a GGUF, its special tokens set as the file declares them.

    A byte-level BPE (`gpt2`) tokenizer is rebuilt: nothing past `vocab_size`, a BOS prepended only where the
    file asks (`add_bos_token`), byte-level decoding. Others keep their pipeline; their special tokens are
    set from the file the same way.
    """
    import json

    from tokenizers import Tokenizer, decoders, processors
    from transformers import PreTrainedTokenizerFast

    def token(token_id: int | None) -> str | None:
        return None if token_id is None else gguf_tokenizer.convert_ids_to_tokens(token_id)

    backend = gguf_tokenizer.backend_tokenizer
    if info.tokenizer_model == "gpt2":
        spec = json.loads(backend.to_str())
        spec["added_tokens"] = [t for t in spec["added_tokens"] if t["id"] < vocab_size]
        backend = Tokenizer.from_str(json.dumps(spec))
        bos = token(info.bos_id)
        if info.add_bos and bos is not None:
            backend.post_processor = processors.Sequence(
                [
                    processors.ByteLevel(trim_offsets=False),
                    processors.TemplateProcessing(
                        single=f"{bos} $A", pair=f"{bos} $A $B", special_tokens=[(bos, info.bos_id)]
                    ),
                ]
            )
        else:
            backend.post_processor = processors.ByteLevel(trim_offsets=False)
        backend.decoder = decoders.ByteLevel()
    eos = token(info.eos_id) or gguf_tokenizer.eos_token
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=token(info.bos_id),
        eos_token=eos,
        pad_token=token(info.pad_id) or eos,
        unk_token=token(info.unk_id) or gguf_tokenizer.unk_token,
        chat_template=gguf_tokenizer.chat_template,
        model_max_length=info.context_length or int(1e30),
        clean_up_tokenization_spaces=False,
    )


def is_converted(folder: Path) -> bool:
    return (folder / "config.json").is_file() and (folder / "tokenizer.json").is_file()


def convert(gguf: Path, folder: Path, what: str) -> None:
    """Dequantise `gguf` to a float32 transformers folder at `folder`: written under a temporary name and
    renamed last, so that a killed conversion never leaves a folder that looks complete. WriteError in one
    line on a full disk or a file size limit."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # its bars per tensor and shard: 80 KB of stderr
    info = read_info(gguf)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    gguf_tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tokenizer = tokenizer_from_gguf(gguf_tokenizer, info, model.config.vocab_size)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = None
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        folder.parent.mkdir(parents=True, exist_ok=True)
        if folder.exists():
            shutil.rmtree(folder)
        tmp.rename(folder)
    except Exception as error:  # a full disk, a file size limit: safetensors says so in its own type
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(error, OSError) or type(error).__name__ == "SafetensorError":
            text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise WriteError(f"cannot write {what}'s converted copy to {folder}: {text}") from None
        raise
