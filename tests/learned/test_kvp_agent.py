"""The two KVP agent architectures: Apple's agent against a one-head reference built from torch.nn modules,
the position clamp, per-head independence, checkpoints of both and refusing one loaded as the other."""

import pytest
import torch
from torch import nn

from kvbench.learned.kvp.agent import ARCHS, AppleAgents, KVPAgents, build_agents
from kvbench.learned.kvp.checkpoint import KVPAgentsError, load_agents, save_agents
from kvbench.learned.kvp.press import KVPPress

SHAPE = {"name": "tiny", "num_layers": 2, "num_kv_heads": 2, "head_dim": 8}


def random_apple(num_heads=3, head_dim=8, hidden=16, positions=32) -> AppleAgents:
    """Apple agents whose LayerNorm gains/biases and statistics are random too (not 1, 0)."""
    torch.manual_seed(0)
    agents = AppleAgents(num_heads, head_dim, hidden=hidden, positions=positions)
    with torch.no_grad():
        for name, parameter in agents.named_parameters():
            if "norm" in name:
                parameter.copy_(torch.randn_like(parameter))
    agents.set_normalisation(*(torch.rand(num_heads, head_dim) + 0.5 for _ in range(4)))
    return agents


def reference_apple_head(agents: AppleAgents, head: int) -> nn.Module:
    """Head `head` of the stack as Apple writes one agent: nn.Linear, nn.LayerNorm, nn.Embedding, an MLP of
    2 x [Linear, LayerNorm, SiLU] + Linear; keys and values standardised first."""

    class Reference(nn.Module):
        def __init__(self):
            super().__init__()
            d, hidden, p = agents.head_dim, agents.hidden, agents.position_dim
            self.key_projection, self.value_projection = nn.Linear(d, hidden), nn.Linear(d, hidden)
            self.norm_key, self.norm_value = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
            self.pos_embedding, self.norm_pos = nn.Embedding(agents.positions, p), nn.LayerNorm(p)
            self.mlp = nn.Sequential(
                nn.Linear(2 * hidden + p, hidden),
                nn.LayerNorm(hidden),
                nn.SiLU(),
                nn.Linear(hidden, hidden),
                nn.LayerNorm(hidden),
                nn.SiLU(),
                nn.Linear(hidden, 1),
            )

        def forward(self, keys, values):  # (P, d) each
            keys = (keys - agents.key_mean[head]) / agents.key_std[head]
            values = (values - agents.value_mean[head]) / agents.value_std[head]
            positions = torch.arange(len(keys)).clamp(max=agents.positions - 1)
            features = torch.cat(
                [
                    self.norm_key(self.key_projection(keys)),
                    self.norm_value(self.value_projection(values)),
                    self.norm_pos(self.pos_embedding(positions)),
                ],
                dim=-1,
            )
            return self.mlp(features).squeeze(-1)

    reference = Reference()
    pairs = {
        "key_projection": ("key_weight", "key_bias"),
        "value_projection": ("value_weight", "value_bias"),
        "mlp.0": ("w1", "b1"),
        "mlp.3": ("w2", "b2"),
        "mlp.6": ("w3", "b3"),
        "norm_key": ("key_norm.weight", "key_norm.bias"),
        "norm_value": ("value_norm.weight", "value_norm.bias"),
        "norm_pos": ("position_norm.weight", "position_norm.bias"),
        "mlp.1": ("norm1.weight", "norm1.bias"),
        "mlp.4": ("norm2.weight", "norm2.bias"),
    }
    ours = dict(agents.named_parameters())
    with torch.no_grad():
        for module_name, (weight, bias) in pairs.items():
            module = reference.get_submodule(module_name)
            transpose = isinstance(module, nn.Linear)  # ours are (in, out), nn.Linear's (out, in)
            module.weight.copy_(ours[weight][head].T if transpose else ours[weight][head, 0])
            module.bias.copy_(ours[bias][head, 0])
        reference.pos_embedding.weight.copy_(agents.position_table[head])
    return reference


