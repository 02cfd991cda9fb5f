"""`kvbench check-press`: built-in and users' presses pass the battery on the tiny models; a press broken in
one way fails that check and no other."""

import random
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from kvpress import ScorerPress
from kvpress.utils import compute_n_kept

from kvbench.cli import main
from kvbench.diagnostics import conformance
from kvbench.diagnostics.conformance import CHECKS, check_press


def in_cache_order(keys, values, scores, n_kept):
    """The `n_kept` entries of highest score, gathered in cache order, as a correct press keeps them."""
    indices = scores.topk(n_kept, dim=-1).indices.sort(dim=-1).values
    indices = indices.unsqueeze(-1).expand(-1, -1, -1, keys.shape[-1])
    return keys.gather(2, indices).contiguous(), values.gather(2, indices).contiguous()


@dataclass
class NormPress(ScorerPress):
    """A correct press: knorm's scores, kvpress's own compress."""

    compression_ratio: float = 0.0

    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        return -keys.norm(dim=-1)


@dataclass
class EmptiesShortContexts(NormPress):
    """Budget: int(L x (1 - ratio)) entries without kvpress's floor of one, so a short context empties."""

    def compress(self, module, hidden_states, keys, values, attentions, kwargs):
        if self.compression_ratio == 0:
            return keys, values
        scores = self.score(module, hidden_states, keys, values, attentions, kwargs)
        return in_cache_order(keys, values, scores, int(keys.shape[2] * (1 - self.compression_ratio)))


@dataclass
class ClampsItsRatio(NormPress):
    """Budget: never removes more than 80 %, whatever the ratio asked (keeps more than it promises)."""

    def compress(self, module, hidden_states, keys, values, attentions, kwargs):
        ratio = min(self.compression_ratio, 0.8)
        if ratio == 0:
            return keys, values
        scores = self.score(module, hidden_states, keys, values, attentions, kwargs)
        return in_cache_order(keys, values, scores, compute_n_kept(keys.shape[2], ratio))


@dataclass
class NanOnShortContexts(NormPress):
    """Budget: its scores are NaN on contexts of fewer than 4 tokens (kvpress's top-k still keeps entries,
    so nothing else shows it)."""

    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        scores = super().score(module, hidden_states, keys, values, attentions, kwargs)
        return scores * float("nan") if keys.shape[2] < 4 else scores


@dataclass
class KeepsItsLowestScores(NormPress):
    """Budget: a compress of its own that takes the top-k of its scores with the wrong sign: the right
    number of entries, in cache order, but those it scored lowest."""

    def compress(self, module, hidden_states, keys, values, attentions, kwargs):
        if self.compression_ratio == 0:
            return keys, values
        scores = self.score(module, hidden_states, keys, values, attentions, kwargs)
        return in_cache_order(keys, values, -scores, compute_n_kept(keys.shape[2], self.compression_ratio))


@dataclass
class KeepsAView(NormPress):
    """Memory: moves the kept entries to the front of a copy of the whole cache and keeps a slice of it,
    a view that holds the whole copy alive."""

    def compress(self, module, hidden_states, keys, values, attentions, kwargs):
        if self.compression_ratio == 0:
            return keys, values
        scores = self.score(module, hidden_states, keys, values, attentions, kwargs)
        n_kept = compute_n_kept(keys.shape[2], self.compression_ratio)
        kept = scores.topk(n_kept, dim=-1).indices.sort(dim=-1).values
        chosen = torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, kept, True)
        order = torch.cat([kept, (~chosen).nonzero()[:, -1].view(*scores.shape[:2], -1)], dim=-1)
        order = order.unsqueeze(-1).expand(-1, -1, -1, keys.shape[-1])
        return keys.gather(2, order)[:, :, :n_kept], values.gather(2, order)[:, :, :n_kept]


@dataclass
class ScoreOrder(NormPress):
    """Cache order: a compress of its own that gathers the kept entries in the order of their scores."""

    def compress(self, module, hidden_states, keys, values, attentions, kwargs):
        if self.compression_ratio == 0:
            return keys, values
        scores = self.score(module, hidden_states, keys, values, attentions, kwargs)
        indices = scores.topk(compute_n_kept(keys.shape[2], self.compression_ratio), dim=-1).indices
        indices = indices.unsqueeze(-1).expand(-1, -1, -1, keys.shape[-1])
        return keys.gather(2, indices).contiguous(), values.gather(2, indices).contiguous()


@dataclass
class UnseededNoise(NormPress):
    """Determinism: noise from Python's global generator, which kvbench does not seed."""

    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        noise = torch.tensor([random.random() for _ in range(keys.shape[2])], dtype=keys.dtype)
        return noise.expand(keys.shape[:3]).clone()


@dataclass
class SizesItsWindowFromThePrompt(NormPress):
    """Isolation: keeps a recent window as long as what follows the context in the prompt's regions (the
    question's length) - it mistakes the prompt's end for the context's."""

    prompt_tokens: int = 0

    def use_regions(self, regions):
        self.prompt_tokens = len(regions)

    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        scores = super().score(module, hidden_states, keys, values, attentions, kwargs)
        window = max(self.prompt_tokens - keys.shape[2], 0)
        if window:
            scores[..., -window:] += 1e3
        return scores


