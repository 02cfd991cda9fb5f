"""A protocol of the user's own in one file: registered from Python or installed through the entry point
group `kvbench.protocols`, run through the API and the CLI; and the one-line refusals of one that cannot be
used."""

import importlib.util
import re
import sys
from importlib.metadata import EntryPoint
from types import SimpleNamespace

import pytest

import kvbench
from kvbench.core.config import PROTOCOLS, Protocol, register_protocol, usable_protocols
from kvbench.core.errors import BadInput
from kvbench.core.registry import PluginError
from tests.core.test_extending import install_plugin, invoke, rows_of, write_data
from tests.project.test_extending_doc import doc_steps

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


def test_a_plugin_that_failed_to_load_is_not_imported_again_until_listed_anew(tmp_path, monkeypatch):
    """A report asks for a row's protocol once per row: a broken plugin fails each time, importing once."""
    line = "aware-decoding = kvplug.missing:PROTOCOL"
    monkeypatch.syspath_prepend(str(install_plugin(tmp_path / "site", {"kvbench.protocols": line})))
    PROTOCOLS.points = None
    loads, load = [], EntryPoint.load
    monkeypatch.setattr(EntryPoint, "load", lambda point: loads.append(point.name) or load(point))
    for _ in range(3):
        with pytest.raises(PluginError, match="failed to load: ModuleNotFoundError"):
            PROTOCOLS["aware-decoding"]
    assert loads == ["aware-decoding"]
    PROTOCOLS.points = None  # listed anew (installed again, say): tried anew
    with pytest.raises(PluginError):
        PROTOCOLS["aware-decoding"]
    assert loads == ["aware-decoding"] * 2


def test_a_protocol_takes_no_option_of_another(tmp_path):
    taken = Protocol("mine", "x", "my_protocol:run", "interval", 4)
    with pytest.raises(BadInput, match="--interval is the option of protocol 'decode-time'"):
        register_protocol(taken)
    with pytest.raises(BadInput, match="protocols 'streaming' is registered already"):
        register_protocol(Protocol("streaming", "x", "my_protocol:run"))


def test_ray_workers_register_the_protocol_the_plan_carries(tmp_path, tiny_llama_dir, monkeypatch):
    """Workers are other processes: they know kvbench's protocols only. Each fake worker here starts with
    the user's protocol gone from the registry, as a fresh process would, and must answer as one process."""
    from kvbench.harness.ray_sweep import RayExecutor
    from tests.harness.test_ray_sweep import FakeRay

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
    assert len(fake.workers) == 2 and PROTOCOLS["aware-decoding"] == protocol  # unpickled: a copy
    assert predictions(ray) == predictions(one) and len(one) == 9


RUN = "kvbench.engine.protocols.query_agnostic:run"
BAD_PROTOCOLS = {
    "a name with a space": (("my proto", "d", RUN), "protocol name 'my proto'"),
    "an empty name": (("", "d", RUN), "protocol name ''"),
    "a run that is a number": (("five", "d", 5), "run must be a function or a 'module:function' target"),
    "a run that is no target": (("p", "d", "query_agnostic.run"), "run must be a function or"),
    "an option kvbench takes": (("p", "d", RUN, "out", 5), "option 'out' is one of kvbench's own options"),
    "an option that is no keyword": (("p", "d", RUN, "every-2", 5), "option 'every-2' must be lower-case"),
    "a negative default": (("p", "d", RUN, "every", -4), "needs a default, a whole number >= 1"),
    "no default": (("p", "d", RUN, "every"), "needs a default"),
    "a boolean default": (("p", "d", RUN, "every", True), "needs a default"),
    "a default without an option": (("p", "d", RUN, None, 3), "a default (3) without an option"),
    "a flag that is a text": (("p", "d", RUN, None, None, "", "yes"), "its flags are True or False"),
}


@pytest.mark.parametrize("case", sorted(BAD_PROTOCOLS))
def test_a_protocol_that_cannot_be_one_is_refused_when_made(case):
    fields, message = BAD_PROTOCOLS[case]
    with pytest.raises(BadInput, match=re.escape(message)):
        Protocol(*fields)


def test_what_is_no_protocol_is_refused_in_one_line(tmp_path, monkeypatch):
    with pytest.raises(BadInput, match="register_protocol takes a kvbench Protocol, not dict"):
        register_protocol({"name": "x"})
    with pytest.raises(BadInput, match="unknown protocol"):
        kvbench.run("knorm", 0.5, protocol=["streaming"], out=tmp_path / "o")
    register_protocol(Protocol("lost", "its run is gone", "no_such_module:run"))

    def no_model(*args, **kwargs):
        raise AssertionError("the model loaded")

    monkeypatch.setattr("kvbench.bridge.models.load_model", no_model)
    with pytest.raises(BadInput, match="protocol 'lost' run 'no_such_module:run': cannot import"):
        kvbench.run("knorm", 0.5, protocol="lost", samples=1, out=tmp_path / "o")
    assert not (tmp_path / "o").exists()


def test_no_protocol_option_can_shadow_an_option_of_run_or_sweep():
    """RESERVED_OPTIONS holds every keyword of the API's run and sweep and every option of the commands
    that take --protocol: a protocol's option named like one would take its value from it."""
    import inspect

    import click

    from kvbench.cli import main
    from kvbench.core.config import RESERVED_OPTIONS, protocol_by_option
    from kvbench.harness import runner

    taken = set()
    for function in (runner.run, runner.sweep, runner.run_configs, runner.prepare_plan):
        taken |= {
            name for name, p in inspect.signature(function).parameters.items() if p.kind != p.VAR_KEYWORD
        }
    for name in ("run", "sweep"):
        for param in main.get_command(click.Context(main), name).params:
            taken |= {param.name, *(option.lstrip("-").replace("-", "_") for option in param.opts)}
    assert taken - set(protocol_by_option()) <= RESERVED_OPTIONS
