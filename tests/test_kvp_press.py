import contextlib

import pytest
import torch
from kvpress import AdaKVPress
from transformers import DynamicCache

from kvbench.learned.kvp.agent import KVPAgents
from kvbench.learned.kvp.checkpoint import KVPAgentsError, model_shape, save_agents
from kvbench.learned.kvp.press import KVPPress
from kvbench.presses import build_press, press_state


def random_agents(model, directory, **card_changes) -> KVPAgents:
    """Agents with random (non-zero) output layers, saved with a card for `model`, edited by card_changes."""
    shape = model_shape(model)
    agents = KVPAgents(shape.num_heads, shape.head_dim, hidden=16)
    torch.nn.init.normal_(agents.w3)
    card = {"model": {**vars(shape), **card_changes}, "heads": list(range(shape.num_heads))}
    save_agents(directory, agents, card)
    return agents


def prefill(model, input_ids, press=None) -> DynamicCache:
    cache = DynamicCache()
    with torch.no_grad(), press(model) if press else contextlib.nullcontext():
        model.model(input_ids=input_ids, past_key_values=cache)
    return cache


def test_press_keeps_exactly_the_top_scored_entries_of_each_head(tmp_path, tiny_model):
    model = tiny_model()
    agents = random_agents(model, tmp_path)
    input_ids = torch.randint(0, 128, (1, 37))
    full = prefill(model, input_ids)
    compressed = prefill(model, input_ids, KVPPress(compression_ratio=0.4, agents=str(tmp_path)))
    n_kept = int(37 * (1 - 0.4))
    for layer in range(2):
        keys, values = full.layers[layer].keys, full.layers[layer].values
        scores = agents(keys, values, heads=slice(2 * layer, 2 * layer + 2))
        top = scores.topk(n_kept, dim=-1).indices.unsqueeze(-1).expand(-1, -1, -1, keys.shape[-1])
        assert compressed.layers[layer].keys.shape == (1, 2, n_kept, 16)
        torch.testing.assert_close(compressed.layers[layer].keys, keys.gather(2, top))
        torch.testing.assert_close(compressed.layers[layer].values, values.gather(2, top))


def test_a_recent_window_keeps_the_last_tokens_and_the_agents_top_picks_before_them(tmp_path, tiny_model):
    model = tiny_model()
    agents = random_agents(model, tmp_path)
    input_ids = torch.randint(0, 128, (1, 40))
    full = prefill(model, input_ids)
    press = KVPPress(compression_ratio=0.5, agents=str(tmp_path), recent_fraction=0.25)
    compressed = prefill(model, input_ids, press)
    n_kept, window = 20, 5  # int(40 * 0.5), int(0.25 * 20)
    for layer in range(2):
        keys = full.layers[layer].keys
        scores = agents(keys, full.layers[layer].values, heads=slice(2 * layer, 2 * layer + 2))
        for head in range(2):
            picked = scores[0, head, : 40 - window].topk(n_kept - window).indices.tolist()
            kept = compressed.layers[layer].keys[0, head]
            positions = (kept[:, None] == keys[0, head][None]).all(-1).nonzero()[:, 1]
            assert sorted(positions.tolist()) == sorted(picked) + list(range(40 - window, 40))
    # Without it, the press is the paper's: some of the last tokens go.
    plain = prefill(model, input_ids, KVPPress(compression_ratio=0.5, agents=str(tmp_path)))
    assert not torch.equal(plain.layers[0].keys, compressed.layers[0].keys)


@pytest.mark.parametrize("fraction", [-0.1, 1.5])
def test_a_recent_fraction_outside_0_1_is_refused(fraction):
    with pytest.raises(ValueError, match="recent_fraction must be in"):
        KVPPress(compression_ratio=0.5, recent_fraction=fraction)


def test_press_refuses_agents_of_another_model(tmp_path, tiny_model):
    model = tiny_model()
    other = {"identity": "0" * 16}  # another model's weights
    old = {"identity": None, "name": "another-model"}  # a card from before identities, of another name
    for change in (other, old, {"num_layers": 3}, {"num_kv_heads": 1}, {"head_dim": 32}):
        random_agents(model, tmp_path, **change)
        press = KVPPress(compression_ratio=0.5, agents=str(tmp_path))
        with pytest.raises(KVPAgentsError, match="were made for"):
            press.post_init_from_model(model)


def test_agents_serve_the_same_model_under_another_name(tmp_path, tiny_model):
    """A copy of a model's folder is that model: matched by its weights' identity, not by its name."""
    model = tiny_model()
    random_agents(model, tmp_path, name="/elsewhere/a-copy-of-it")
    KVPPress(compression_ratio=0.5, agents=str(tmp_path)).post_init_from_model(model)
    changed = tiny_model()
    with torch.no_grad():
        next(changed.parameters()).add_(1.0)  # the same shape, other weights
    with pytest.raises(KVPAgentsError, match="were made for"):
        KVPPress(compression_ratio=0.5, agents=str(tmp_path)).post_init_from_model(changed)


def test_press_refuses_agents_covering_part_of_the_heads(tmp_path, tiny_model):
    model = tiny_model()
    agents = KVPAgents(2, 16, hidden=8)
    save_agents(tmp_path, agents, {"model": vars(model_shape(model)), "heads": [0, 1]})
    with pytest.raises(KVPAgentsError, match="cover 2 of the model's 4 heads"):
        KVPPress(compression_ratio=0.5, agents=str(tmp_path)).post_init_from_model(model)


def test_missing_agents_name_the_folder_and_the_training_command(tmp_path, tiny_model):
    with pytest.raises(KVPAgentsError, match="nowhere.*kvbench kvp datagen .* kvbench kvp train"):
        KVPPress(compression_ratio=0.5, agents=str(tmp_path / "nowhere"))  # before any model loads
    press = KVPPress(compression_ratio=0.5)  # the default folder of a model without agents
    with pytest.raises(KVPAgentsError, match="kvbench kvp datagen .* kvbench kvp train"):
        press.post_init_from_model(tiny_model())


def test_press_state_is_the_digest_of_the_agents_weights(tmp_path, tiny_model):
    model = tiny_model()
    digests = []
    for seed in (0, 0, 1):
        torch.manual_seed(seed)
        random_agents(model, tmp_path)
        press = KVPPress(compression_ratio=0.5, agents=str(tmp_path))
        press.post_init_from_model(model)
        digests.append(press_state(press))
    assert digests[0] == digests[1] != digests[2]
    # A wrapper carries the state of the press it wraps; a press without learned state has none.
    assert press_state(AdaKVPress(press)) == digests[2]
    assert press_state(AdaKVPress(build_press("knorm", 0.5))) is None and press_state(None) is None
