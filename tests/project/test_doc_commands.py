"""Every `kvbench` command of README.md and docs/ runs here, as written or at a tiny size, unless its doc
marks it with `# needs ...` (a GPU, the hub, a Ray cluster, a download of the user's own, the package index,
the 1.5B model, which the suite never fetches): such a mark must
be true of the command. Each distinct command runs once, in an empty folder of its own that holds the
repository's committed folders (results/, presses/, agents/) and what the docs' commands take from the
user or from each other (`inputs`: data/ and agents/ made by `kvp datagen` and `kvp train` at tiny sizes,
`my_press.py`, `mine.jsonl`, a suite YAML, a folder of kvpress results). How each runs:

- `held`: a sweep, run or speed whose --out is a committed results folder (and whose learned state, a
  press argument naming agents/, presses/ or data/, is committed too) runs on a copy of that folder
  with model loading refused: every row must already be there (the committed rows are what the command
  writes) and the folder stays byte for byte as it was.
- `report`: a report, listing, export or import runs as written; where its --out is a committed report,
  its README.md is compared byte for byte with that one.
- `tiny`: a command that computes runs at the size `TINY` gives its subcommand (its options replaced or
  added) and `TINY_MIXTURES` gives `--mixture`: the same code path, options, checks and outputs as
  written, on one or two samples. A run or sweep keeps one sample of its first task (the suite's, at the
  task's shortest length) and its first ratio, memory or budget.

A tiny run checks what it wrote, not only its exit code: a run or sweep rows of every press it names, a
training or fitting command its card, datagen its manifest's prompts.

The tiny runs that still take from several to tens of seconds at a tiny size (`heavy`: MemDecay's lifetimes,
perplexity's forward per chunk and the streaming protocol's compression per chunk, prefix caching's serving
replay, the decode-heavy tasks' 250-token answers, a 2048-token context, KVzip's extra forward passes in a
press or in the targets a press is fitted to, lm-eval's reading of its 10,000 task files) carry the marker
`doc_runs`, which the default run deselects (`uv run --group dev pytest -m doc_runs` runs them): about
seven minutes on 2 cores. The rest run by default.
"""

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import transformers
from click.testing import CliRunner

from kvbench.cli import main
from kvbench.store.results import load_rows
from kvbench.tasks import family_of, load_suite, mixture
from tests.conftest import built_once, skip_drawing
from tests.harness.test_interop import leaderboard_like
from tests.project.test_usage_doc import DOCS, braces, marked_commands

ROOT = Path(__file__).resolve().parents[2]

# Per subcommand: the options a tiny run sets (replacing the doc's value, or added).
TINY = {
    ("run",): {"--samples": "1"},
    ("sweep",): {"--samples": "1"},
    ("kvp", "datagen"): {"--gen-tokens": "4", "--val-fraction": "0.5"},  # and, without --mixture, `TINY_DATA`
    ("kvp", "train"): {"--steps": "1", "--eval-every": "1", "--tokens": "32", "--rankings": "2"},
    ("distillcache", "train"): {"--steps": "1", "--eval-every": "1", "--samples": "2"},
    ("gate", "train"): {
        "--steps": "1",
        "--texts": "2",
        "--val-texts": "1",
        "--length": "32",
        "--eval-every": "1",
    },
    ("memdecay", "calibrate"): {"--samples": "1", "--task": "agent_system_fact", "--length": "1024"},
    ("memdecay", "lifetimes"): {
        "--samples": "2",
        "--new-tokens": "4",
        "--resamples": "10",
        "--length": "1024",
    },
    # The docs' largest --budget, 512, below what the cache holds before the last chunk of 16 (528).
    ("perplexity",): {"--texts": "1", "--length": "544"},
    ("speed",): {"--lengths": "128", "--new-tokens": "2", "--repeats": "1"},
    # A replayed --trace runs as it is (the inputs' trace is tiny).
    ("prefix-cache",): {"--requests": "4", "--docs": "3", "--chunk-chars": "60", "--answer-tokens": "0"},
    ("lm-eval",): {"--limit": "1"},
    ("fit",): {"--samples": "2"},  # with `TINY_MIXTURES`: two 512-token prompts (kvzap holds one out)
}
# Per fitted press: the `--option`s a tiny fit sets (its training loop's length).
TINY_FIT = {"fastkvzip": {"steps": "2"}, "kvzap": {"epochs": "1"}}
TINY_DATA = {"--tasks": "niah_single_1", "--length": "512", "--samples": "2"}
# `kvp datagen --mixture NAME` sets its own tasks, lengths and prompts: each mixture shrunk to two prompts
# of one task at 512 tokens (one for validation).
TINY_MIXTURES = {
    "ruler": [mixture.Part("niah_single_1", 512, 2)],
    "text": [mixture.Part("text_prose_quote", 512, 2)],
    "broad": [mixture.Part("niah_single_1", 512, 2)],
}
# Words the docs write for the user's own: what the test gives them.
PLACEHOLDERS = {"SUITE": "heldout", "results/FOLDER": "results/folder", "$agents": "ruler-uniform"}
HELD_COMMANDS = {("run",), ("sweep",), ("speed",)}
# Committed folders whose rows of one press are of a learned state older than the shipped one (their reports
# say which state they show): the documented command computes that press's rows again today, so the held
# check runs it without that press.
NOT_HELD = {
    "results/reference-memory": "kvp",  # agents 58260c05679a and older; shipped e4a3abdbc3db
    "results/reference-4k": "kvp",  # the same
    "results/reference-confirm": "distillcache",  # lacks rows of the shipped policy 0ee30a8ef3cc
}


