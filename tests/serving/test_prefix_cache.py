"""The prefix-cache benchmark (kvbench.serving): exactness of each policy's reuse against a full
recompute on a tiny float64 model, the store's budget and eviction orders against plain references, replay
determinism,
and the command's bad input."""

import json

import pytest
import torch
from click.testing import CliRunner

from kvbench.cli import main
from kvbench.serving.replay import (
    Compression,
    Settings,
    apply_delta,
    cache_of,
    compare,
    replay,
    segment_bytes,
    segment_of,
    shift,
    sparse_delta,
)
from kvbench.serving.store import Store
from kvbench.serving.trace import Request, Trace, make_trace, read_trace, write_trace


class CharTokenizer:
    """One token per character (ids 3..122), so chunk boundaries are token boundaries."""

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [3 + ord(c) % 120 for c in text]}

    def decode(self, ids):
        return " ".join(map(str, ids))


@pytest.fixture(scope="module")
def model(tiny_model, one_thread):
    return tiny_model().double()


def hand_trace() -> Trace:
    chunks = {name: f"{name} text of chunk {name} " * 2 for name in ("a", "b", "c", "d")}
    orders = [
        ("a", "b", "c"),
        ("a", "b", "d"),
        ("b", "a", "c"),
        ("a", "b", "c"),
        ("c", "a", "b"),
        ("b", "a", "d"),
    ]
    return Trace(chunks, [Request(f"r{i}", "", tuple(order), "why?") for i, order in enumerate(orders)])


def test_exact_prefix_reuse_equals_full_recompute(model):
    trace = hand_trace()
    reference, _ = replay(model, CharTokenizer(), trace, "none", 10**9)
    for policy in ("prefix", "pegasus"):
        rows = compare(replay(model, CharTokenizer(), trace, policy, 10**9)[0], reference)
        assert sum(r["reused"] for r in rows) > 0, policy
        assert max(r["logit_error"] for r in rows) < 1e-9, policy
        assert all(r["answer_same"] for r in rows), policy


def test_stateless_chunk_reuse_loses_cross_chunk_attention(model):
    trace = hand_trace()
    reference, _ = replay(model, CharTokenizer(), trace, "none", 10**9)
    rows = compare(replay(model, CharTokenizer(), trace, "chunk", 10**9)[0], reference)
    assert rows[0]["logit_error"] > 1e-6  # chunks b, c computed alone lose a's (and b's) attention
    # the difference, measured: far above float64 noise on every request with more than one chunk
    assert min(r["logit_error"] for r in rows) > 1e-6
    # the rotation of a chunk computed alone is right: a request made of one chunk reused elsewhere is exact
    single = Trace(trace.chunks, [Request("x", "", ("b",), "q"), Request("y", "", ("b",), "q")])
    ref, _ = replay(model, CharTokenizer(), single, "none", 10**9)
    got = compare(replay(model, CharTokenizer(), single, "chunk", 10**9)[0], ref)
    assert got[1]["reused"] > 0 and got[1]["logit_error"] < 1e-9


KNORM = Compression("knorm", 0.5)


@pytest.mark.parametrize("policy", ["prefix", "chunk", "pegasus"])
def test_compressed_store_holds_fewer_bytes_per_entry_within_its_budget(model, policy):
    trace = hand_trace()
    budget = 20_000  # bytes: a few entries of the tiny model (a token is 256 bytes)
    full, _ = replay(model, CharTokenizer(), trace, policy, budget)
    pressed, run = replay(model, CharTokenizer(), trace, policy, budget, compression=KNORM)
    for row in full + pressed:
        assert row["bytes_held"] <= budget
    per_entry = [
        sum(r["bytes_held"] for r in rows) / sum(r["entries_held"] for r in rows) for rows in (full, pressed)
    ]
    assert per_entry[1] < 0.6 * per_entry[0]  # knorm at 0.5 keeps half of each entry's KV entries
    # the bytes are those of the entries actually held, counted at 16 bits
    held = run.store.nodes()
    assert run.store.held == sum(n.nbytes for n in held)
    segments = [n.payload[0] if policy == "pegasus" else n.payload for n in held if not n.is_transition]
    assert [n.nbytes for n in held if not n.is_transition] == [segment_bytes(s) for s in segments]
    assert max(r["entries_held"] for r in pressed) > max(r["entries_held"] for r in full)  # more fit


