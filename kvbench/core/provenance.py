"""Where a result came from: the checkout's commit, the package versions and the hardware. Every writer of a
run record (runner, lm-eval bridge) and of a training card uses these, so records have one shape."""

import os
import platform
import shlex
import subprocess
import sys
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version

from kvbench.core.resources import checkout_root

PACKAGES = ("kvbench", "torch", "transformers", "kvpress", "datasets", "lm-eval", "accelerate", "flash-attn")


def package_versions() -> dict:
    versions = {"python": platform.python_version()}
    for package in PACKAGES:
        try:
            versions[package] = version(package)
        except PackageNotFoundError:
            pass
    return versions


def hardware(device: str) -> dict:
    """What the timings ran on: CPU cores and, on CUDA, the GPU's name."""
    found = {"machine": platform.machine(), "cpus": os.cpu_count()}
    if device.startswith("cuda"):
        import torch

        found["gpu"] = torch.cuda.get_device_name(device)
    return found


def git_commit() -> str | None:
    """The checkout's commit (-dirty with uncommitted changes); None for an installed wheel (its version is
    in the record's versions)."""
    root = checkout_root()
    if root is None:
        return None
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return commit + ("-dirty" if dirty else "")


def working_folder_commit() -> str | None:
    """`git describe --always` of the working folder, as lm-eval records it in its results; None outside a
    git checkout, where git's own complaint ("fatal: not a git repository") is not shown."""
    try:
        return subprocess.run(
            ["git", "describe", "--always"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def command_line() -> str:
    """The command this process runs, as a shell would take it back (each argument quoted where needed)."""
    return shlex.join(["kvbench", *sys.argv[1:]])


def run_record(config: dict, summary: dict, device: str, started: str, finished: bool = True) -> dict:
    """The one shape of a run record (results/<folder>/runs/*.json), whoever writes it: the command line,
    the run's config, a score summary per config and task, the versions, the hardware, the commit, and when
    it started and (once done) finished."""
    return {
        "command": command_line(),
        "config": config,
        "summary": summary,
        "versions": package_versions(),
        "hardware": hardware(device),
        "git_commit": git_commit(),
        "started": started,
        "finished": datetime.now(timezone.utc).isoformat() if finished else None,
    }
