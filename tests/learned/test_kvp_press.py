import contextlib

import pytest
import torch
from kvpress import AdaKVPress, DecodingPress
from transformers import DynamicCache

from kvbench.bridge.adapter import attention_hooks
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
        top = scores.topk(n_kept, dim=-1).indices.sort(dim=-1).values  # kept in cache order
        top = top.unsqueeze(-1).expand(-1, -1, -1, keys.shape[-1])
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
    # Without it (kvbench's default), some of the last tokens go.
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


def kept_positions(full: DynamicCache, compressed: DynamicCache, layer: int, head: int) -> list[int]:
    """The positions of the prefill's entries a compressed cache holds, found by matching keys."""
    kept, keys = compressed.layers[layer].keys[0, head], full.layers[layer].keys[0, head]
    return sorted((kept[:, None] == keys[None]).all(-1).nonzero()[:, 1].tolist())


@pytest.mark.parametrize("ratio", [0.1, 0.3, 0.5, 0.6])
def test_sinks_and_window_are_kept_in_every_head_at_every_budget(tmp_path, tiny_model, ratio):
    """The authors' press (sinks=4, window=16): the first 4 and the last 16 tokens in every head, the rest
    of the budget the agents' top picks among the others."""
    model = tiny_model()
    agents = random_agents(model, tmp_path)
    length = 50
    input_ids = torch.randint(0, 128, (1, length))
    full = prefill(model, input_ids)
    press = KVPPress(compression_ratio=ratio, agents=str(tmp_path), sinks=4, window=16)
    compressed = prefill(model, input_ids, press)
    n_kept = int(length * (1 - ratio))
    forced = list(range(4)) + list(range(length - 16, length))
    for layer in range(2):
        layer_cache = full.layers[layer]
        scores = agents(layer_cache.keys, layer_cache.values, heads=slice(2 * layer, 2 * layer + 2))
        for head in range(2):
            rest = scores[0, head, 4 : length - 16].topk(n_kept - 20).indices + 4
            assert kept_positions(full, compressed, layer, head) == sorted(forced + rest.tolist())


def test_a_budget_below_sinks_and_window_keeps_the_sinks_then_the_latest(tmp_path, tiny_model):
    model = tiny_model()
    random_agents(model, tmp_path)
    input_ids = torch.randint(0, 128, (1, 40))
    full = prefill(model, input_ids)
    compressed = prefill(model, input_ids, KVPPress(0.75, agents=str(tmp_path), sinks=4, window=16))
    for layer in range(2):
        for head in range(2):  # 10 entries: the 4 sinks, then the 6 latest tokens
            assert kept_positions(full, compressed, layer, head) == [0, 1, 2, 3, *range(34, 40)]


@pytest.mark.parametrize("option", [{"sinks": -1}, {"window": 2.5}, {"sinks": True}])
def test_sinks_and_window_must_be_whole_numbers(option):
    with pytest.raises(ValueError, match="must be a whole number of entries"):
        KVPPress(compression_ratio=0.5, **option)


class PositionProbe(torch.nn.Module):
    """Agents whose score of an entry is its position: what the press feeds them, made visible."""

    def forward(self, keys, values, heads=slice(None), positions=None, lengths=None):
        batch, h, length, _ = keys.shape
        if positions is None:
            positions = torch.arange(length).expand(batch, length)
        if positions.dim() == 2:
            positions = positions[:, None].expand(batch, h, length)
        return positions.float()


def test_a_decode_time_compression_scores_each_entry_at_its_true_position(tmp_path, tiny_model):
    """A second compression after tokens were fed on a compressed cache: each entry must reach the agents at
    its position in the text, not at its index in the shrunk cache."""
    model = tiny_model()
    random_agents(model, tmp_path)
    press = KVPPress(compression_ratio=0.5, agents=str(tmp_path))
    input_ids = torch.randint(0, 128, (1, 40))
    cache = prefill(model, input_ids, press)  # keeps 20 of 40 per head
    full = prefill(model, input_ids)
    kept_before = torch.tensor([[kept_positions(full, cache, 0, head) for head in range(2)]])
    press.loaded = PositionProbe()  # ty: ignore[invalid-assignment] (a stand-in for the agents)
    seen = []
    score = press.score

    def recording_score(module, hidden_states, keys, values, attentions, kwargs):
        scores = score(module, hidden_states, keys, values, attentions, kwargs)
        seen.append((module.layer_idx, scores))
        return scores

    press.score = recording_score
    decoding = DecodingPress(base_press=press, compression_interval=4, target_size=12)
    # kvpress's decoding hook as the engine runs it: on the press as the prefill left it.
    with torch.no_grad(), attention_hooks(model, decoding.forward_hook):
        for step in range(4):  # tokens at positions 40..43, fed on the 20 kept entries
            position = torch.tensor([[40 + step]])
            model.model(input_ids=torch.randint(0, 128, (1, 1)), past_key_values=cache, position_ids=position)
    layer, positions = seen[0]
    assert layer == 0 and positions.shape == (1, 2, 24)
    expected = torch.cat([kept_before, torch.arange(40, 44).expand(1, 2, 4)], dim=2).float()
    torch.testing.assert_close(positions, expected)
    # The positions of the entries it kept go on: the 12 highest of each head.
    assert torch.equal(press.kept_positions[0].float(), expected.topk(12).values.sort().values)