@pytest.mark.parametrize("policy", ["prefix", "chunk", "pegasus"])
def test_compression_at_ratio_0_is_the_uncompressed_policy(model, policy):
    trace = hand_trace()
    full, _ = replay(model, CharTokenizer(), trace, policy, 20_000)
    zero, _ = replay(model, CharTokenizer(), trace, policy, 20_000, compression=Compression("knorm", 0.0))
    keys = ("hits", "misses", "reused", "answer_ids", "bytes_held", "entries_held")
    assert [[r[k] for k in keys] for r in full] == [[r[k] for k in keys] for r in zero]
    assert all(torch.equal(a["logits"], b["logits"]) for a, b in zip(full, zero, strict=True))


@pytest.mark.parametrize("press", [KNORM, Compression("snapkv", 0.5, (("window_size", 4),))])
def test_compressed_reuse_moves_the_logits_and_the_error_is_measured(model, press):
    trace = hand_trace()
    reference, _ = replay(model, CharTokenizer(), trace, "none", 10**9)
    rows = compare(replay(model, CharTokenizer(), trace, "prefix", 10**9, compression=press)[0], reference)
    reusing = [r for r in rows if r["reused"]]
    assert reusing and min(r["logit_error"] for r in reusing) > 1e-6  # attends to a compressed prefix
    # a request that reuses nothing answers from the full KV it computed: exact
    assert all(r["logit_error"] < 1e-9 for r in rows if not r["reused"])
    assert all(r["compress_s"] > 0 for r in rows if r["misses"])  # the new entries were pressed


def states(model, prefix: list[int], chunk: list[int]):
    cache = cache_of([])
    with torch.no_grad():
        model(input_ids=torch.tensor([prefix + chunk]), past_key_values=cache, use_cache=True)
    return segment_of(cache, len(prefix), len(prefix) + len(chunk))


@pytest.mark.parametrize("tol", [0.0, 0.05])
def test_transition_gives_target_within_tolerance(model, tol):
    tokenizer = CharTokenizer()
    a, b, c = (tokenizer(t)["input_ids"] for t in ("first path ", "another longer path ", "the chunk"))
    base, target = states(model, a, c), states(model, b, c)
    rotated = shift(model, base, len(b) - len(a))
    delta, nbytes, fractions = sparse_delta(target, rotated, tol)
    rebuilt = apply_delta(rotated, delta)
    for (rk, rv), (tk, tv) in zip(rebuilt, target, strict=True):
        assert (rk - tk).abs().max() <= tol + 1e-12 and (rv - tv).abs().max() <= tol + 1e-12
    assert len(fractions) == 2 and nbytes > 0
    # layer 0's KV does not depend on the path once positions are rotated: nothing to keep there
    assert fractions[0] < 1e-9 if tol > 0 else True
    assert fractions[1] > 0


def test_store_never_exceeds_budget():
    import random

    rng = random.Random(0)
    store = Store(1000, "rppc")
    for _ in range(500):
        path = [rng.randrange(4) for _ in range(rng.randint(1, 4))]
        found = store.match(path)
        store.pin(found)
        parent = found[-1] if found else store.root
        for label in path[len(found) :]:
            parent = store.insert(parent, label, None, rng.randint(50, 400), rng.random())
            assert store.held <= 1000
            assert store.held == sum(n.nbytes for n in store.nodes())
            if parent is None:
                break
        store.pin([])
    assert store.insert(store.root, "big", None, 1001, 1.0) is None


def lru_reference(ops, budget, size):
    """Plain LRU over flat keys: a list ordered by last use; evict from the front."""
    order, evicted = [], []
    for key in ops:
        if key in order:
            order.remove(key)
        else:
            while (len(order) + 1) * size > budget:
                evicted.append(order.pop(0))
        order.append(key)
    return evicted


def test_lru_eviction_order_matches_a_plain_reference():
    ops = ["a", "b", "c", "a", "d", "b", "e", "a", "c", "f", "a"]
    store = Store(30, "lru")
    for key in ops:
        if not store.match([key]):
            store.insert(store.root, key, None, 10, 1.0)
        store.pin([])
    assert [path[0] for _, path in store.evicted] == lru_reference(ops, 30, 10)
    # in a tree, the tip goes before the path it hangs on, even when the path is older
    tree = Store(30, "lru")
    x = tree.insert(tree.root, "x", None, 10, 1.0)
    tree.insert(x, "y", None, 10, 1.0)
    tree.pin([])
    tree.insert(tree.root, "z", None, 10, 1.0)
    tree.pin([])
    tree.insert(tree.root, "w", None, 10, 1.0)
    assert tree.evicted == [("dropped", ("x", "y"))]