@dataclass
class WritesIntoValues(NormPress):
    """Shared prefill: scales the values it is given in place (harmless alone; the configs that share its
    prefill see them too)."""

    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        values.mul_(-3.0)
        return super().score(module, hidden_states, keys, values, attentions, kwargs)


@dataclass
class ScoresWithItsOwnTokens(NormPress):
    """Protocols: weighs each key by its own token's hidden state, which only the prefill gives (a decoding
    step's hidden states are those of the new tokens only)."""

    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        return -keys.norm(dim=-1) * hidden_states.norm(dim=-1)[:, None, :]


@dataclass
class FixedBuffer(NormPress):
    """Cost: scores into a buffer of 256 entries, so it crashes on the cost check's longer context."""

    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        return torch.zeros(1, 1, 256, dtype=keys.dtype)[..., : keys.shape[2]] + super().score(
            module, hidden_states, keys, values, attentions, kwargs
        )


BROKEN = [
    (EmptiesShortContexts, "budget kept", "holds no entry"),
    (ClampsItsRatio, "budget kept", "expected"),
    (NanOnShortContexts, "budget kept", "scores not finite (NaN) at layer 0"),
    (KeepsItsLowestScores, "budget kept", "expected the top 48 of its scores"),
    (KeepsAView, "memory freed", "a view"),
    (ScoreOrder, "cache order", "expected increasing"),
    (UnseededNoise, "determinism", "two runs with one seed"),
    (SizesItsWindowFromThePrompt, "protocol isolation", "two questions"),
    # The engine refuses such a press wherever configs share tensors: decode-time's batch too.
    (WritesIntoValues, ("shared prefill", "protocols"), "writes into the keys"),
    (ScoresWithItsOwnTokens, "protocols", "crashes"),
    (FixedBuffer, "cost", "crashes"),
]


@pytest.fixture(autouse=True, scope="module")
def tiny_models():
    conformance.tiny_subjects()  # built once: the first check pays for it


def verdicts(checks) -> dict[str, str]:
    assert [check.name for check in checks] == list(CHECKS)
    return {check.name: check.verdict for check in checks}


def test_a_correct_press_passes_every_check():
    checks = check_press(NormPress, quick=True)
    assert set(verdicts(checks).values()) == {"pass"}, conformance.table(checks)


@pytest.mark.parametrize(
    ("press", "check", "evidence"), BROKEN, ids=[press.__name__ for press, _, _ in BROKEN]
)
def test_a_broken_press_fails_its_check_and_no_other(press, check, evidence):
    expected = list(check) if isinstance(check, tuple) else [check]
    checks = check_press(press, quick=True)
    failed = {c.name: c.evidence for c in checks if c.verdict == "fail"}
    assert list(failed) == expected, conformance.table(checks)
    assert evidence in failed[expected[0]] and "llama-gqa" in failed[expected[0]]


def test_every_check_has_a_broken_press():
    named = [check if isinstance(check, tuple) else (check,) for _, check, _ in BROKEN]
    assert {name for checks in named for name in checks} == set(CHECKS)


@pytest.mark.parametrize("press", ["knorm", "snapkv"])
def test_built_in_presses_pass_quick(press):
    checks = check_press(press, quick=True)
    assert "fail" not in verdicts(checks).values(), conformance.table(checks)
    assert verdicts(checks)["budget kept"] == verdicts(checks)["shared prefill"] == "pass"


def test_the_cost_says_which_differences_are_within_the_noise_of_the_repeats(monkeypatch):
    from kvbench.diagnostics import speed

    # Repeat by repeat, none's, knorm's and the press's seconds: none's spread (3 ms) exceeds its lead.
    seconds = iter([0.010, 0.021, 0.0105, 0.013, 0.021, 0.0105, 0.011, 0.021, 0.0105])
    prefill = speed.prefill

    def timed(model, ids, press=None):
        _, cache, last = prefill(model, ids, press)
        return next(seconds), cache, last

    monkeypatch.setattr(speed, "prefill", timed)
    line = conformance.check_cost(conformance.tiny_subjects()[0], conformance.Target("streaming_llm", ()))
    assert line.startswith(
        "512-token prefill 10.5 ms: +5% vs none (10.0 ms, within the noise of 3 repeats), "
        "-50% vs knorm (21.0 ms); "
    ), line


def test_head_wise_masks_are_reported_as_freeing_nothing():
    checks = {check.name: check for check in check_press("adakv", quick=True)}
    assert checks["memory freed"].verdict == "n/a"
    assert checks["memory freed"].evidence.startswith("masks, frees nothing")
    assert checks["budget kept"].verdict == checks["shared prefill"].verdict == "pass"


