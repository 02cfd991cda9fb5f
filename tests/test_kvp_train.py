import json

import torch
from safetensors.torch import save_file

from kvbench.kvp.agent import KVPAgents, position_features
from kvbench.kvp.checkpoint import ModelShape, load_agents
from kvbench.kvp.datagen import MANIFEST_FILE
from kvbench.kvp.train import TrainConfig, select_heads, train

SHAPE = {"name": "synthetic", "num_layers": 2, "num_kv_heads": 1, "head_dim": 8}


def synthetic_utility(keys: torch.Tensor) -> torch.Tensor:
    """Head 0 (layer 0) needs tokens with a large first key coordinate, head 1 (layer 1) the latest tokens."""
    length = keys.shape[1]
    by_key = (keys[0, :, 0]).softmax(-1)
    by_recency = (6 * torch.arange(length) / length).softmax(-1)
    return torch.stack([by_key, by_recency]).unsqueeze(1)  # (layers, kv_heads, P)


def write_synthetic_data(directory, train: int = 24, val: int = 6) -> None:
    generator = torch.Generator().manual_seed(0)
    shards = []
    for index in range(train + val):
        length = 48 + index % 17
        keys = torch.randn(2, 1, length, 8, generator=generator) * 2 + 1
        values = torch.randn(2, 1, length, 8, generator=generator)
        tensors = {
            "keys": keys.half(),
            "values": values.half(),
            "utility": synthetic_utility(keys.half().float()[:, 0]),
        }
        file = f"synthetic-{index:05d}.safetensors"
        save_file(tensors, directory / file)
        shards.append({"file": file, "split": "val" if index >= train else "train", "prompt_tokens": length})
    manifest = {"model": SHAPE, "config": {"tasks": ["synthetic"]}, "shards": shards}
    (directory / MANIFEST_FILE).write_text(json.dumps(manifest))


def test_training_learns_a_near_oracle_ranking_of_a_known_utility(tmp_path):
    write_synthetic_data(tmp_path)
    config = TrainConfig(
        steps=200, prompts=1, rankings=8, lr=2e-2, warmup=20, ema=0.9, eval_every=50, hidden=16
    )
    card = train(tmp_path, tmp_path / "agents", config, log=lambda line: None)
    agent, random = torch.tensor(card["validation"]["agent"]), torch.tensor(card["validation"]["random"])
    assert (random < -2.5).all()  # far from trivial
    assert (agent > -1.05).all()  # within 5 % of the oracle's cost
    agents, saved_card = load_agents(tmp_path / "agents")
    assert saved_card["heads"] == [0, 1] and agents.num_heads == 2


def test_training_a_subset_of_heads(tmp_path):
    write_synthetic_data(tmp_path, train=4, val=2)
    config = TrainConfig(steps=4, rankings=4, warmup=2, eval_every=2, hidden=8)
    card = train(tmp_path, tmp_path / "agents", config, layers=[1], log=lambda line: None)
    assert card["heads"] == [1] and len(card["validation"]["agent"]) == 1
    assert select_heads(ModelShape("m", 3, 2, 8), [0, 2], [1]) == [1, 5]


def test_agents_score_a_token_subset_as_they_score_it_in_the_whole_prompt():
    agents = KVPAgents(3, 8, hidden=8)
    torch.nn.init.normal_(agents.w3)
    keys, values = torch.randn(2, 3, 40, 8), torch.randn(2, 3, 40, 8)
    chosen = torch.tensor([39, 0, 17, 5])
    positions = position_features(40)[chosen].expand(2, -1, -1)
    subset = agents(keys[:, :, chosen], values[:, :, chosen], positions=positions)
    torch.testing.assert_close(subset, agents(keys, values)[:, :, chosen])
    # Layer-by-layer scoring (the press) selects the same rows of the stack as scoring all heads at once.
    torch.testing.assert_close(
        agents(keys[:, 1:], values[:, 1:], heads=slice(1, 3)), agents(keys, values)[:, 1:]
    )


def test_agent_forward_is_the_mlp_of_normalised_features():
    torch.manual_seed(0)
    agents = KVPAgents(2, 4, hidden=5)
    torch.nn.init.normal_(agents.w3)
    agents.set_normalisation(*(torch.rand(2, 4) + 0.5 for _ in range(4)))
    keys, values = torch.randn(1, 2, 6, 4), torch.randn(1, 2, 6, 4)
    for head in range(2):
        x = torch.cat(
            [
                (keys[0, head] - agents.key_mean[head]) / agents.key_std[head],
                (values[0, head] - agents.value_mean[head]) / agents.value_std[head],
                position_features(6),
            ],
            dim=-1,
        )
        x = torch.nn.functional.silu(x @ agents.w1[head] + agents.b1[head])
        x = torch.nn.functional.silu(x @ agents.w2[head] + agents.b2[head])
        expected = (x @ agents.w3[head] + agents.b3[head]).squeeze(-1)
        torch.testing.assert_close(agents(keys, values)[0, head], expected)