def test_rppc_eviction_order_matches_a_plain_reference():
    # (key, bytes, latency saved) inserted once, then hit as listed; budget forces evictions
    sizes = {"a": 10, "b": 20, "c": 10, "d": 30, "e": 10}
    saved = {"a": 5.0, "b": 40.0, "c": 1.0, "d": 30.0, "e": 2.0}
    ops = ["a", "b", "a", "c", "a", "d", "c", "e"]
    store = Store(50, "rppc")
    held, hits, last, evicted, tick = {}, {}, {}, [], 0
    for key in ops:
        tick += 1
        if key in held:
            hits[key] += 1
            last[key] = tick
        else:
            while sum(sizes[k] for k in held) + sizes[key] > 50:
                victim = min(held, key=lambda k: (hits[k] * saved[k] / sizes[k], last[k]))
                evicted.append(victim)
                del held[victim]
            tick += 1
            held[key], hits[key], last[key] = True, 1, tick
        if not store.match([key]):
            store.insert(store.root, key, None, sizes[key], saved[key])
        store.pin([])
    assert [path[0] for _, path in store.evicted] == evicted
    assert evicted  # the trace does evict


def test_replay_is_deterministic(model):
    trace = make_trace(12, seed=3, docs=4, k=2, chunk_chars=30, sessions=2)
    block = Settings(block=8)
    bpt = 2 * 2 * 2 * 16 * 2
    runs = [replay(model, CharTokenizer(), trace, "pegasus", 300 * bpt, block)[0] for _ in range(2)]
    keys = ("hits", "misses", "reused", "answer_ids", "bytes_held")
    assert [[r[k] for k in keys] for r in runs[0]] == [[r[k] for k in keys] for r in runs[1]]
    assert any(r["hits"] for r in runs[0]) and any(r["misses"] for r in runs[0])


def test_trace_round_trip_and_seed(tmp_path):
    trace = make_trace(30, seed=1)
    write_trace(trace, tmp_path / "t.jsonl")
    assert read_trace(tmp_path / "t.jsonl") == trace
    assert make_trace(30, seed=1) == trace and make_trace(30, seed=2) != trace
    sessions = [r for r in trace.requests if r.session]
    assert sessions and any(len(r.chunks) > 2 for r in sessions)


BAD_TRACES = {
    "malformed": "{not json\n",
    "empty": "",
    "unknown chunk": json.dumps(
        {"kind": "request", "id": "r", "session": "", "chunks": ["x"], "question": "q"}
    ),
    "no kind": json.dumps({"id": "r"}),
}


@pytest.mark.parametrize("case", BAD_TRACES)
def test_bad_trace_exits_2_writing_nothing(tmp_path, case):
    path = tmp_path / "trace.jsonl"
    path.write_text(BAD_TRACES[case])
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["prefix-cache", "--out", str(out), "--trace", str(path)])
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1
    assert not out.exists()


@pytest.mark.parametrize(
    "args",
    [
        ["--budgets", "0"],
        ["--budgets", "-1"],
        ["--budgets", "0.1"],
        ["--policies", "lru"],
        ["--policies", ""],
    ],
)
def test_bad_options_exit_2_writing_nothing(tmp_path, args):
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["prefix-cache", "--out", str(out), *args])
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1
    assert not out.exists()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--press", "knrm", "--ratio", "0.5"], "unknown press 'knrm'"),
        (["--press", "knorm", "--ratio", "1"], "--ratio must be in [0, 1)"),
        (["--press", "knorm", "--ratio", "nan"], "finite"),
        (["--press", "knorm", "--ratio", "-0.1"], "--ratio must be in [0, 1)"),
        (["--press", "knorm"], "needs --ratio"),
        (["--ratio", "0.5"], "need --press"),
        (["--press", "quant", "--ratio", "0.5"], "codec"),
        (["--press", "adakv", "--ratio", "0.5"], "cannot compress a store entry"),
        (["--press", "knorm", "--ratio", "0.5", "--press-arg", "foo=1"], "no argument 'foo'"),
    ],
)
def test_bad_press_exits_2_before_the_model_loads(tmp_path, args, says):
    out = tmp_path / "out"
    # a model that does not exist: refused for the press, so the model was never looked for
    result = CliRunner().invoke(main, ["prefix-cache", "--out", str(out), "--model", "no-such/model", *args])
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1 and says in result.output
    assert not out.exists()


