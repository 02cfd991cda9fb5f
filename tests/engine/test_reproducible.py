"""Every registry press gives the same answer alone, inside a sweep of other configs and on resume: presses
that draw random numbers (leverage, compactor, cur's random leverage, random without a seed) draw them from
a seed of their own (sample, config), never from torch's global state that the other configs also use."""

import dataclasses
import json
import random
from pathlib import Path

import kvpress
import pytest
import torch

from kvbench.bridge.adapter import seed_press
from kvbench.bridge.models import load_model
from kvbench.core.config import Config
from kvbench.engine import evaluate_sample
from kvbench.learned.distillcache.policy import DistillCachePolicy
from kvbench.learned.distillcache.press import save_policy
from kvbench.learned.fitted import METHODS as FITTED
from kvbench.learned.gate.gates import GateSet
from kvbench.learned.gate.press import save_gates
from kvbench.learned.kvp.agent import KVPAgents
from kvbench.learned.kvp.checkpoint import model_shape, save_agents
from kvbench.presses import PRESSES, build_press
from kvbench.tasks import Sample

# Configs that draw from torch's global random state unless seeded: they sit in every sweep below.
DRAWING = [
    Config("leverage", 0.25),
    Config("compactor", 0.25),
    Config("cur", 0.25, (("use_random_leverage", True),)),
    Config("random", 0.25, (("seed", None),)),
]
REPO = Path(__file__).resolve().parents[2]
# (Presses set by a knob of their own run at ratio 0 with it: the sample's configs below are all at 0.5.)
# Fitted presses need state fitted for the tiny model (tests/learned/test_fitted_presses.py runs them); their
# scores draw nothing at random.
OFFLINE = sorted(
    name for name, spec in PRESSES.items() if "hub" not in spec.needs and not spec.knob and name not in FITTED
)


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def setup(tiny_model_dir):
    """A tiny model with peaked attention (which entries are kept changes the answer) and one sample."""
    model, tokenizer = load_model(tiny_model_dir)
    torch.manual_seed(0)
    for module in model.modules():  # as initializer_range=0.1 (tests/engine/test_engine.py's tiny models)
        if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
            torch.nn.init.normal_(module.weight, std=0.1)
    rng = random.Random(0)
    words = "red green blue cat dog bird one two three north south east west river hill stone".split()
    sample = Sample(
        task="soup",
        id="0",
        context=" ".join(rng.choice(words) for _ in range(260)),
        question="Which colour comes first?",
        answer_prefix="Answer:",
        references=["red"],
        max_new_tokens=8,
        metric="none",
    )
    shape = model_shape(model)
    agents = Path(tiny_model_dir) / "kvp-agents"
    save_agents(
        agents,
        KVPAgents(shape.num_heads, shape.head_dim, hidden=8),
        {"model": vars(shape), "heads": list(range(shape.num_heads))},
    )
    calibration = json.loads((REPO / "presses/memdecay/smollm2-135m/calibration.json").read_text())
    memdecay = Path(tiny_model_dir) / "memdecay"
    memdecay.mkdir(exist_ok=True)
    (memdecay / "calibration.json").write_text(json.dumps({**calibration, "model": tiny_model_dir}))
    policy = Path(tiny_model_dir) / "distillcache"
    save_policy(policy, DistillCachePolicy(hidden=8), {"model": vars(shape)})
    gate_weights = Path(tiny_model_dir) / "gate"
    gates = GateSet(shape.num_layers, shape.num_kv_heads, shape.head_dim)
    with torch.no_grad():
        gates.weight.normal_(generator=torch.Generator().manual_seed(3))
    save_gates(gate_weights, gates, {"model": vars(shape), "training": {}, "validation": {}})
    press_args = {
        "kvp": (("agents", str(agents)),),
        "memdecay": (("calibration", str(memdecay)),),
        "distillcache": (("weights", str(policy)),),
        "gate": (("weights", str(gate_weights)),),
    }
    return model, tokenizer, sample, press_args