def command_path(words: list[str]) -> tuple[str, ...]:
    """The subcommand words of `kvbench WORDS` (`kvp train`, `sweep`)."""
    return tuple(words[:2]) if words[0] in ("kvp", "distillcache", "gate", "memdecay") else (words[0],)


def option(words: list[str], name: str) -> str | None:
    return words[words.index(name) + 1] if name in words else None


def with_options(words: list[str], options: dict[str, str]) -> list[str]:
    """`words` with each option of `options` set to its value: replaced where given, else appended."""
    words = list(words)
    for name, value in options.items():
        if name in words:
            words[words.index(name) + 1] = value
        else:
            words += [name, value]
    return words


def with_method_options(words: list[str], options: dict[str, str]) -> list[str]:
    """`words` with each `--option NAME=VALUE` of `options` set: replaced where given, else appended."""
    words = list(words)
    for name, value in options.items():
        given = [
            i + 1
            for i, word in enumerate(words[:-1])
            if word == "--option" and words[i + 1].startswith(f"{name}=")
        ]
        if given:
            words[given[0]] = f"{name}={value}"
        else:
            words += ["--option", f"{name}={value}"]
    return words


def one_task(words: list[str]) -> list[str]:
    """A run or sweep cut to its first task: `--task` kept once, or the suite's first task at its shortest
    length (the suite's length is the command's to use, not a task's to need)."""
    if option(words, "--data") is not None:
        return words
    tasks = [words[i + 1] for i, word in enumerate(words) if word == "--task"]
    kept = [word for i, word in enumerate(words) if word != "--task" and (i == 0 or words[i - 1] != "--task")]
    if tasks:
        return kept + ["--task", tasks[0]]
    suite = load_suite(option(words, "--suite") or "ruler-smoke")
    task = suite.tasks[0]
    length = (
        []
        if suite.length is None or "--length" in words
        else ["--length", str(family_of(task).min_length(task))]
    )
    return kept + ["--task", task] + length


COMMANDS = dict(sorted({command: mark for path in DOCS for command, mark in marked_commands(path)}.items()))
MY_PRESS = """from dataclasses import dataclass

from kvpress import ScorerPress


@dataclass
class MyPress(ScorerPress):
    compression_ratio: float = 0.0

    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        return -keys.norm(dim=-1)
"""


