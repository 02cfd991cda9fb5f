"""The gate press: soft gates (g = 1 is the ungated model, g = 0 removes the token), hard eviction by gate
rank with its bytes, training lowering the KL, and bad checkpoints refused in one line."""

import json

import pytest
import torch
from click.testing import CliRunner
from transformers import DynamicCache

from kvbench.cli import main
from kvbench.engine.steps import kv_counts
from kvbench.learned.common import TrainingFileError, model_shape
from kvbench.learned.gate.gates import GateSet, soft_gates
from kvbench.learned.gate.press import GatePress, load_gates, save_gates
from kvbench.learned.gate.train import RoundedGates, TrainConfig, train
from kvbench.presses import build_press

LENGTH = 16


class FixedGates:
    """log g given per entry (entries,), the same in every layer and head."""

    def __init__(self, log_g: torch.Tensor):
        self.log_g = log_g

    def log_gates(self, layer, keys, values):
        return self.log_g[: keys.shape[2]].to(keys.dtype).expand(keys.shape[0], keys.shape[1], -1)


@pytest.fixture
def model(tiny_model, one_thread):
    return tiny_model(initializer_range=0.1).double()


@pytest.fixture
def ids():
    return torch.randint(0, 128, (1, LENGTH), generator=torch.Generator().manual_seed(1))


def test_open_gates_are_the_ungated_model(model, ids):
    reference = model(ids).logits
    with soft_gates(model, FixedGates(torch.zeros(LENGTH, dtype=torch.float64))):
        fixed = model(ids).logits
    gates = GateSet(2, 2, 16).double()
    with torch.no_grad():
        gates.weight.normal_()
        gates.bias.fill_(1e4)  # sigmoid = 1, log g = 0 exactly
    with soft_gates(model, gates):
        learned = model(ids).logits
    torch.testing.assert_close(fixed, reference, rtol=0, atol=1e-12)
    torch.testing.assert_close(learned, reference, rtol=0, atol=1e-12)
    assert model.config._attn_implementation == "sdpa"  # restored after the block
    half = GateSet(2, 2, 16).double()  # gates of 0.5 do change the output: the bias is applied
    with soft_gates(model, half):
        assert (model(ids).logits - reference).abs().max() > 1e-3


@pytest.mark.parametrize("token", [0, 5, 11])
def test_a_closed_gate_removes_the_token(model, ids, token):
    log_g = torch.zeros(LENGTH, dtype=torch.float64)
    log_g[token] = float("-inf")
    with soft_gates(model, FixedGates(log_g)):
        soft = model(ids).logits
    # Reference: the token written to the cache, then its entry removed from every layer, then the rest read.
    cache = DynamicCache()
    head = model(ids[:, : token + 1], past_key_values=cache).logits
    for layer in cache.layers:
        layer.keys, layer.values = layer.keys[:, :, :token], layer.values[:, :, :token]
    positions = torch.arange(token + 1, LENGTH)[None]
    tail = model(ids[:, token + 1 :], past_key_values=cache, position_ids=positions).logits
    torch.testing.assert_close(soft, torch.cat([head, tail], dim=1), rtol=1e-10, atol=1e-10)


def random_gates(model, tmp_path, name=None):
    shape = model_shape(model)
    gates = GateSet(shape.num_layers, shape.num_kv_heads, shape.head_dim)
    with torch.no_grad():
        gates.weight.normal_(generator=torch.Generator().manual_seed(3))
    model_card = {**shape.__dict__, **({"name": name} if name else {})}
    save_gates(tmp_path, gates, {"model": model_card, "training": {}, "validation": {}})
    return gates


@pytest.mark.parametrize("ratio", [0.25, 0.5, 0.8])
def test_hard_eviction_keeps_the_top_gates_per_head(tiny_model, one_thread, ids, tmp_path, ratio):
    model = tiny_model(initializer_range=0.1)
    gates = random_gates(model, tmp_path)
    full = DynamicCache()
    model.model(input_ids=ids, past_key_values=full)
    press = build_press("gate", ratio, weights=str(tmp_path))
    compressed = DynamicCache()
    with press(model):
        model.model(input_ids=ids, past_key_values=compressed)
    kept = int(LENGTH * (1 - ratio))
    entries = 0
    for layer, (whole, small) in enumerate(zip(full.layers, compressed.layers, strict=True)):
        logits = gates.logits(layer, whole.keys, whole.values)  # (1, kv_heads, LENGTH)
        assert small.keys.shape[2] == kept
        for head in range(whole.keys.shape[1]):
            top = logits[0, head].topk(kept).indices.sort().values
            rows = [int((whole.keys[0, head] == key).all(-1).nonzero()) for key in small.keys[0, head]]
            assert sorted(rows) == top.tolist()
            in_order = small.values[0, head][torch.tensor(rows).argsort()]
            torch.testing.assert_close(in_order, whole.values[0, head][top])
        entries += small.keys.shape[1] * small.keys.shape[2]
    counts = kv_counts(model, LENGTH, (entries, None), press)
    assert counts["kv_kept"] == kept * 2 * 2
    assert counts["kv_bytes"] == kept * 2 * 2 * 2 * 16 * 2  # entries x (key + value) x head_dim x 2 bytes
    assert counts["kv_bytes"] / counts["kv_bytes_full"] == pytest.approx(kept / LENGTH)


