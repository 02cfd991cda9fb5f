"""Where kvbench's shipped files are: the suites (tasks/*.yaml), the lm-eval task YAMLs (tasks/lm_eval/) and
the learned presses' files (presses/<method>/<model>/: KVP agents, DistillCache policies, MemDecay
calibrations).

In the source tree they are top-level folders, so that a checkout's commands read and write them where the
docs say (`kvbench kvp train ... --out presses/kvp/smollm2-135m` ships new agents). The wheel carries
the same folders as package data under kvbench/_shipped/ (pyproject's wheel `sources`), read here with
importlib.resources; whatever file those folders hold when the wheel is built goes in, with no list to keep.
A checkout, or an editable install of it, has no kvbench/_shipped/ and reads the folders beside the package.
"""

from importlib import resources
from pathlib import Path

from kvbench.core.errors import KvbenchError

PACKAGED = "_shipped"  # the shipped folders' home inside an installed kvbench package
CHECKOUT = Path(__file__).resolve().parents[2]  # kvbench/core/resources.py: the checkout is two up


def packaged_root() -> Path | None:
    """kvbench/_shipped of an installed wheel, or None when kvbench runs from its source tree."""
    root = resources.files("kvbench") / PACKAGED
    if not root.is_dir():
        return None
    if not isinstance(root, Path):  # e.g. a zipped install: lm-eval and safetensors need real files
        # The install, not a bug: one line (exit 2), as any environment kvbench cannot run in.
        raise KvbenchError(f"kvbench's shipped files must be on disk, not in {root}: install it unzipped")
    return root


def checkout_root() -> Path | None:
    """The source tree kvbench runs from (a checkout or an editable install), or None for a wheel."""
    return CHECKOUT if packaged_root() is None else None


def shipped(*parts: str) -> Path:
    """A shipped file or folder, e.g. shipped("presses", "kvp", "smollm2-135m"); it need not exist."""
    return (packaged_root() or CHECKOUT).joinpath(*parts)


def suites_dir() -> Path:
    return shipped("tasks")


def lm_eval_tasks_dir() -> Path:
    return shipped("tasks", "lm_eval")


def learned_state_dir(method: str, model_folder: str) -> Path:
    """Where the shipped learned state of `method` (kvp, distillcache, memdecay) for a model lives."""
    return shipped("presses", method, model_folder)


def out_option(path: Path, press_arg: str) -> str:
    """How a command that makes shipped state should be told to write to `path`: `--out <path relative to
    the checkout>` from a source tree; from a wheel, whose package data is not the place for new files, a
    folder of one's own, given back to the press with `--press-arg <press_arg>=DIR`."""
    root = checkout_root()
    if root is not None and path.is_relative_to(root):
        return f"--out {path.relative_to(root)}"
    return f"--out DIR (then run with --press-arg {press_arg}=DIR)"
