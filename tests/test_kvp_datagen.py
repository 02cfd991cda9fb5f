import json

import pytest
import torch
from click.testing import CliRunner
from transformers import DynamicCache

from kvbench.cli import main
from kvbench.kvp.checkpoint import load_card
from kvbench.kvp.datagen import MANIFEST_FILE, capture_prompt
from kvbench.models import load_model
from kvbench.presses.kvp import KVPPress


def test_utility_is_the_teacher_forced_attention_of_the_later_queries(tiny_model):
    model = tiny_model(vocab_size=97, eos_token_id=1)
    context, question = list(range(3, 23)), [30, 31, 32]
    captured = capture_prompt(model, context, question, gen_tokens=5)
    assert len(captured["generated"]) == 5
    assert captured["keys"].shape == captured["values"].shape == (2, 2, 20, 16)

    # Reference: one eager pass over context + question + continuation, every query after the context.
    model.set_attn_implementation("eager")
    full = torch.tensor([context + question + captured["generated"]])
    with torch.no_grad():
        output = model(full, output_attentions=True, past_key_values=DynamicCache())
    for layer, attention in enumerate(output.attentions):
        later = attention[0, :, 20:, :20].reshape(2, 2, -1, 20)  # (kv heads, group, queries, P)
        torch.testing.assert_close(captured["utility"][layer], later.amax(dim=1).mean(dim=1))
        torch.testing.assert_close(
            captured["keys"][layer], output.past_key_values.layers[layer].keys[0, :, :20].half()
        )


@pytest.mark.parametrize("tiny_model_dir", ["llama"], indirect=True)
def test_datagen_train_report_and_run_end_to_end(tmp_path, tiny_model_dir):
    runner = CliRunner()
    data, agents = tmp_path / "data", tmp_path / "agents"
    datagen = [
        "kvp",
        "datagen",
        "--model",
        tiny_model_dir,
        "--out",
        str(data),
        "--tasks",
        "niah_single_1,niah_single_2",
    ]
    datagen += ["--length", "512", "--samples", "3", "--gen-tokens", "4", "--val-fraction", "0.34"]
    result = runner.invoke(main, datagen)
    assert result.exit_code == 0, result.output
    manifest = json.loads((data / MANIFEST_FILE).read_text())
    assert [s["split"] for s in manifest["shards"]] == ["val"] * 2 + ["train"] * 4
    assert [s["task"] for s in manifest["shards"]] == ["niah_single_1", "niah_single_2"] * 3
    assert {s["sample_id"] for s in manifest["shards"]} == {"10000-0", "10000-1", "10000-2"}

    # A rerun finds everything done; other settings in the same folder are refused.
    assert runner.invoke(main, datagen).exit_code == 0
    result = runner.invoke(main, [*datagen, "--seed", "20000"])
    assert result.exit_code == 2 and "other settings" in result.output

    train = ["kvp", "train", "--data", str(data), "--out", str(agents), "--steps", "6", "--eval-every", "3"]
    result = runner.invoke(main, [*train, "--rankings", "4", "--hidden", "8"])
    assert result.exit_code == 0, result.output
    assert "oracle -1.0000" in result.output
    assert load_card(agents)["heads"] == [0, 1, 2, 3]

    result = runner.invoke(main, ["kvp", "report", str(agents), "--plot", str(tmp_path / "kvp.png")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "kvp.png").stat().st_size > 0 and "recency" in result.output

    model, _ = load_model(tiny_model_dir)
    press = KVPPress(compression_ratio=0.5, agents=str(agents))
    cache = DynamicCache()
    with torch.no_grad(), press(model):
        model.model(input_ids=torch.arange(10, 110).unsqueeze(0), past_key_values=cache)
    assert [cache.get_seq_length(layer) for layer in range(2)] == [50, 50]
