"""Start-up: a misspelt name is refused with a did-you-mean before torch, transformers or kvpress are
imported (their imports take 10-30 s on 2 busy cores; the name checks need none of them)."""

import json
import subprocess
import sys

import pytest

from kvbench.core.errors import did_you_mean
from kvbench.learned.catalog import LEARNED

HEAVY = ("torch", "transformers", "kvpress", "pandas")

# (arguments, what the one line on stderr must say)
MISSPELT = [
    (["run", "--press", "knrom", "--ratio", "0.5"], "unknown press 'knrom': did you mean 'knorm'?"),
    (
        ["sweep", "--presses", "knorm,snapk", "--ratios", "0.5"],
        "unknown press 'snapk': did you mean 'snapkv'",
    ),
    (
        ["run", "--press", "knorm", "--ratio", "0.5", "--task", "niah_singel_1"],
        "unknown task 'niah_singel_1': did you mean 'niah_single_1'",
    ),
    (
        ["sweep", "--presses", "knorm", "--ratios", "0.5", "--suite", "ruler-1K"],
        "unknown suite 'ruler-1K': did you mean 'ruler-1k'",
    ),
    (["run", "--press", "knorm", "--raito", "0.5"], "'--ratio'"),  # click's own suggestion
    (["rnu", "--press", "knorm"], "Did you mean 'run'?"),
    # numbers and paths are checked before torch too
    (["run", "--press", "knorm", "--ratio", "1.5"], "ratio must be in [0, 1), got 1.5"),
    (["run", "--press", "knorm", "--ratio", "0.5", "--out", "/proc/kvbench"], "is not writable"),
    # the learned presses' trainers check their options before torch too
    (["kvp", "train", "--data", "x", "--arch", "compactt"], "'compactt' is not one of 'compact', 'apple'"),
    (["kvp", "train", "--data", "x", "--budget-weights", "harmonc"], "'harmonc' is not one of 'uniform'"),
    (["gate", "train", "--keep", "2"], "must be in (0, 1), got 2"),
    (["kvp", "datagen", "--out", "x", "--samples", "1"], "--val-fraction 0.1 of 1 samples makes no"),
]

# Each case in one process of its own, as a user's command runs; all in one subprocess so that the test
# pays Python's start-up once. Prints, per case, the exit code and the heavy modules imported so far.
SCRIPT = """
import contextlib, io, json, sys
from kvbench.cli import main

for args in json.loads(sys.argv[1]):
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        try:
            main(args)
        except SystemExit as done:
            code = done.code
    heavy = [name for name in {heavy!r} if name in sys.modules]
    print(json.dumps({{"code": code, "stderr": stderr.getvalue(), "heavy": heavy}}))
"""


def test_misspelt_names_are_refused_with_a_suggestion_before_any_heavy_import(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(heavy=HEAVY), json.dumps([args for args, _ in MISSPELT])],
        capture_output=True,
        text=True,
        cwd=tmp_path,  # nothing may be written: the folder stays empty
    )
    assert done.returncode == 0, done.stderr
    outcomes = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(outcomes) == len(MISSPELT)
    for (args, message), outcome in zip(MISSPELT, outcomes, strict=True):
        assert outcome["code"] == 2, (args, outcome)
        lines = outcome["stderr"].strip().splitlines()
        assert len(lines) == 1 and message in lines[0], (args, outcome["stderr"])
        assert outcome["heavy"] == [], (args, outcome["heavy"])
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("name", "known", "said"),
    [
        ("knrom", ["knorm", "snapkv", "tova"], ": did you mean 'knorm'?"),
        ("snap", ["snapkv", "pyramidkv", "knorm"], ": did you mean 'snapkv'?"),
        ("xyzzy", ["knorm", "snapkv"], ""),  # nothing close: no guess
        (3, ["knorm"], ""),  # a YAML-typed value that is not text
    ],
)
def test_did_you_mean_names_the_close_names_only(name, known, said):
    assert did_you_mean(name, known) == said


def test_a_misspelt_press_argument_is_suggested():
    from kvbench.core.errors import BadInput
    from kvbench.presses import build_press

    with pytest.raises(BadInput, match="no argument 'windw_size': did you mean 'window_size'"):
        build_press("snapkv", 0.5, windw_size=8)


# One task of each kind of generator: RULER counts tokens with encode; the others render the chat
# template (agent traces as chat turns) and size with tokenize_sample.
SIZED_TASKS = [("niah_single_1", 512), ("vt", 1024), ("agent_system_fact", 1024), ("text_prose_quote", 512)]


