"""Options that several commands share: the model, the tasks, the protocol, and Ray."""

from pathlib import Path

import click

from kvbench.bridge.models import EMBEDDED
from kvbench.cli.types import Folder, Names, Number, Whole
from kvbench.core.config import DEFAULT_PROTOCOL, PROTOCOLS, protocol_by_option, usable_protocols
from kvbench.core.errors import BadInput


def model_options(command):
    command = click.option(
        "--model",
        default=EMBEDDED,
        show_default=True,
        help="A built-in model (`kvbench models`), a GGUF file, a Hugging Face model id, or a local folder.",
    )(command)
    command = click.option("--device", default="cpu", show_default=True, help="torch device, e.g. cuda.")(
        command
    )
    command = click.option(
        "--dtype", default="float32", show_default=True, type=click.Choice(["float32", "bfloat16", "float16"])
    )(command)
    return command


def task_options(command):
    options = [
        click.option(
            "--suite",
            default=None,
            help="Suite name (default ruler-smoke; see `kvbench tasks`) or a suite YAML's path (its folder's "
            "task YAMLs are included).",
        ),
        click.option(
            "--task", "tasks", multiple=True, help="Task name (repeatable); overrides the suite's tasks."
        ),
        click.option(
            "--data",
            multiple=True,
            metavar="PATH",
            help="Your own samples as a task named after the file (repeatable): a .jsonl of {context, "
            "question, answers, id?}, a .parquet file or a datasets folder; overrides the suite's tasks.",
        ),
        click.option(
            "--metric",
            default=None,
            help="Metric of the --data tasks [qa_f1]: exact_match, contains, qa_f1, rouge, string_match_all, "
            "... or module:function / file.py:function returning a score in [0, 1].",
        ),
        click.option(
            "--include-path",
            multiple=True,
            metavar="DIR",
            help="Folder of task YAMLs (task, data, metric, fields, templates, ...) and suite YAMLs to add "
            "to the registry (repeatable).",
        ),
        click.option(
            "--length",
            type=Whole(),
            default=None,
            help="Context length in tokens (default: the suite's; LongBench: the model's own limit as THUDM"
            "'s pred.py sets it, 7500 for an 8k model; RULER without a suite: 1024).",
        ),
        click.option(
            "--samples", type=Whole(), default=None, help="Samples per task (default: the suite's)."
        ),
        click.option(
            "--seed", type=Whole(), default=0, show_default=True, help="Seed of the generated samples."
        ),
        click.option(
            "--data-dir",
            type=click.Path(path_type=Path),
            default=None,
            help="Folder of local task data (SQuAD/HotpotQA JSON, LongBench JSONL).",
        ),
        click.option(
            "--tokenizer",
            default=None,
            metavar="NAME_OR_PATH",
            help="Size and generate the samples with this tokenizer instead of the model's (default: the "
            "suite's, else the model's): a Hugging Face id (offline: from the local cache), a folder or "
            "the embedded alias. The model still reads them with its own.",
        ),
        click.option(
            "--out",
            type=Folder(),
            default=Path("results"),
            show_default=True,
            help="Results folder (appended to; finished rows are never recomputed; processes may share it).",
        ),
        click.option("--force", is_flag=True, help="Recompute rows that are already in --out."),
        click.option(
            "--batch-configs",
            type=Whole(1),
            default=16,
            show_default=True,
            help="Configs decoded together per sample (bounds memory).",
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def protocol_options(command):
    """--protocol, and each protocol's argument as an option of its own, from the protocols' registry
    (`config.PROTOCOLS`, plugins' included): a protocol registered there gets its options here. A plugin
    that fails to load has none, and says why in one line where it is named."""
    protocols = usable_protocols()
    options = [
        click.option(
            "--protocol",
            type=Names(PROTOCOLS),
            default=DEFAULT_PROTOCOL,
            show_default=True,
            help=" ".join(f"{name}: {protocol.description}." for name, protocol in protocols.items()),
        ),
        *(
            click.option(f"--{option}", type=Whole(), default=None, help=protocol.option_help)
            for option, protocol in protocol_by_option().items()
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def ray_options(command):
    """`sweep --ray [ADDRESS]`: the sweep's units spread over Ray workers (kvbench/harness/ray_sweep.py)."""
    options = [
        click.option(
            "--ray",
            "ray_address",
            is_flag=False,
            flag_value=_LOCAL_RAY,
            default=None,
            metavar="[ADDRESS]",
            help="Spread the sweep over Ray workers that each load the model once: a local cluster, or the "
            "running cluster at ADDRESS (e.g. auto, ray://head:10001). Needs kvbench[ray].",
        ),
        click.option(
            "--ray-workers",
            type=Whole(1),
            default=None,
            help="Ray workers [as many as the cluster's CPUs (or GPUs) hold].",
        ),
        click.option("--ray-cpus", type=Whole(1), default=None, help="CPU threads per worker [1]."),
        click.option("--ray-gpus", type=Number(0), default=None, help="GPUs per worker [0]."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


_LOCAL_RAY = "local"


def ray_executor(ray_address, ray_workers, ray_cpus, ray_gpus):
    """The sweep's executor on Ray, or None for one process."""
    if ray_address is None:
        for name, value in (("workers", ray_workers), ("cpus", ray_cpus), ("gpus", ray_gpus)):
            if value is not None:
                raise BadInput(f"--ray-{name} applies to a sweep with --ray")
        return None
    from kvbench.harness.ray_sweep import RayExecutor

    return RayExecutor(
        address=None if ray_address == _LOCAL_RAY else ray_address,
        workers=ray_workers,
        cpus=ray_cpus or 1,
        gpus=ray_gpus or 0.0,
    )