def test_the_command_checks_a_users_press_file(tmp_path):
    path = tmp_path / "my_press.py"
    path.write_text(
        textwrap.dedent(
            """
            from dataclasses import dataclass

            from kvpress import ScorerPress


            @dataclass
            class ValueNormPress(ScorerPress):
                compression_ratio: float = 0.0
                power: float = 2.0

                def score(self, module, hidden_states, keys, values, attentions, kwargs):
                    return values.abs().pow(self.power).sum(dim=-1)
            """
        )
    )
    result = CliRunner().invoke(
        main, ["check-press", f"{path}:ValueNormPress", "--quick", "--press-arg", "power=1"]
    )
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].split() == ["check", "verdict", "evidence"]
    assert [line.split()[-1] for line in lines[1:]] != []
    assert all(" pass " in line for line in lines[1:]), result.output


def test_the_command_exits_1_when_a_check_fails():
    result = CliRunner().invoke(main, ["check-press", f"{__file__}:ScoreOrder", "--quick"])
    assert result.exit_code == 1, result.output
    assert "cache order         fail" in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["nosuchpress"], "unknown press 'nosuchpress'"),
        (["snapkv", "--press-arg", "window=3"], "has no argument 'window'"),
        (["snapkv", "--press-arg", "window_size=abc"], "window_size='abc' is not int"),
        (["none"], "compresses nothing"),
        (["knorm", "--model", "nope/nope"], "--model applies without --quick"),
        (["knorm", "--model", "smollm2-135m"], "--model applies without --quick"),
        (["--all", "--model", "smollm2-135m"], "--model applies without --quick"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2_before_any_model(args, message, monkeypatch):
    monkeypatch.setattr(conformance, "tiny_subjects", lambda: pytest.fail("a model was built"))
    result = CliRunner().invoke(main, ["check-press", *args, "--quick"])
    assert result.exit_code == 2, result.output
    assert message in result.output and len(result.output.strip().splitlines()) == 1


def test_a_markdown_folder_that_cannot_be_written_is_refused_before_the_battery(tmp_path, monkeypatch):
    monkeypatch.setattr(conformance, "tiny_subjects", lambda: pytest.fail("a model was built"))
    (tmp_path / "docs").write_text("a file where a folder should be")
    markdown = tmp_path / "docs" / "conformance.md"
    result = CliRunner().invoke(main, ["check-press", "--all", "--quick", "--markdown", str(markdown)])
    assert result.exit_code == 2, result.output
    assert "--markdown folder" in result.output and "is a file" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_the_committed_board_is_what_the_command_writes(tmp_path, monkeypatch):
    """docs/conformance.md is regenerated whenever a press or the battery changes what it finds."""
    # The board shows the cost's verdict only, which the first repeat decides (it fails where a press
    # crashes, and each repeat builds the press anew): one repeat instead of three.
    monkeypatch.setattr(conformance, "COST_REPEATS", 1)
    out = tmp_path / "board.md"
    result = CliRunner().invoke(main, ["check-press", "--all", "--quick", "--markdown", str(out)])
    assert result.exit_code in (0, 1), result.output
    committed = Path(__file__).resolve().parents[2] / "docs" / "conformance.md"
    assert out.read_text() == committed.read_text()
    # Every built-in press that fails a check says why in `kvbench presses`.
    listing = CliRunner().invoke(main, ["presses"]).output
    for line in out.read_text().splitlines():
        if line.startswith("| ") and "| fail" in line:
            name = line.split("|")[1].strip()
            assert any(row.split()[0] == name and "[conformance: " in row for row in listing.splitlines()), (
                name
            )


@pytest.mark.parametrize("protocol", ["streaming", "decode-time"])
def test_a_prefill_only_press_is_refused_where_a_cache_is_compressed_again(tmp_path, protocol):
    args = [
        "run",
        "--press",
        "leverage",
        "--ratio",
        "0.5",
        "--protocol",
        protocol,
        "--out",
        str(tmp_path / "o"),
    ]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2 and result.output == (
        f"Error: press 'leverage' scores a whole prefill only (kvpress asserts it): it cannot compress the "
        f"cache again under the {protocol} protocol\n"
    )


def test_the_report_shows_the_verdicts_left_in_a_results_folder(tmp_path, tiny_llama_dir):
    out = tmp_path / "results"
    sweep = ["sweep", "--presses", "knorm,streaming_llm", "--ratios", "0.5", "--task", "niah_single_1"]
    sweep += ["--samples", "1", "--length", "512", "--model", tiny_llama_dir, "--out", str(out)]
    assert CliRunner().invoke(main, sweep).exit_code == 0
    checked = CliRunner().invoke(main, ["check-press", "knorm", "--quick", "--out", str(out)])
    assert checked.exit_code == 0 and f"verdicts: {out / 'conformance' / 'knorm.json'}" in checked.output
    (out / "conformance" / "broken.json").write_text('{"press": 3}')  # skipped with a warning, not fatal
    result = CliRunner().invoke(main, ["report", str(out), "--out", str(tmp_path / "report")])
    assert result.exit_code == 0, result.output
    readme = (tmp_path / "report" / "README.md").read_text()
    section = readme[readme.index("### Conformance") :]
    assert "| knorm | pass | - |" in section and "streaming_llm" not in section.split("###")[1]
    assert "skipped a conformance record" in result.output and "broken.json" in result.output
