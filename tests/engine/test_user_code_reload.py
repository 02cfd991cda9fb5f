"""A user's file edited and used again in one process (a notebook, the lm-eval integration, a sweep that
resolves a press twice): what runs is the new text, or kvbench refuses in one line; never the old text
keyed by the new text's digest."""

import hashlib
import importlib
import importlib.util
import os
import sys
from pathlib import Path

import pytest

from kvbench.core.registry import PluginError, load_target, source_of
from kvbench.presses import PRESSES, resolve_press

PRESS_CLASS = """
from dataclasses import dataclass

from kvpress import ScorerPress


@dataclass
class Norm(ScorerPress):
    compression_ratio: float = 0.0
    version = {version}

    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        return values.norm(dim=-1)
"""

FACTORY = "from norm_press import Norm\n\n\ndef make(ratio):\n    return Norm(ratio)\n"


@pytest.fixture
def user_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    # The test's own `importlib.reload` after an edit within the same second, to the same size, would read
    # Python's bytecode cache of the old text (the suite writes caches: tests/__init__.py).
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    sys.modules.pop("norm_press", None)  # another test's norm_press.py, imported in this worker before
    Path("norm_press.py").write_text(PRESS_CLASS.format(version=1))
    Path("factory.py").write_text(FACTORY)
    yield tmp_path
    sys.modules.pop("norm_press", None)


def test_a_factory_resolved_again_after_its_press_file_is_edited_runs_the_new_text(user_files):
    """The factory's file unchanged and its press class's file edited, then the factory's: each time the
    press the registry builds is the edited text, under a new digest."""

    def built() -> tuple[int, str]:
        name = resolve_press("mk=factory.py:make")
        press = load_target(PRESSES[name].source.target, "press")(0.5)
        return type(press).version, PRESSES[name].source.digest

    first = built()
    assert built() == first and first[0] == 1
    Path("norm_press.py").write_text(PRESS_CLASS.format(version=2))
    second = built()
    assert second[0] == 2 and second[1] != first[1]
    Path("norm_press.py").write_text(PRESS_CLASS.format(version=3))
    Path("factory.py").write_text(FACTORY + "# edited\n")
    third = built()
    assert third[0] == 3 and third[1] not in (first[1], second[1])


def test_an_object_whose_file_was_edited_since_it_was_loaded_is_refused(user_files):
    """An object the user hands over (the API) runs the text its module was imported from: after an
    edit, kvbench says so in one line rather than key the old code by the new text; reloaded, it runs."""
    module = importlib.import_module("norm_press")
    source_of(module.Norm)
    Path("norm_press.py").write_text(PRESS_CLASS.format(version=2))
    with pytest.raises(PluginError, match=r"^'Norm': .*norm_press.py was edited after 'Norm' was loaded"):
        source_of(module.Norm)
    with pytest.raises(PluginError, match="was edited after"):
        resolve_press(module.Norm, "norm_api")
    fresh = importlib.reload(module).Norm
    assert fresh.version == 2
    assert source_of(fresh).sha256 == hashlib.sha256(Path("norm_press.py").read_bytes()).hexdigest()


def test_a_metric_file_resolved_again_after_its_helper_is_edited_scores_with_the_new_text(user_files):
    """A metric file importing a helper of the user's: the helper edited, the metric named again scores
    by the new helper (the task's rows are keyed by its new digest, so they are scored again)."""
    from kvbench.tasks import METRICS, resolve_metric

    Path("weights.py").write_text("WEIGHT = 1.0\n")
    Path("metric.py").write_text(
        "from weights import WEIGHT\n\n\ndef score(prediction, references):\n    return WEIGHT\n"
    )
    try:
        first = METRICS[resolve_metric("metric.py:score")]
        Path("weights.py").write_text("WEIGHT = 0.5\n")
        second = METRICS[resolve_metric("metric.py:score")]
        assert first.function("a", ["a"]) == 1.0 and second.function("a", ["a"]) == 0.5
        assert first.digest != second.digest
    finally:
        sys.modules.pop("weights", None)


def test_an_edited_helper_runs_its_new_text_though_its_bytecode_cache_looks_fresh(tmp_path, monkeypatch):
    """Python trusts a bytecode cache whose source kept its size and modification second: an edit within
    that second must still run the new text."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    helper = tmp_path / "cached_helper.py"
    helper.write_text("VALUE = 1\n")
    uses = "import cached_helper\n\n\ndef value():\n    return cached_helper.VALUE\n"
    Path("uses_helper.py").write_text(uses)
    assert load_target("uses_helper.py:value", "metric")() == 1
    assert importlib.util.cache_from_source(str(helper)) and sys.modules["cached_helper"].__cached__
    when = helper.stat().st_mtime_ns
    helper.write_text("VALUE = 2\n")
    os.utime(helper, ns=(when, when))  # the same second and size as the cached text
    assert load_target("uses_helper.py:value", "metric")() == 2
    sys.modules.pop("cached_helper", None)