# What the fixture `inputs` makes, in its folder, in order: the data and learned state the docs' commands
# read from each other (tiny), and a trace to replay.
INPUTS = [
    "kvp datagen --tasks niah_single_1 --length 512 --samples 2 --val-fraction 0.5 --gen-tokens 4"
    " --out data/ruler",
    "kvp datagen --tasks niah_single_1 --length 512 --samples 2 --val-fraction 0.5 --gen-tokens 4"
    " --reconstruction --out data/recon-ruler",
    "kvp datagen --tasks niah_single_1 --length 512 --samples 2 --val-fraction 0.5 --gen-tokens 4"
    " --target authors --out data/authors",
    "kvp train --data data/ruler --steps 1 --eval-every 1 --tokens 32 --rankings 2 --out agents/mine",
    "kvp train --data data/ruler --steps 1 --eval-every 1 --tokens 32 --rankings 2 --arch apple"
    " --out agents/apple",
    "distillcache train --data data/ruler --steps 1 --samples 2 --out agents/dc-ruler5-knorm",
    "sweep --presses kvp,snapkv,h2o,tova --ratios 0.5 --samples 1 --task niah_single_1 --length 512"
    " --out results/mine",
    "import --format kvpress results_lb results/kvpress",
]
# What the replay of someone else's trace reads (`DIR2/trace.jsonl`): a serving run of 20 s, made only for
# the long runs (`trace`), which alone replay it.
TRACE_INPUT = "prefix-cache --requests 4 --docs 3 --budgets 2 --out DIR2"
# Names the docs give the same kind of input: each is a link to one made above.
ALIASES = {
    "agents/ruler-uniform": "agents/mine",
    "agents/ruler-tenth": "agents/mine",
    "agents/ruler-mixed": "agents/mine",
    "agents/ruler-reconstruction": "agents/mine",
    "agents/ruler-apple": "agents/apple",
    "agents/authors": "agents/apple",
    "data/recipes-kvbench": "data/recon-ruler",
    "data/recipes-authors": "data/authors",
    "data/agents-kvbench": "agents/mine",
    "data/agents-authors": "agents/apple",
    "data/text": "data/ruler",
    "data/dc-ruler5": "data/ruler",
}


@pytest.fixture(scope="session")
def inputs(tmp_path_factory, worker_id) -> Path:
    """A folder of what the docs' commands read from the user (`my_press.py`, `mine.jsonl`, a suite YAML,
    kvpress results) or from each other (`INPUTS`, `ALIASES`)."""
    return built_once(tmp_path_factory, worker_id, "doc-inputs", build_inputs)


@pytest.fixture(scope="session")
def trace(inputs, tmp_path_factory, worker_id) -> Path:
    """`inputs` with `TRACE_INPUT` made in it too."""
    built_once(tmp_path_factory, worker_id, "doc-trace", lambda _: run_commands(inputs, [TRACE_INPUT]))
    return inputs


def run_commands(root: Path, commands: list[str]) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)
        for command in commands:
            result = CliRunner().invoke(main, shlex.split(command))
            assert result.exit_code == 0, f"kvbench {command}\n{result.output}"