def test_live_cache_perplexity_holds_the_gate_budget(tiny_model, one_thread, ids, tmp_path):
    from kvbench.harness.perplexity import Text, evaluate_text, perplexity_configs

    model = tiny_model(initializer_range=0.1)
    random_gates(model, tmp_path)
    configs = perplexity_configs("gate", budgets="6", every=4, press_args={"weights": str(tmp_path)})
    text = Text("random", "0", tuple(ids[0].tolist()))
    rows = evaluate_text(model, text, configs, 4, 8)
    assert rows[1]["kv_kept"] == 6 * 2 * 2 and rows[0]["kv_kept"] == LENGTH * 2 * 2
    assert rows[1]["nll"] != rows[0]["nll"]


def test_training_lowers_the_kl(model, tmp_path):
    generator = torch.Generator().manual_seed(2)
    texts = [torch.randint(0, 128, (1, 24), generator=generator) for _ in range(3)]
    config = TrainConfig(keep=0.5, steps=30, eval_every=10, lr=0.05, length=24)
    gates, card = train(model.float(), config, (texts, texts), log=lambda line: None)
    validation = card["validation"]
    assert validation["kl"] < 0.9 * validation["kl_ungated_start"]
    assert abs(validation["mean_gate"] - 0.5) < 0.05  # the sparsity term holds the keep fraction
    assert card["training"]["best_step"] > 0
    save_gates(tmp_path, gates, {**card, "model": {**card["model"], "name": "tiny"}})
    shown = CliRunner().invoke(main, ["gate", "report", str(tmp_path)])
    assert shown.exit_code == 0 and f"rounded {validation['rounded_kl']:.4f}" in shown.output


def test_the_softness_term_drives_gates_to_0_or_1(model):
    generator = torch.Generator().manual_seed(3)
    texts = [torch.randint(0, 128, (1, 24), generator=generator) for _ in range(3)]
    softness = {}
    for binarise in (0.0, 1.0):
        config = TrainConfig(keep=0.5, steps=30, eval_every=10, lr=0.2, length=24, binarise=binarise)
        _, card = train(model.float(), config, (texts, texts), log=lambda line: None)
        softness[binarise] = card["validation"]["softness"]
        assert abs(card["validation"]["mean_gate"] - 0.5) < 0.05  # still at the keep fraction
    assert softness[1.0] < 0.8 * softness[0.0] and softness[0.0] <= 1.0


def test_rounded_gates_keep_the_top_gates_per_head():
    gates = GateSet(1, 2, 4)
    with torch.no_grad():
        gates.weight.normal_(generator=torch.Generator().manual_seed(4))
    generator = torch.Generator().manual_seed(5)
    keys, values = torch.randn(1, 2, 9, 4, generator=generator), torch.randn(1, 2, 9, 4, generator=generator)
    logits = gates.logits(0, keys, values)
    log_g = RoundedGates(gates, keep=0.5).log_gates(0, keys, values)
    kept = log_g == 0
    assert kept.sum(-1).tolist() == [[5, 5]]  # ceil(0.5 x 9) per head, the rest -inf
    assert torch.isneginf(log_g[~kept]).all()
    assert logits[kept].view(2, 5).min(-1).values.gt(logits[~kept].view(2, 4).max(-1).values).all()


def write_checkpoint(tmp_path, model_dir, **model_fields):
    from kvbench.bridge.models import load_model

    model, _ = load_model(model_dir)
    shape = model_shape(model)
    gates = GateSet(shape.num_layers, shape.num_kv_heads, shape.head_dim)
    card = {"model": {**shape.__dict__, **model_fields}, "training": {}, "validation": {}}
    save_gates(tmp_path, gates, card)
    return shape


def perplexity_cli(model_dir, weights, out):
    args = [
        "perplexity",
        "--presses",
        "gate",
        "--budget",
        "8",
        "--length",
        "16",
        "--every",
        "4",
        "--texts",
        "1",
    ]
    args += ["--press-arg", f"weights={weights}", "--model", model_dir, "--out", str(out)]
    return CliRunner().invoke(main, args)


def test_bad_checkpoints_are_one_line_exit_2(tiny_llama_dir, tmp_path):
    shape = write_checkpoint(tmp_path / "other", tiny_llama_dir, name="some-other-model", identity="0" * 16)
    write_checkpoint(tmp_path / "shape", tiny_llama_dir, head_dim=shape.head_dim * 2)
    write_checkpoint(tmp_path / "weights", tiny_llama_dir)
    (tmp_path / "weights" / GatePress.state_file).write_bytes(b"not safetensors")
    write_checkpoint(tmp_path / "card", tiny_llama_dir)
    (tmp_path / "card" / "card.json").write_text("{not json")
    cases = {
        "other": "made for some-other-model",
        "shape": "made for",
        "weights": "is corrupt",
        "card": "is corrupt",
    }
    for folder, message in cases.items():
        result = perplexity_cli(tiny_llama_dir, tmp_path / folder, tmp_path / f"out-{folder}")
        assert result.exit_code == 2, (folder, result.output)
        assert message in result.output and len(result.output.strip().splitlines()) == 1, result.output
        assert not (tmp_path / f"out-{folder}" / "rows.jsonl").exists()
    with pytest.raises(TrainingFileError, match="no gate weights"):
        load_gates(tmp_path / "nowhere")
    card = json.loads((tmp_path / "other" / "card.json").read_text())
    assert card["method"] == "gate"
