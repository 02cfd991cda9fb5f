"""kvbench: benchmark and comparison harness for KV-cache compression.

The Python API is what the `kvbench` command line calls, and scores the same rows:

    import kvbench

    rows = kvbench.sweep(["knorm", "snapkv"], [0.25, 0.5], tasks=["niah_single_1"], samples=2, out="results")
    kvbench.report("results", out="reports/mine")

`run`, `sweep` (kvbench.harness.runner), `report` (kvbench.reporting), `load_results` (a DataFrame of the
rows of results folders), the look-ups `list_presses`, `list_tasks`, `list_suites`, `load_samples`, the
registrations of a user's own work `register_press`, `register_protocol` (with `Protocol`),
`register_family`, `register_metric`, `register_data_task` (with `DataTask`), and the dataclasses `Row`,
`Config`, `Plan`, `Unit`, `Sample`, `Suite`. `sweep` and `run` also take presses as objects or targets
(docs/extending.md). Names load on first use, so that `import kvbench` (and `kvbench --help`) stays fast;
errors are kvbench.core.errors' types.
"""

import importlib
import sys
from typing import TYPE_CHECKING

from kvbench.core.errors import (
    BadInput,
    DataFileError,
    KvbenchError,
    KvbenchWarning,
    ModelNotFound,
    ResultsWriteError,
    TaskUnavailable,
    UnknownPress,
    UnknownTask,
)

if TYPE_CHECKING:  # what the names below resolve to, for type checkers and editors
    from kvbench.bridge.models import load_model
    from kvbench.core.config import Config, Protocol, register_protocol
    from kvbench.core.registry import PluginError
    from kvbench.engine import evaluate_sample
    from kvbench.harness.runner import Plan, Unit, evaluate_unit, run, run_configs, sweep
    from kvbench.presses import PressSpec, build_press, list_presses, register_press
    from kvbench.reporting import render_report as report
    from kvbench.store.results import ResultsStore, Row
    from kvbench.store.results import load_rows as load_results
    from kvbench.tasks import (
        Sample,
        Suite,
        TaskInfo,
        list_suites,
        list_tasks,
        load_samples,
        register_data_task,
        register_family,
        register_metric,
    )
    from kvbench.tasks.jsonl import DataTask

LAZY = {
    "run": "kvbench.harness.runner:run",
    "sweep": "kvbench.harness.runner:sweep",
    "run_configs": "kvbench.harness.runner:run_configs",
    "evaluate_unit": "kvbench.harness.runner:evaluate_unit",
    "Plan": "kvbench.harness.runner:Plan",
    "Unit": "kvbench.harness.runner:Unit",
    "report": "kvbench.reporting:render_report",
    "load_results": "kvbench.store.results:load_rows",
    "Row": "kvbench.store.results:Row",
    "ResultsStore": "kvbench.store.results:ResultsStore",
    "Config": "kvbench.core.config:Config",
    "Protocol": "kvbench.core.config:Protocol",
    "register_protocol": "kvbench.core.config:register_protocol",
    "list_presses": "kvbench.presses:list_presses",
    "build_press": "kvbench.presses:build_press",
    "PressSpec": "kvbench.presses:PressSpec",
    "list_tasks": "kvbench.tasks:list_tasks",
    "list_suites": "kvbench.tasks:list_suites",
    "load_samples": "kvbench.tasks:load_samples",
    "Sample": "kvbench.tasks:Sample",
    "Suite": "kvbench.tasks:Suite",
    "TaskInfo": "kvbench.tasks:TaskInfo",
    "load_model": "kvbench.bridge.models:load_model",
    "register_press": "kvbench.presses:register_press",
    "register_family": "kvbench.tasks:register_family",
    "register_metric": "kvbench.tasks:register_metric",
    "register_data_task": "kvbench.tasks:register_data_task",
    "DataTask": "kvbench.tasks.jsonl:DataTask",
    "PluginError": "kvbench.core.registry:PluginError",
    "evaluate_sample": "kvbench.engine:evaluate_sample",
    "check_press": "kvbench.diagnostics.conformance:check_press",
}

__all__ = [  # the lazy names above, kvbench's errors, and the console script
    "run",
    "sweep",
    "run_configs",
    "evaluate_unit",
    "Plan",
    "Unit",
    "report",
    "load_results",
    "Row",
    "ResultsStore",
    "Config",
    "list_presses",
    "build_press",
    "PressSpec",
    "list_tasks",
    "list_suites",
    "load_samples",
    "Sample",
    "Suite",
    "TaskInfo",
    "load_model",
    "evaluate_sample",
    "check_press",
    "register_press",
    "register_protocol",
    "Protocol",
    "register_family",
    "register_metric",
    "register_data_task",
    "DataTask",
    "PluginError",
    "BadInput",
    "DataFileError",
    "KvbenchError",
    "KvbenchWarning",
    "ModelNotFound",
    "ResultsWriteError",
    "TaskUnavailable",
    "UnknownPress",
    "UnknownTask",
    "main",
]


def __getattr__(name: str):
    if name not in LAZY:
        raise AttributeError(f"module 'kvbench' has no attribute {name!r}")
    module, attribute = LAZY[name].split(":")
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value  # loaded once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(LAZY))


def main():
    """The `kvbench` console script: Ctrl-C while the CLI's modules import is one line and exit 130 too
    (once a command runs, `kvbench.cli.Group` says the same)."""
    try:
        from kvbench.cli import main as cli
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    return cli()