def build_inputs(root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir()
    (root / "my_press.py").write_text(MY_PRESS)
    records = [(f"The code word is {word}. " * 20, word) for word in ("kiwi", "plum")]
    (root / "mine.jsonl").write_text(
        "".join(
            json.dumps({"context": context, "question": "What is the code word?", "answers": [word]}) + "\n"
            for context, word in records
        )
    )
    (root / "path" / "to").mkdir(parents=True)
    (root / "path" / "to" / "my_suite.yaml").write_text("tasks: [niah_single_1]\nlength: 512\nsamples: 1\n")
    leaderboard_like(root / "results_lb")
    run_commands(root, INPUTS)
    for alias, made in ALIASES.items():
        (root / alias).symlink_to(root / made)


def words_of(command: str) -> list[str]:
    """The command's arguments after `kvbench`: braces expanded, the docs' placeholders given values, and
    absolute folders of the study machine (/work/agents/...) made relative."""
    words = [expanded for word in shlex.split(command)[1:] for expanded in braces(word)]
    for placeholder, value in PLACEHOLDERS.items():
        words = [word.replace(placeholder, value) for word in words]
    return [word.removeprefix("/work/") for word in words]


def out_of(words: list[str]) -> str | None:
    """The folder the command writes: its --out, or the destination of export and import."""
    if words[0] in ("export", "import"):
        return words[-1]
    return option(words, "--out")


TRACKED = subprocess.run(
    ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
).stdout.split()


def is_committed(path: str) -> bool:
    return any(file == path or file.startswith(f"{path}/") for file in TRACKED)


def mode_of(words: list[str]) -> str:
    """`held`, `report` or `tiny` (the module's docstring)."""
    path = command_path(words)
    if path in (
        ("report",),
        ("kvp", "report"),
        ("gate", "report"),
        ("export",),
        ("import",),
        ("presses",),
        ("tasks",),
        ("models",),
        ("compare-models",),
    ):
        return "report"
    learned = re.findall(r"(?:^|=)((?:agents|presses|data)/[\w.-]+)", " ".join(words))
    out = out_of(words)
    held = path in HELD_COMMANDS and out is not None and out.startswith("results/") and is_committed(out)
    return "held" if held and all(is_committed(state) for state in learned) else "tiny"


def lay_out(folder: Path, inputs: Path | None, out: str | None) -> None:
    """`folder` holding links to the committed results/, presses/ and agents/ and to `inputs`, except where
    the command writes (`out`)."""
    committed = {"/".join(file.split("/")[: 3 if file.startswith("presses/") else 2]) for file in TRACKED}
    entries = [
        (ROOT, Path(path))
        for path in sorted(committed)
        if path.startswith(("results/", "presses/", "agents/"))
    ]
    if inputs is not None:
        entries += [
            (inputs, path.relative_to(inputs))
            for path in sorted(inputs.iterdir())
            if path.name not in ("data", "agents", "results")
        ]
        entries += [
            (inputs, path.relative_to(inputs))
            for pattern in ("data/*", "agents/*", "results/*")
            for path in sorted(inputs.glob(pattern))
        ]
    for source, relative in entries:
        if out is not None and (Path(out) == relative or relative in Path(out).parents):
            continue
        (folder / relative).parent.mkdir(parents=True, exist_ok=True)
        if not (folder / relative).exists():
            (folder / relative).symlink_to((source / relative).resolve())


def tiny(words: list[str], monkeypatch) -> list[str]:
    path = command_path(words)
    if path == ("prefix-cache",) and "--trace" in words:
        return words
    words = with_options(words, TINY.get(path, {}))
    if path == ("kvp", "datagen") and "--mixture" not in words:
        words = with_options(words, TINY_DATA)
    if path in (("run",), ("sweep",)):
        words = one_task(words)
        for name in ("--ratios", "--memory", "--budget"):
            if name in words:
                words = with_options(words, {name: option(words, name).split(",")[0]})
    if path == ("fit",):
        words = with_method_options(words, TINY_FIT.get(words[1], {}))
    if path == ("perplexity",) and option(words, "--every") == "1":
        words = with_options(words, {"--length": "64"})  # token by token: 64 tokens
    for name, parts in TINY_MIXTURES.items():
        monkeypatch.setitem(mixture.MIXTURES, name, parts)
    return words


def refuse_to_load(*args, **kwargs):
    raise AssertionError("a held command loaded a model: its committed folder lacks rows it computes")


def files_of(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and "runs" not in p.parts and p.suffix != ".lock"
    }


def reads_inputs(words: list[str]) -> bool:
    """Whether the command reads what `inputs` makes (a path of it, or a results/ or agents/ folder that is
    not committed), apart from the folder it writes."""
    out = out_of(words)
    paths = [part for word in words if word != out for part in re.split(r"[=(),]", word)]
    made = ("data/", "results_lb", "DIR2/", "mine.jsonl", "my_press.py", "path/to/")
    return any(
        path.startswith(made) or (path.startswith(("results/", "agents/")) and not is_committed(path))
        for path in paths
    )


def computes(command: str) -> bool:
    words = words_of(command)
    return not COMMANDS[command].startswith("needs ") and (mode_of(words) == "tiny" or reads_inputs(words))


HEAVY_COMMANDS = {("memdecay", "lifetimes"), ("perplexity",), ("prefix-cache",), ("lm-eval",)}
HEAVY_TASKS = {"recite_log", "list_crates"}  # decode-heavy: answers of ~250 tokens
HEAVY_PRESSES = {"kvzip", "kvgrad"}  # extra forward passes a context: 25-45 s on one tiny sample
HEAVY_FITS = {"kvzap", "fastkvzip"}  # fitted to KVzip's scores: its passes over a repeated context


def heavy(command: str) -> bool:
    """Whether a tiny run of `command` still takes tens of seconds (the module's docstring)."""
    words = words_of(command)
    long_context = option(words, "--length") is not None and int(option(words, "--length")) >= 2048
    tasks = {words[i + 1] for i, word in enumerate(words) if word == "--task"}
    authors = option(words, "--recipe") == "authors"  # a batch of whole prompts a step: 30 s at a tiny size
    presses = set((option(words, "--presses") or option(words, "--press") or "").split(","))
    fitted = command_path(words) == ("fit",) and words[1] in HEAVY_FITS
    return (
        command_path(words) in HEAVY_COMMANDS
        or bool(tasks & HEAVY_TASKS | presses & HEAVY_PRESSES)
        or option(words, "--protocol") == "streaming"
        or long_context
        or authors
        or fitted
    )


CHEAP = [command for command in COMMANDS if not computes(command)]
TINY_RUNS = [command for command in COMMANDS if computes(command) and not heavy(command)]
HEAVY_RUNS = [command for command in COMMANDS if computes(command) and heavy(command)]


def test_the_docs_are_read_and_split_as_this_module_says():
    assert len(CHEAP) > 50 and len(TINY_RUNS) > 30 and len(HEAVY_RUNS) > 5
    assert {"held", "report"} <= {mode_of(words_of(command)) for command in CHEAP}


@pytest.mark.parametrize("command", CHEAP, ids=[command[8:68] for command in CHEAP])
def test_a_documented_command_that_computes_nothing_new_runs(command, tmp_path, monkeypatch):
    check_command(command, None, tmp_path, monkeypatch)


@pytest.mark.parametrize("command", TINY_RUNS, ids=[command[8:68] for command in TINY_RUNS])
def test_a_documented_command_that_computes_runs_at_a_tiny_size(command, request, tmp_path, monkeypatch):
    inputs = request.getfixturevalue("inputs") if reads_inputs(words_of(command)) else None
    check_command(command, inputs, tmp_path, monkeypatch)


@pytest.mark.doc_runs
@pytest.mark.parametrize("command", HEAVY_RUNS, ids=[command[8:68] for command in HEAVY_RUNS])
def test_a_long_documented_command_runs_at_a_tiny_size(command, request, tmp_path, monkeypatch):
    inputs = request.getfixturevalue("trace" if "DIR2/" in command else "inputs")
    check_command(command, inputs, tmp_path, monkeypatch)


def check_outputs(words: list[str], out: Path) -> None:
    """What a tiny run must have written into `out`: rows of every press of a run or sweep (and of `none`
    with a sweep), a card for training, prompts for datagen."""
    path = command_path(words)
    if path in (("run",), ("sweep",)):
        named = option(words, "--press") or option(words, "--presses")
        presses = {name.partition("=")[0] for name in named.split(",")}
        presses = {name.rpartition(":")[2] if ".py:" in name else name for name in presses}
        written = set(load_rows(out)["press"])
        assert presses <= written and (path == ("run",) or "none" in written), written
    elif path[-1] == "train" or path == ("fit",):
        assert (out / "card.json").is_file()
    elif path == ("kvp", "datagen"):
        assert json.loads((out / "manifest.json").read_text())["shards"]


def check_command(command, inputs, tmp_path, monkeypatch):
    mark = COMMANDS[command]
    words = words_of(command)
    if mark.startswith("needs "):
        claims = {"GPU": "--device" in words and option(words, "--device").startswith("cuda")}
        claims |= {"hub": option(words, "--model") not in (None, "smollm2-135m"), "Ray": "--ray" in words}
        claims |= {"your own": "--data-dir" in words or "--gguf" in words}
        claims |= {"the package index": words[:2] == ["models", "fetch"] and "--gguf" not in words}
        claims |= {"the 1.5B model": any("qwen" in word for word in words)}  # it, or data made by it
        named = [claim for claim in claims if claim in mark]
        assert named and all(claims[claim] for claim in named), (
            f"`{command}`: its mark '{mark}' is not true of it"
        )
        pytest.skip(f"marked in its doc: {mark}")
    mode, out = mode_of(words), out_of(words)
    lay_out(tmp_path, inputs, out)
    monkeypatch.chdir(tmp_path)
    if mode == "held" and out in NOT_HELD:
        kept = [name for name in option(words, "--presses").split(",") if name != NOT_HELD[out]]
        words = with_options(words, {"--presses": ",".join(kept)})
    if mode == "held":
        shutil.copytree(ROOT / out, tmp_path / out)
        before = files_of(tmp_path / out)
        monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse_to_load)
    if mode == "tiny":
        words = tiny(words, monkeypatch)
    if mode == "report":  # a report's README is compared, not its plots' pixels
        skip_drawing(monkeypatch)
    result = CliRunner().invoke(main, words)
    assert result.exit_code == 0, f"{mode}: kvbench {shlex.join(words)}\n{result.output}"
    if mode == "held":
        assert files_of(tmp_path / out) == before
    elif out is not None:
        assert any((tmp_path / out).iterdir())
        if mode == "tiny":
            check_outputs(words, tmp_path / out)
    else:
        assert result.output.strip()
    if mode == "report" and words[0] == "report" and (ROOT / out / "README.md").is_file():
        assert (tmp_path / out / "README.md").read_text() == (ROOT / out / "README.md").read_text()
