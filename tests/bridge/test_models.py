import pytest
import torch

from kvbench.bridge.models import ModelNotFound, load_model, model_name, model_shape, read_tokenizer, resolve


@pytest.fixture(autouse=True)
def tokenizers_share_their_vocabulary():
    """Here `read_tokenizer`'s own copies are under test, not the suite's shared vocabulary (conftest)."""


def test_embedded_tokenizer_is_fixed(embedded_tokenizer, embedded_model):
    model, _ = embedded_model
    tok = embedded_tokenizer
    assert tok.eos_token == tok.pad_token == "<|im_end|>" and tok.eos_token_id == 2
    assert tok("hello world").input_ids == tok.encode("hello world", add_special_tokens=False)  # no BOS
    assert len(tok) == model.config.vocab_size == 49152
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "Hi"}], add_generation_prompt=True, return_dict=False
    )
    text = tok.decode(ids)
    assert text.startswith("<|im_start|>system\n") and text.endswith(
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert ids.count(1) == 3 and ids.count(2) == 2  # three turns opened, two closed, nothing prepended
    assert tok.decode(tok.encode(" Paris, France.")) == " Paris, France."


def test_embedded_generation_stops_at_end_of_turn(embedded_model):
    model, tok = embedded_model
    assert model.generation_config.eos_token_id == 2 and model_name(model) == "smollm2-135m"
    assert model_shape(model) == {"layers": 30, "heads": 9, "kv_heads": 3, "head_dim": 64}
    inputs = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France? One word."}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=40, do_sample=False)
    new = out[0, inputs["input_ids"].shape[1] :].tolist()
    assert new[-1] == 2 and len(new) < 40
    assert "Paris" in tok.decode(new, skip_special_tokens=True)


def test_local_folders_load_by_path(tiny_model_dir):
    model, tok = load_model(tiny_model_dir)
    assert model_name(model) == tiny_model_dir and tok.pad_token is not None


def test_a_folders_tokenizer_is_read_once_and_each_caller_gets_its_own(tmp_path, tiny_llama_dir):
    """A second read of unchanged files is a copy of the first (mutating one leaves the next as read); a
    changed file, or the same files in another folder, is read as it now is."""
    import shutil

    from transformers import AutoTokenizer

    first = read_tokenizer(tiny_llama_dir)
    first.pad_token, first.chat_template = "<|im_start|>", "mutated"
    second = read_tokenizer(tiny_llama_dir)
    fresh = AutoTokenizer.from_pretrained(tiny_llama_dir)
    assert second is not first and second._tokenizer is not first._tokenizer
    assert second.pad_token == fresh.pad_token
    assert second.chat_template == fresh.chat_template and second("a cat sat") == fresh("a cat sat")
    folder = tmp_path / "copy"
    shutil.copytree(tiny_llama_dir, folder)
    (folder / "chat_template.jinja").write_text("{{ 'edited' }}")
    edited = read_tokenizer(str(folder))
    assert edited.chat_template == "{{ 'edited' }}" and edited.name_or_path == str(folder)
    assert read_tokenizer(tiny_llama_dir).chat_template == fresh.chat_template


def test_unknown_models_fail_fast(monkeypatch):
    import kvbench.bridge.models as models

    with pytest.raises(ModelNotFound, match="unknown model"):
        resolve("no-such-model")
    monkeypatch.setattr(models, "hub_reachable", lambda timeout=3.0: False)
    with pytest.raises(ModelNotFound, match="not in the local Hugging Face cache"):
        resolve("nobody/no-such-model")
    with pytest.raises(ValueError, match="unknown dtype"):
        load_model("smollm2-135m", dtype="int3")


@pytest.mark.parametrize("keep", [0.5, 0.01, 0.999])
def test_a_weights_file_cut_short_is_one_line_naming_the_folder(tmp_path, tiny_llama_dir, keep):
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(tiny_llama_dir, folder)
    (weights,) = folder.glob("*.safetensors")
    data = weights.read_bytes()
    weights.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(ModelNotFound) as raised:
        load_model(str(folder))
    message = str(raised.value)
    assert f"a weights file in {folder} is damaged" in message and "\n" not in message, message