@pytest.mark.parametrize(("task", "length"), SIZED_TASKS)
def test_tokenizer_files_give_the_samples_transformers_tokenizer_gives(task, length, embedded_tokenizer):
    from kvbench import tasks
    from kvbench.bridge import models
    from kvbench.tasks.prompt import tokenize_sample

    files = models.TokenizerFiles.open(models.EMBEDDED)
    assert files is not None
    ours, theirs = (
        tasks.load_samples(task, length=length, samples=2, seed=3, tokenizer=tokenizer)
        for tokenizer in (files, embedded_tokenizer)
    )
    assert [s.content_hash() for s in ours] == [s.content_hash() for s in theirs]
    for sample in ours:
        a, b = tokenize_sample(files, sample), tokenize_sample(embedded_tokenizer, sample)
        assert a.context_ids.tolist() == b.context_ids.tolist() and a.regions.tolist() == b.regions.tolist()
        assert a.question_ids.tolist() == b.question_ids.tolist()
    text = ours[0].context[:400]
    ids = embedded_tokenizer.encode(text, add_special_tokens=False)
    assert files.decode(ids, skip_special_tokens=True) == embedded_tokenizer.decode(
        ids, skip_special_tokens=True
    )


def test_tokenizer_files_are_read_once_per_folder_content_and_encode_as_read(tmp_path, tiny_llama_dir):
    """The same files give the same reader, whose encodings are the backend's (a caller changing the list
    it got changes nothing); changed files are read again."""
    import shutil

    from kvbench.bridge import models

    files = models.TokenizerFiles.open(tiny_llama_dir)
    assert files is not None and models.TokenizerFiles.open(tiny_llama_dir) is files
    text = "The quick brown fox " * 30
    first = files.encode(text, add_special_tokens=False)
    first.append(-1)
    assert (
        files.encode(text, add_special_tokens=False)
        == files.backend.encode(text, add_special_tokens=False).ids
    )
    assert files(text)["input_ids"] == files.backend.encode(text).ids
    folder = tmp_path / "edited"
    shutil.copytree(tiny_llama_dir, folder)
    (folder / "chat_template.jinja").write_text("{{ 'edited' }}")
    edited = models.TokenizerFiles.open(str(folder))
    assert edited is not files and edited is not None and edited.chat_template == "{{ 'edited' }}"


@pytest.mark.parametrize(
    ("press", "press_args"),
    [*((press.name, {}) for press in LEARNED), ("adakv", {"inner": "kvp"}), ("knorm", {})],
)
def test_learned_state_digests_from_files_are_those_the_built_presses_load(press, press_args, embedded_model):
    from kvbench.presses import build_press, press_state, press_state_from_files

    built = build_press(press, 0.5, **press_args)
    for inner in [built, *(getattr(built, "press", None),)]:
        if inner is not None and hasattr(inner, "post_init_from_model"):
            inner.post_init_from_model(embedded_model[0])
    expected = press_state(built)
    assert press_state_from_files(press, press_args, "smollm2-135m") == expected
    assert (expected is None) == (press == "knorm")


def test_learned_state_from_files_is_unknown_when_a_file_is_missing(tmp_path):
    from kvbench.presses import press_state_from_files

    with pytest.raises(LookupError):
        press_state_from_files("kvp", {"agents": str(tmp_path)}, "smollm2-135m")


HELD_RUN = """
import json, sys
from kvbench.cli import main
try:
    main(["run", "--press", "knorm", "--ratio", "0.5", "--task", "niah_single_1", "--length", "512",
          "--samples", "2", "--model", sys.argv[1], "--out", sys.argv[2]])
except SystemExit as done:
    code = done.code
heavy = [name for name in ("torch", "transformers", "kvpress") if name in sys.modules]
print(json.dumps({"code": code, "heavy": heavy}))
"""


def test_a_rerun_with_every_row_held_loads_no_model_nor_torch(tmp_path, tiny_llama_dir, monkeypatch):
    import kvbench
    from kvbench.harness import runner

    out = tmp_path / "results"
    setup = dict(
        tasks=["niah_single_1"], length=512, samples=2, model=tiny_llama_dir, out=out, progress=False
    )
    first = kvbench.run("knorm", 0.5, **setup)
    assert len(first) == 2
    rows = (out / "rows.jsonl").read_bytes()
    done = subprocess.run(
        [sys.executable, "-c", HELD_RUN, tiny_llama_dir, str(out)], capture_output=True, text=True
    )
    outcome = json.loads(done.stdout.splitlines()[-1])
    assert outcome == {"code": 0, "heavy": []}, done.stderr
    assert "knorm" in done.stdout and (out / "rows.jsonl").read_bytes() == rows  # nothing recomputed
    assert len(list((out / "runs").glob("*.json"))) == 2  # the rerun is recorded too
    # The held rerun makes its samples once: the run reads back the units held_plan made.
    made, plan_samples = [], runner.plan_samples
    monkeypatch.setattr(runner, "plan_samples", lambda *args: made.append(1) or plan_samples(*args))
    assert len(kvbench.run("knorm", 0.5, **setup)) == 2 and made == [1]
    monkeypatch.undo()
    # A row missing (another sample) takes the full path and computes just that row.
    more = kvbench.run("knorm", 0.5, **{**setup, "samples": 3})
    assert len(more) == 3 and (out / "rows.jsonl").read_bytes().startswith(rows)


def test_the_trainers_offer_the_architectures_and_weights_that_exist():
    from kvbench.learned.kvp import agent, config, reward

    assert tuple(agent.ARCHS) == config.ARCH_NAMES
    assert set(reward.TOP_SHARE) <= set(config.BUDGET_WEIGHTS)