def answers(setup, configs: list[Config]) -> dict[Config, tuple]:
    model, tokenizer, sample, _ = setup
    results = evaluate_sample(model, tokenizer, sample, configs, batch_configs=8)
    return {
        config: (result["prediction"], result["kv_kept"])
        for config, result in zip(configs, results, strict=True)
    }


@pytest.mark.parametrize("tiny_model_dir", ["llama"], indirect=True)
def test_every_press_answers_the_same_alone_in_a_sweep_and_on_resume(tiny_model_dir, setup):
    configs = [Config(name, 0.5, setup[3].get(name, ())) for name in OFFLINE if name != "none"]
    sweep = answers(setup, [Config("none", 0.0), *DRAWING, *configs])
    resumed = answers(setup, [*reversed(configs), *reversed(DRAWING)])  # other neighbours, other order
    torch.manual_seed(1234)  # whatever the global state, a config's answer is its own
    for config in [*DRAWING, *configs]:
        alone = answers(setup, [config])[config]
        assert alone == sweep[config] == resumed[config], config


@pytest.mark.parametrize("tiny_model_dir", ["llama"], indirect=True)
def test_without_seeding_the_drawing_presses_depend_on_their_neighbours(tiny_model_dir, setup, monkeypatch):
    """The check above can fail: unseeded, leverage and friends change with what shares the sweep."""
    monkeypatch.setattr("kvbench.engine.evaluate.seed_press", lambda press, key: press)
    torch.manual_seed(0)
    first = answers(setup, [Config("none", 0.0), *DRAWING])
    second = answers(setup, [*reversed(DRAWING)])
    assert any(first[config] != second[config] for config in DRAWING)


@dataclasses.dataclass
class DrawingPress(kvpress.ScorerPress):
    """Scores at random from torch's global state, as leverage's sketch does."""

    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        return torch.rand(keys.shape[:-1])


def test_a_seeded_press_draws_its_own_numbers_and_leaves_the_global_state_alone():
    keys = torch.randn(1, 2, 32, 8)
    layer = type("Attention", (), {"layer_idx": 0, "head_dim": 8})()
    first, second, other = (seed_press(DrawingPress(0.5), key) for key in ("a", "a", "b"))
    state = torch.get_rng_state()
    kept = first.compress(layer, None, keys, keys, None, {})[0]
    assert torch.equal(torch.get_rng_state(), state)
    torch.rand(100)  # whatever else draws in between
    assert torch.equal(second.compress(layer, None, keys, keys, None, {})[0], kept)
    assert not torch.equal(other.compress(layer, None, keys, keys, None, {})[0], kept)
    # A second compression of the same layer (decode-time, streaming) draws anew, the same way each time.
    assert torch.equal(
        first.compress(layer, None, keys, keys, None, {})[0],
        second.compress(layer, None, keys, keys, None, {})[0],
    )


def test_seeding_a_compression_seeds_only_the_generators_in_play(monkeypatch):
    """torch.manual_seed also queues a seeding of every uninitialised accelerator, a formatted traceback
    each (~9 ms a compression on CPU, most of the decode-time protocol's hook time)."""
    monkeypatch.setattr(torch, "manual_seed", lambda seed: pytest.fail("seeded every device"))
    keys = torch.randn(1, 2, 32, 8)
    layer = type("Attention", (), {"layer_idx": 0, "head_dim": 8})()
    first, second = (seed_press(DrawingPress(0.5), "a") for _ in range(2))
    assert torch.equal(
        first.compress(layer, None, keys, keys, None, {})[0],
        second.compress(layer, None, keys, keys, None, {})[0],
    )


def test_wrapped_presses_are_seeded_too():
    press = seed_press(build_press("adakv", 0.5, inner="leverage"), "key")
    assert "compress" in vars(press) and "compress" in vars(press.press)
