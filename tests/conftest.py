"""Shared fixtures: the embedded tokenizer and model, and the one tiny random-init model the tests build on
(in memory through `tiny_model`, saved as a local folder through `tiny_model_dir`)."""

import contextlib
import copy
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from filelock import FileLock
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from kvbench import presses, tasks
from kvbench.bridge import models
from kvbench.bridge.models import load_model, load_tokenizer
from kvbench.core import config
from kvbench.store import results


def built_once(tmp_path_factory, worker_id, name: str, build) -> Path:
    """The folder `name`, made by `build(folder)` once a run, by the first xdist worker to need it, in the
    folder the workers share, so that the tests reading it spread over the workers."""
    shared = tmp_path_factory.getbasetemp()
    shared = shared if worker_id == "master" else shared.parent
    with FileLock(str(shared / f"{name}.lock")):
        if not (shared / f"{name}.built").is_file():
            build(shared / name)
            (shared / f"{name}.built").touch()
    return shared / name


@pytest.fixture(autouse=True)
def clean_registries():
    """Each test registers its own presses, protocols, tasks, metrics and suites (users' own): none outlives
    it."""
    saved = (
        dict(presses.PRESSES.entries),
        presses.PRESSES.points,
        dict(tasks.METRICS.entries),
        tasks.METRICS.points,
        dict(tasks.TASK_FAMILIES.entries),
        tasks.TASK_FAMILIES.points,
        dict(tasks.jsonl.DATA_TASKS),
        dict(tasks.jsonl.TASKS),
        dict(tasks.SUITE_PATHS),
        dict(config.PROTOCOLS.entries),
        config.PROTOCOLS.points,
    )
    yield
    config.PROTOCOLS.entries, config.PROTOCOLS.points = saved[9], saved[10]
    presses.PRESSES.entries, presses.PRESSES.points = saved[0], saved[1]
    tasks.METRICS.entries, tasks.METRICS.points = saved[2], saved[3]
    tasks.TASK_FAMILIES.entries, tasks.TASK_FAMILIES.points = saved[4], saved[5]
    kept = ((tasks.jsonl.DATA_TASKS, saved[6]), (tasks.jsonl.TASKS, saved[7]), (tasks.SUITE_PATHS, saved[8]))
    for live, entries in kept:
        live.clear()
        live.update(entries)


@pytest.fixture(autouse=True)
def tokenizers_share_their_vocabulary(monkeypatch):
    """The tokenizers `models.read_tokenizer` gives a test share their folder's parsed vocabulary (the
    `tokenizers` backend, which kvbench never changes and whose copy is most of a deep copy's time) and copy
    all else, which tests do change (special tokens, the chat template). A test that adds tokens to a
    shared vocabulary fails at its end."""
    shared = {}

    def copy_sharing_vocabulary(tokenizer):
        vocabulary = tokenizer._tokenizer
        shared[id(vocabulary)] = (vocabulary, vocabulary.get_vocab_size(with_added_tokens=True))
        return copy.deepcopy(tokenizer, {id(vocabulary): vocabulary})

    monkeypatch.setattr(models, "copy", SimpleNamespace(deepcopy=copy_sharing_vocabulary))
    yield
    for vocabulary, size in shared.values():
        assert vocabulary.get_vocab_size(with_added_tokens=True) == size, (
            "a test added tokens to a shared tokenizer"
        )


@pytest.fixture(autouse=True, scope="session")
def one_lm_eval_task_index(tmp_path_factory, worker_id):
    """lm-eval's TaskManager reads all its ~10,000 task YAMLs (6 s on 2 cores) each time one is made; the
    tests make many, over lm-eval's folder and folders of their own, so they share one index per folder,
    merged in order as TaskIndex.build merges them (a later folder's task overrides). lm-eval's own folder
    is read by the first xdist worker that needs it and unpickled by the others. What a build reads is
    fixed for the session: tests write their own task YAMLs into folders of their own."""
    import pickle

    import lm_eval.tasks
    from lm_eval.tasks._index import TaskIndex

    build = TaskIndex.build
    built = {}
    lm_evals_own = str(Path(lm_eval.tasks.__file__).parent)

    def build_once(path, resolve_includes):
        if str(path) != lm_evals_own:
            return build([path], resolve_includes=resolve_includes)

        def save(folder):
            folder.mkdir()
            index = build([path], resolve_includes=resolve_includes)
            (folder / "index.pickle").write_bytes(pickle.dumps(index))

        folder = built_once(tmp_path_factory, worker_id, f"lm-eval-index-{resolve_includes}", save)
        return pickle.loads((folder / "index.pickle").read_bytes())

    def shared(paths, *, resolve_includes=True):
        index = {}
        for path in paths:
            key = (str(path), resolve_includes)
            if key not in built:
                built[key] = build_once(path, resolve_includes)
            index.update(built[key])
        return index

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(TaskIndex, "build", staticmethod(shared))
        yield


