"""The grid a sweep plans: which configs, with which press arguments."""

from kvbench.core.config import Config
from kvbench.harness.planning import configs_for_sweep


def test_sweep_press_arguments_go_to_every_press_but_none():
    configs = configs_for_sweep("kvp,tova", "0.25,0.5", press_args={"agents": "agents/broad"})
    assert configs[0] == Config("none", 0.0)
    assert [(c.press, c.ratio) for c in configs[1:]] == [
        ("kvp", 0.25),
        ("kvp", 0.5),
        ("tova", 0.25),
        ("tova", 0.5),
    ]
    assert all(c.press_args == (("agents", "agents/broad"),) for c in configs[1:])
    assert configs_for_sweep("kvp", "0.5")[1].press_args == ()  # rows of the default agents stay apart
