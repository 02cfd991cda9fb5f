"""The built-in task families as the registry, the training mixtures and kvpress's interop read them: every
task's name, family, description, shortest length, kind and metrics, and the samples of a task of each
generated family and of a dataset read from files, pinned by digest (a results row is keyed by its sample's
`content_hash`, so a prompt that changes by a byte would score committed results again)."""

import hashlib
import json
import sys

import pytest

from kvbench.tasks import (
    METRICS,
    TASK_FAMILIES,
    jsonl,
    list_tasks,
    load_samples,
    reads_data_dir,
    sized_by_tokenizer,
)
from kvbench.tasks.family import Family
from kvbench.tasks.mixture import KINDS
from kvbench.tasks.published import HubFile
from kvbench.tasks.registry import BUILT_IN


def digest(value) -> str:
    return hashlib.sha1(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def test_the_task_tables_are_pinned():
    """Names, families, descriptions, shortest lengths, kinds, whether it reads --data-dir and is sized by the
    tokenizer, of every built-in task; and the metrics."""
    tasks = [
        (
            t.name,
            t.family,
            t.description,
            t.min_length,
            KINDS.get(t.name),
            reads_data_dir(t.name),
            sized_by_tokenizer(t.name),
        )
        for t in list_tasks()
    ]
    assert len(tasks) == 112
    assert digest(tasks) == "e6845c141da762b7"
    assert digest(sorted(METRICS.entries)) == "02fae05754cd2fbb"


def test_each_family_is_one_declaration():
    """A built-in family module declares its `FAMILY`, which the registry registers it under (in `BUILT_IN`'s
    order), which gives every task of it a kind, and whose kvpress datasets take its tasks and no other's."""
    assert all(isinstance(module.FAMILY, Family) for module in BUILT_IN)
    names = [module.FAMILY.name for module in BUILT_IN]
    assert [name for name in TASK_FAMILIES.entries if name in names] == names
    assert all(TASK_FAMILIES[module.FAMILY.name] is module for module in BUILT_IN)
    assert all(set(module.FAMILY.kinds) == set(module.TASKS) for module in BUILT_IN if module is not jsonl)
    assert jsonl.FAMILY.kinds == {}  # the user's own data: in no training mixture
    for module in BUILT_IN:
        for dataset in module.FAMILY.kvpress:
            taken = {
                task
                for other in BUILT_IN
                for task in other.TASKS
                if dataset.target({"task": task, "length": 4096, "meta": {}}) is not None
            }
            assert taken and taken <= set(module.TASKS), dataset.name


@pytest.fixture
def loogle_dir(tmp_path, monkeypatch):
    """LooGLE's QA file with two rows, the hub absent."""
    monkeypatch.setattr(HubFile, "local", lambda self: None)
    pairs = [{"Q": f"Where was Maren born ({i})?", "A": "In Vardø.", "S": "x"} for i in range(2)]
    rows = [{"input": "Maren was born in Vardø in 1919. " * 40, "qa_pairs": str(pairs), "output": "none"}] * 2
    (tmp_path / "shortdep_qa.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return tmp_path


# Generated offline from sources of the running Python (its reference topics, its standard library).
PYTHON = (3, 11)
SAMPLES = {  # task -> digest of the content hashes and ids of 2 samples at 512 tokens, seed 3
    "niah_single_1": "dbece28833afd2d0",
    "text_json_records": "0b75df0a4bd2710e",
    "fifth_cron_reboot": "c9201b9fbbcc0010",
    "recite_log": "d71feff15dc60ac5",
    "loogle/shortdep_qa": "129511362a5f9db9",
}


@pytest.mark.skipif(sys.version_info[:2] != PYTHON, reason="the generated sources are this Python's")
@pytest.mark.parametrize("task", SAMPLES)
def test_the_samples_are_pinned(task, embedded_tokenizer, loogle_dir):
    samples = load_samples(
        task, length=512, samples=2, seed=3, tokenizer=embedded_tokenizer, data_dir=loogle_dir
    )
    assert digest([(s.id, s.content_hash()) for s in samples]) == SAMPLES[task]