def pytest_addoption(parser):
    parser.addoption(
        "--device",
        default="cpu",
        help="where the tests that take the `device` fixture run their models (cpu, cuda, cuda:N)",
    )


@pytest.fixture(scope="session")
def device(request) -> str:
    """The --device the engine's tests run their models on; `uv run pytest --device cuda` checks the
    engine against kvpress's pipeline on a GPU."""
    name = request.config.getoption("--device")
    if name.startswith("cuda") and not torch.cuda.is_available():
        pytest.skip("--device cuda, but torch sees no CUDA device")
    return name


def pytest_configure(config):
    """Each xdist worker, and each process its tests start, runs torch on its share of the cores: two
    workers of two threads each on two cores spend much of their time waiting on each other's threads.
    A worker keeps the parsed rows of every committed results folder (about 40, read by several tests
    each), where a user's process keeps a few."""
    results.PARSED_FILES_KEPT = 64
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        threads = max(1, (os.cpu_count() or 1) // workers)
        os.environ["OMP_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)


def pytest_collection_modifyitems(config, items):
    """The documented commands (seconds each) go first, so that the workers end on tests of milliseconds;
    `gpu` tests skip without CUDA."""
    items.sort(key=lambda item: item.path.name != "test_doc_commands.py")
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def skip_drawing(monkeypatch) -> None:
    """Figures built but never drawn: savefig writes an empty file, and seaborn's heatmap skips the draw
    it makes to see whether tick labels overlap (kvbench sets their rotation itself). For tests of what a
    report says, not of its pixels."""
    import seaborn.matrix
    from matplotlib.figure import Figure

    monkeypatch.setattr(Figure, "savefig", lambda figure, path, *args, **kw: Path(path).write_bytes(b""))
    monkeypatch.setattr(seaborn.matrix, "_draw_figure", lambda figure: None)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models run several times faster on one thread than on cores shared with other work."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def prefill_into_cache(model, press, ids):
    """The context prefilled into a new cache, under `press` (None: uncompressed)."""
    cache = DynamicCache()
    with press(model) if press is not None else contextlib.nullcontext():
        model.model(input_ids=ids, past_key_values=cache)
    return cache


@pytest.fixture(scope="session")
def embedded_tokenizer():
    return load_tokenizer()


@pytest.fixture(scope="session")
def embedded_model():
    return load_model()


def build_tiny_model(architecture: str = "llama", vocab_size: int = 128, **config):
    """The tests' model: 2 layers, 4 query heads over 2 KV heads of 16 dims (hidden 64), random weights
    from seed 0, in eval mode. `config` changes the shape or adds fields, e.g. initializer_range=0.1 for
    peaked attention (so that which entries a press keeps changes the answer). (A pad_token_id zeroes that
    token's embedding at init: it is set only where asked.)"""
    torch.manual_seed(0)
    shape = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=vocab_size,
        head_dim=16,  # kvpress reads config.head_dim, which Qwen2Config does not define
        eos_token_id=2,
    )
    shape.update(config)
    if architecture == "qwen2":
        return Qwen2ForCausalLM(Qwen2Config(**shape)).eval()
    return LlamaForCausalLM(LlamaConfig(**shape)).eval()


@pytest.fixture(scope="session")
def tiny_model():
    """The tiny model's factory: tiny_model(architecture="llama", vocab_size=128, **config)."""
    return build_tiny_model


@pytest.fixture(scope="session", params=["llama", "qwen2"])
def tiny_model_dir(request, tmp_path_factory, embedded_tokenizer):
    """The tiny model with the embedded tokenizer, saved as a local folder (loadable by name), once per
    architecture."""
    return save_tiny_model(
        tmp_path_factory,
        embedded_tokenizer,
        request.param,
        max_position_embeddings=8192,
        pad_token_id=2,
        bos_token_id=None,
    )


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory, embedded_tokenizer):
    """The llama one only, with peaked attention: for tests of the bridges around the engine."""
    return save_tiny_model(
        tmp_path_factory, embedded_tokenizer, "llama", initializer_range=0.1, bos_token_id=None
    )


def save_tiny_model(tmp_path_factory, tokenizer, architecture: str, **config) -> str:
    folder = tmp_path_factory.mktemp(f"tiny-{architecture}")
    build_tiny_model(architecture, len(tokenizer), **config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)