def test_apple_agents_are_apples_agent_per_head_with_finite_scores():
    agents = random_apple(positions=32)
    keys, values = torch.randn(2, 3, 50, 8) * 3 + 1, torch.randn(2, 3, 50, 8)
    scores = agents(keys.half(), values.half())  # the cache's dtype: scored in fp32
    assert scores.shape == (2, 3, 50) and scores.dtype == torch.float32 and scores.isfinite().all()
    assert scores.std() > 0.1  # not a constant
    for head in range(3):
        reference = reference_apple_head(agents, head)
        for prompt in range(2):
            expected = reference(keys[prompt, head].half().float(), values[prompt, head].half().float())
            torch.testing.assert_close(scores[prompt, head], expected, rtol=1e-4, atol=1e-4)


def test_positions_past_the_table_read_its_last_row():
    agents = random_apple(num_heads=1, positions=16)
    key, value = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)
    keys, values = key.expand(1, 1, 40, 8), value.expand(1, 1, 40, 8)  # one token repeated 40 times
    scores = agents(keys, values)[0, 0]
    assert len(set(scores[:16].tolist())) == 16  # each row of the table its own score
    torch.testing.assert_close(scores[15:], scores[15].expand(25))  # positions 15..39: the last row


@pytest.mark.parametrize("arch", list(ARCHS))
def test_each_head_is_scored_by_its_own_weights_only(arch):
    torch.manual_seed(0)
    agents = build_agents(arch, 4, 8, hidden=16)
    torch.nn.init.normal_(agents.w3)
    keys, values = torch.randn(1, 4, 30, 8), torch.randn(1, 4, 30, 8)
    before = agents(keys, values)
    with torch.no_grad():
        for parameter in agents.parameters():
            parameter[2] += torch.randn_like(parameter[2])
    after = agents(keys, values)
    changed = (after - before).abs().amax(dim=(0, 2))
    assert changed[2] > 1e-3 and changed[[0, 1, 3]].max() == 0


@pytest.mark.parametrize("arch", list(ARCHS))
def test_checkpoint_round_trip_keeps_the_arch_and_the_scores(tmp_path, arch):
    torch.manual_seed(0)
    agents = build_agents(arch, 4, 8, hidden=12)
    torch.nn.init.normal_(agents.w3)
    agents.set_normalisation(*(torch.rand(4, 8) + 0.5 for _ in range(4)))
    save_agents(tmp_path, agents, {"model": SHAPE, "heads": [0, 1, 2, 3]})
    loaded, card = load_agents(tmp_path)
    assert type(loaded) is ARCHS[arch] and card["agent"]["arch"] == arch and loaded.hidden == 12
    keys, values = torch.randn(1, 4, 20, 8), torch.randn(1, 4, 20, 8)
    torch.testing.assert_close(loaded(keys, values), agents(keys, values), rtol=0, atol=0)


def test_agents_of_one_arch_are_refused_as_the_other(tmp_path):
    save_agents(tmp_path / "compact", KVPAgents(4, 8), {"model": SHAPE, "heads": [0, 1, 2, 3]})
    with pytest.raises(KVPAgentsError, match="are compact agents, not apple"):
        load_agents(tmp_path / "compact", arch="apple")
    with pytest.raises(KVPAgentsError, match="are compact agents, not apple"):
        KVPPress(compression_ratio=0.5, agents=str(tmp_path / "compact"), arch="apple")
    KVPPress(compression_ratio=0.5, agents=str(tmp_path / "compact"), arch="compact")  # the right one
    with pytest.raises(KVPAgentsError, match="unknown KVP arch 'wide'"):
        KVPPress(compression_ratio=0.5, arch="wide")

    # A card that says apple over compact weights, and a card of an arch this kvbench does not know.
    card = (tmp_path / "compact" / "card.json").read_text()
    (tmp_path / "compact" / "card.json").write_text(card.replace('"compact"', '"apple"'))
    with pytest.raises(
        KVPAgentsError, match="agents.safetensors holds compact agents but card.json says apple"
    ):
        load_agents(tmp_path / "compact")
    (tmp_path / "compact" / "card.json").write_text(card.replace('"compact"', '"wide"'))
    with pytest.raises(KVPAgentsError, match="unknown KVP arch 'wide'"):
        load_agents(tmp_path / "compact")


def test_cards_from_before_the_arch_field_load_as_compact(tmp_path):
    save_agents(tmp_path, KVPAgents(4, 8), {"model": SHAPE, "heads": [0, 1, 2, 3]})
    card = (tmp_path / "card.json").read_text()
    (tmp_path / "card.json").write_text(card.replace('"arch": "compact",', ""))
    agents, _ = load_agents(tmp_path, arch="compact")
    assert isinstance(agents, KVPAgents)
