"""Any GGUF file as a model (`--model path/to/model.gguf`): converted once into the kvbench cache, keyed by
the file's sha256, its special tokens as the file declares them, and scored like any model; a GGUF that
transformers cannot read, or a file that is no GGUF, is refused in one line before any work."""

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvbench.cli import main
from tests.bridge.tiny_gguf import ENDOFTEXT, IM_END, write_tiny_gguf

RUN = [
    "run",
    "--press",
    "knorm",
    "--ratio",
    "0.5",
    "--task",
    "niah_single_1",
    "--length",
    "2048",
    "--samples",
    "1",
]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KVBENCH_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def converted_folders(cache: Path) -> list[Path]:
    return sorted((cache / "models").iterdir()) if (cache / "models").is_dir() else []


@pytest.mark.parametrize("architecture", ["qwen2", "llama"])
def test_a_gguf_file_converts_once_keyed_by_its_digest_and_scores(tmp_path, cache, architecture):
    import hashlib

    import torch
    from safetensors.torch import load_file

    gguf = tmp_path / f"tiny-{architecture}.gguf"
    tensors = write_tiny_gguf(gguf, architecture)
    first = CliRunner().invoke(main, [*RUN, "--model", str(gguf), "--out", str(tmp_path / "a")])
    assert first.exit_code == 0, first.output
    assert "converting the GGUF" in first.stderr
    [folder] = converted_folders(cache)
    assert folder.name == f"gguf-{hashlib.sha256(gguf.read_bytes()).hexdigest()[:16]}"
    weights = load_file(folder / "model.safetensors")
    assert torch.equal(weights["model.embed_tokens.weight"], torch.from_numpy(tensors["token_embd.weight"]))
    rows = [json.loads(line) for line in (tmp_path / "a" / "rows.jsonl").read_text().splitlines()]
    assert {row["model"] for row in rows} == {str(gguf)} and {row["press"] for row in rows} == {"knorm"}
    [knorm] = rows
    assert 0 < knorm["kv_kept"] < knorm["kv_total"]

    second = CliRunner().invoke(main, [*RUN, "--model", str(gguf), "--out", str(tmp_path / "b")])
    assert second.exit_code == 0, second.output
    assert "converting" not in second.stderr and converted_folders(cache) == [folder]


@pytest.mark.parametrize("add_bos", [False, True])
def test_the_converted_tokenizer_takes_its_special_tokens_from_the_file(tmp_path, cache, add_bos):
    """transformers' own GGUF tokenizer gets them wrong for Qwen2.5's file (eos <|endoftext|>): generation
    would run past <|im_end|>. The file's tokenizer.ggml.* fields are the truth."""
    from kvbench.bridge.models import load_model

    gguf = tmp_path / "tiny.gguf"
    write_tiny_gguf(gguf, "qwen2", add_bos=add_bos)
    model, tokenizer = load_model(str(gguf))
    assert (tokenizer.eos_token_id, tokenizer.pad_token_id) == (IM_END, ENDOFTEXT)
    assert model.generation_config.eos_token_id == IM_END
    ids = tokenizer("hi the")["input_ids"]
    assert ids == [ENDOFTEXT, 104, 105, 256, 257] if add_bos else ids == [104, 105, 256, 257]
    assert tokenizer.decode(tokenizer("héllo <|im_end|>", add_special_tokens=False)["input_ids"]) == (
        "héllo <|im_end|>"
    )
    assert "<|im_start|>assistant" in tokenizer.apply_chat_template(
        [{"role": "user", "content": "x"}], add_generation_prompt=True, tokenize=False
    )


def gguf_of_architecture(path: Path, architecture: str) -> Path:
    """The tiny GGUF with its architecture renamed (the header's field and its keys rewritten)."""
    from gguf import GGUFReader, GGUFWriter

    source = tmp = path.with_suffix(".src.gguf")
    write_tiny_gguf(source, "llama")
    reader = GGUFReader(source)
    writer = GGUFWriter(str(path), architecture)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value, kind = field.contents(), field.types[0]
        sub = field.types[-1] if kind.name == "ARRAY" else None
        writer.add_key_value(key.replace("llama.", f"{architecture}."), value, kind, sub_type=sub)
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, tensor.data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.unlink(tmp)
    return path


@pytest.mark.parametrize(
    "make, message",
    [
        (
            lambda path: gguf_of_architecture(path, "rwkv6"),
            "transformers cannot read GGUF files of architecture",
        ),
        (lambda path: gguf_of_architecture(path, "mamba"), "has no attention KV cache to compress"),
        (lambda path: path.write_bytes(b"GGUF" + b"\0" * 12), "is not a GGUF file gguf can read"),
        (lambda path: path.write_text("not a model\n"), "is a file but not a GGUF"),
    ],
    ids=["unknown-architecture", "no-kv-cache", "truncated", "not-gguf"],
)
def test_a_gguf_that_cannot_be_a_model_is_refused_in_one_line_before_any_work(tmp_path, cache, make, message):
    path = tmp_path / "model.gguf"
    make(path)
    result = CliRunner().invoke(main, [*RUN, "--model", str(path), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert message in result.output and len(result.output.strip().splitlines()) == 1
    assert converted_folders(cache) == [] and not (tmp_path / "out").exists()
