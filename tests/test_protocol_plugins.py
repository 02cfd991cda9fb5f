"""A protocol of the user's own in one file: registered from Python or installed through the entry point
group `kvbench.protocols`, run through the API and the CLI; and the one-line refusals of one that cannot be
used."""

import importlib.util
import sys
from types import SimpleNamespace

import pytest
from test_extending import install_plugin, invoke, rows_of, write_data
from test_extending_doc import doc_steps

import kvbench
from kvbench.core.config import PROTOCOLS, Protocol, register_protocol, usable_protocols
from kvbench.core.errors import BadInput

# docs/extending.md's protocol: the question prefilled with the context and compressed again every `every`
# decoding steps (query-aware and decode-time at once, which neither built-in protocol is).
(PROTOCOL_FILE,) = [text for kind, path, text in doc_steps() if path == "my_protocol.py"]


def load_protocol(folder) -> Protocol:
    path = folder / "my_protocol.py"
    path.write_text(PROTOCOL_FILE)
    spec = importlib.util.spec_from_file_location("my_protocol", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["my_protocol"] = module
    spec.loader.exec_module(module)
    return module.PROTOCOL


def predictions(frame) -> dict:
    return {(row.press, row.sample_id): row.prediction for row in frame.itertuples()}


def test_a_protocol_file_runs_and_matches_query_aware_where_it_never_compresses_again(
    tmp_path, tiny_llama_dir
):
    register_protocol(load_protocol(tmp_path))
    setup = dict(data=[write_data(tmp_path)], model=tiny_llama_dir, length=256, progress=False)
    presses = ["knorm", "tova", "streaming_llm"]
    # Answers of 8 tokens at most: compressing every 100 steps never fires, so the answers are query-aware's.
    never = kvbench.sweep(presses, [0.5], protocol="aware-decoding", every=100, out=tmp_path / "a", **setup)
    aware = kvbench.sweep(presses, [0.5], protocol="query-aware", out=tmp_path / "b", **setup)
    assert set(never.protocol) == {"aware-decoding"} and len(never) == len(aware) == 12
    assert all(dict(args) == {"every": 100} for args in never.protocol_args)
    assert predictions(never) == predictions(aware)
    rows = rows_of(tmp_path / "a")
    assert {row["protocol"] for row in rows} == {"aware-decoding"}


def test_an_installed_protocol_runs_by_name_from_the_command_line(tmp_path, tiny_llama_dir, monkeypatch):
    site = install_plugin(tmp_path / "site2", {"kvbench.protocols": "aware-decoding = kvplug_proto:PROTOCOL"})
    (site / "kvplug_proto.py").write_text(PROTOCOL_FILE)
    monkeypatch.syspath_prepend(str(site))
    PROTOCOLS.points = None  # look again at what is installed
    out = tmp_path / "out"
    args = ["run", "--press", "knorm", "--ratio", "0.5", "--data", write_data(tmp_path, 2)]
    result = invoke(
        *args, "--protocol", "aware-decoding", "--length", 256, "--model", tiny_llama_dir, "--out", out
    )
    assert result.exit_code == 0, result.output
    rows = rows_of(out)
    assert len(rows) == 2 and {row["protocol"] for row in rows} == {"aware-decoding"}
    assert all(row["protocol_args"] == {"every": 8} for row in rows)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (
            "aware-decoding = kvplug.missing:PROTOCOL",
            "protocols plugin 'aware-decoding' (kvplug.missing:PROTOCOL, from kvplug) failed to load: "
            "ModuleNotFoundError",
        ),
        (
            "aware-decoding = kvplug:exact",
            "protocols plugin 'aware-decoding' (kvplug:exact, from kvplug): loads function, not a kvbench "
            "Protocol",
        ),
    ],
)
def test_a_protocol_plugin_that_cannot_be_used_is_one_line_before_any_work(
    tmp_path, monkeypatch, line, message
):
    monkeypatch.syspath_prepend(str(install_plugin(tmp_path / "site", {"kvbench.protocols": line})))
    PROTOCOLS.points = None
    out = tmp_path / "out"
    result = invoke("run", "--press", "knorm", "--ratio", "0.5", "--protocol", "aware-decoding", "--out", out)
    assert result.exit_code == 2 and result.output.startswith(f"Error: {message}"), result.output
    assert result.output.count("\n") == 1 and not out.exists()
    # The broken plugin is left out of the options the other commands see.
    assert "aware-decoding" not in usable_protocols()


def test_a_protocol_takes_no_option_of_another(tmp_path):
    taken = Protocol("mine", "x", "my_protocol:run", "interval", 4)
    with pytest.raises(BadInput, match="--interval is the option of protocol 'decode-time'"):
        register_protocol(taken)
    with pytest.raises(BadInput, match="protocols 'streaming' is registered already"):
        register_protocol(Protocol("streaming", "x", "my_protocol:run"))


def test_ray_workers_register_the_protocol_the_plan_carries(tmp_path, tiny_llama_dir, monkeypatch):
    """Workers are other processes: they know kvbench's protocols only. Each fake worker here starts with
    the user's protocol gone from the registry, as a fresh process would, and must answer as one process."""
    from test_ray_sweep import FakeRay

    from kvbench.harness.ray_sweep import RayExecutor

    fake = FakeRay()
    start_worker = fake.remote

    def remote(**resources):
        def actor_class(cls):
            def fresh_process(*args):
                PROTOCOLS.unregister("aware-decoding")
                return start_worker(**resources)(cls).remote(*args)

            return SimpleNamespace(remote=fresh_process)

        return actor_class

    monkeypatch.setattr(fake, "remote", remote)
    monkeypatch.setattr("kvbench.harness.ray_sweep.import_ray", lambda: fake)
    protocol = register_protocol(load_protocol(tmp_path))
    setup = dict(data=[write_data(tmp_path)], model=tiny_llama_dir, length=256, progress=False, every=2)
    one = kvbench.sweep(["knorm", "tova"], [0.5], protocol="aware-decoding", out=tmp_path / "one", **setup)
    ray = kvbench.sweep(
        ["knorm", "tova"],
        [0.5],
        protocol="aware-decoding",
        out=tmp_path / "ray",
        executor=RayExecutor(workers=2),
        **setup,
    )
    assert len(fake.workers) == 2 and PROTOCOLS["aware-decoding"] is protocol
    assert predictions(ray) == predictions(one) and len(one) == 9
