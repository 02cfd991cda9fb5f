"""`kvbench check-press`: the command, thin over kvbench.diagnostics.conformance (loaded when it runs)."""

import sys
from pathlib import Path

import click
from tqdm.auto import tqdm

from kvbench.bridge.models import EMBEDDED
from kvbench.cli.types import Folder
from kvbench.diagnostics.conformance import board, check_press, checkable_presses, failed, record_of, table
from kvbench.store.conformance import write_record


@click.command("check-press")
@click.argument("press", required=False)
@click.option(
    "--press-arg", "press_args", multiple=True, metavar="KEY=VALUE", help="Press parameter (repeatable)."
)
@click.option(
    "--model",
    default=None,
    help=f"The model checked beside the tiny ones (without --quick). [default: {EMBEDDED}]",
)
@click.option("--quick", is_flag=True, help="The tiny random-init models only (under a minute).")
@click.option(
    "--out",
    type=Folder(),
    default=None,
    help="Results folder to leave the verdicts in (OUT/conformance/PRESS.json): `kvbench report` shows them "
    "beside the press's scores.",
)
@click.option(
    "--all", "every", is_flag=True, help="Every press of the registry, one line each, instead of PRESS."
)
@click.option(
    "--markdown",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="With --all: also write the board as markdown to this file.",
)
def check_press_command(press, press_args, model, quick, out, every, markdown):
    """Whether PRESS does what it claims: budget, memory, cache order, determinism, isolation, parity.

    PRESS is a registered name, `module:Class` or `path/to/file.py:Class`. The battery runs on tiny
    random-init float64 models (Llama-shaped with grouped KV heads, Qwen2-shaped without) and, unless
    --quick, on --model; it prints one table: check, verdict (pass, fail, n/a), evidence. Exit code 0 when
    every applicable check passes, 1 when one fails, 2 on bad input.

    \b
    Examples:
      kvbench check-press knorm --quick
      kvbench check-press my_press.py:MyPress --press-arg power=1
      kvbench check-press --all --quick --markdown docs/conformance.md   # every press: the committed board
    """
    from kvbench.core.errors import BadInput
    from kvbench.presses import parse_press_args, resolve_press
    from kvbench.store.results import check_folder_writable

    if every == (press is not None):
        raise BadInput("give PRESS or --all")
    if quick and model is not None:
        raise BadInput("--model applies without --quick (--quick checks the tiny random-init models only)")
    model = EMBEDDED if model is None else model
    if markdown is not None and not every:
        raise BadInput("--markdown applies to --all")
    if every and (press_args or out is not None):
        raise BadInput("--press-arg and --out apply to one PRESS, not --all")
    if out is not None:
        check_folder_writable(out, "--out folder")
    if markdown is not None:
        check_folder_writable(markdown.parent, "--markdown folder")  # before the battery, not after it
    if not every:
        args = parse_press_args(list(press_args))
        checks = check_press(press, args, model=model, quick=quick)
        click.echo(table(checks))
        if out is not None:
            record = record_of(resolve_press(press), args, checks, quick=quick, model=model)
            click.echo(f"verdicts: {write_record(out, record)}")
        if failed(checks):
            raise SystemExit(1)
        return
    reasons = checkable_presses()
    results = {}
    for name, why in tqdm(reasons.items(), desc="presses", unit="press", file=sys.stderr):
        if not why:
            results[name] = check_press(name, model=model, quick=quick)
    text = board(results, {name: why for name, why in reasons.items() if why})
    click.echo(text)
    if markdown is not None:
        markdown.parent.mkdir(parents=True, exist_ok=True)
        markdown.write_text(text)
    if any(failed(checks) for checks in results.values()):
        raise SystemExit(1)