def test_snapkv_window_longer_than_an_entry_is_refused(tmp_path, tiny_llama_dir):
    out = tmp_path / "out"
    args = [
        "prefix-cache",
        "--out",
        str(out),
        "--model",
        tiny_llama_dir,
        "--press",
        "snapkv",
        "--ratio",
        "0.5",
    ]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2 and "window_size=N with N below 16" in result.output, result.output
    assert not out.exists()


@pytest.fixture(scope="module")
def command_run(tmp_path_factory, tiny_llama_dir):
    """A `kvbench prefix-cache` run on the tiny model, compressed rows included: (its folder, its args)."""
    out = tmp_path_factory.mktemp("prefix-cache") / "out"
    args = ["prefix-cache", "--out", str(out), "--model", tiny_llama_dir, "--requests", "6"]
    args += ["--chunk-chars", "40", "--budgets", "0.01,1", "--answer-tokens", "1"]
    args += ["--press", "knorm", "--ratio", "0.5"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    result = CliRunner().invoke(main, args)
    torch.set_num_threads(threads)
    assert result.exit_code == 0, result.output
    return out, args


def test_command_writes_trace_rows_and_summary(command_run):
    out, args = command_run
    summary = json.loads((out / "summary.json").read_text())
    runs = [(s["policy"], s["press"]) for s in summary["summary"]["policies"]]
    pairs = [("prefix", "none"), ("prefix", "knorm@0.5")] * 2
    pairs += [("chunk", "none"), ("chunk", "knorm@0.5")] * 2 + [
        ("pegasus", "none"),
        ("pegasus", "knorm@0.5"),
    ] * 2
    assert runs == [("none", "none"), *pairs]
    assert len((out / "requests.jsonl").read_text().splitlines()) == 6 * 13
    assert read_trace(out / "trace.jsonl").requests  # the trace replayed is an artefact that reads back
    assert "| prefix | knorm@0.5 | 1 |" in (out / "summary.md").read_text()
    again = CliRunner().invoke(main, args)  # the folder holds a run: refused, nothing overwritten
    assert again.exit_code == 2


def test_plots_hold_one_series_per_run(command_run):
    from matplotlib.image import imread

    from kvbench.reporting import prefix_cache as plots

    out, _ = command_run
    summaries = json.loads((out / "summary.json").read_text())["summary"]["policies"]
    rows = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    policies = ["none", "prefix", "chunk", "pegasus"]
    markdown = (out / "summary.md").read_text()
    for name in plots.PLOTS:
        assert f"]({name})" in markdown
        height, width, _ = imread(out / name).shape
        assert width > height > 300
    # TTFT: one step line per run (13), each over every request, labelled with its policy, press and budget
    (ax,) = plots.ttft_figure(rows, policies).axes
    lines = ax.get_lines()
    assert len(lines) == len(summaries) == 13
    assert all(len(line.get_xdata()) == 6 for line in lines)
    assert {line.get_label() for line in lines} >= {"none", "pegasus + knorm@0.5, 1 MiB", "chunk, 0.01 MiB"}
    assert sum(line.get_linestyle() == "--" for line in lines) == 6  # the compressed runs
    # hit rate: one line per (policy, press) over the two budgets, at the summaries' values
    (ax,) = plots.hit_rate_figure(summaries, policies).axes
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert len(lines) == 6
    for s in summaries[1:]:
        line = lines[plots.run_label(s["policy"], s["press"])]
        assert s["hit_rate"] in list(line.get_ydata())
    # accuracy: one point per run on each panel, at its TTFT ratio and its accuracy
    error_ax, same_ax = plots.accuracy_figure(summaries, policies).axes
    assert len(error_ax.collections) == len(same_ax.collections) == 13
    base = summaries[0]["ttft_total_s"]
    for s, point in zip(summaries, same_ax.collections, strict=True):
        x, y = point.get_offsets()[0]
        assert x == pytest.approx(s["ttft_total_s"] / base) and y == pytest.approx(s["answer_same"])
