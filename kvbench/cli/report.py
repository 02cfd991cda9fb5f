"""`kvbench report`: the command, thin over `render_report`."""

import warnings
from pathlib import Path

import click

from kvbench.cli.types import Folder
from kvbench.core.errors import BadInput, KvbenchError, NoResults
from kvbench.reporting.browser import SCREENSHOT_SIZE, require_browser
from kvbench.reporting.browser import screenshot as take_screenshot
from kvbench.reporting.costs import read_costs
from kvbench.reporting.read import press_list
from kvbench.reporting.render import render_report
from kvbench.store.results import check_folder_writable


@click.command()
@click.argument("result_dirs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--out",
    type=Folder(),
    required=True,
    help="Folder to write README.md, index.html and the PNG plots into, e.g. reports/my-sweep.",
)
@click.option(
    "--recursive",
    is_flag=True,
    help="Also read the results folders below each RESULT_DIR (by default only RESULT_DIR/rows.jsonl).",
)
@click.option(
    "--versus",
    metavar="PRESS",
    help="Add a table of PRESS minus every other press, paired by sample, and draw PRESS prominent in every "
    "plot: the name the run was given (e.g. --versus outlier8 for outlier8(window=8)) or the leaderboard's "
    "label (e.g. --versus 'kvp(agents=agents/old)').",
)
@click.option(
    "--presses",
    metavar="LIST",
    help="Report only these presses, comma-separated as the run was given them or as the leaderboard names "
    "them (and the no-compression reference), e.g. --presses kvp,streaming_llm,'kvp(agents=agents/old)'. "
    "Default: every press.",
)
@click.option(
    "--every-state",
    is_flag=True,
    help="Keep the rows a learned press scored with older agents or policies as a press of their own, named "
    "PRESS@STATE (the state digest its rows record), e.g. to compare agents before and after a retrain with "
    "--versus kvp@58260c05679a. Default: only each press's latest state, the others set aside.",
)
@click.option(
    "--costs",
    "costs_dir",
    type=Folder(),
    metavar="DIR",
    help="Set each press's score beside its cost as `kvbench speed --out DIR` measured it (prefill overhead, "
    "decoding speed, allocated bytes), at the same press and budget: a table and a plot per leaderboard.",
)
@click.option(
    "--screenshot",
    is_flag=True,
    help="Also write screenshot.png: the top of index.html as headless Chromium shows it at "
    f"{SCREENSHOT_SIZE[0]} x {SCREENSHOT_SIZE[1]} px (needs chromium on PATH).",
)
def report(
    result_dirs: tuple[Path, ...],
    out: Path,
    recursive: bool,
    versus: str | None,
    presses: str | None,
    every_state: bool,
    costs_dir: Path | None,
    screenshot: bool,
):
    """Leaderboards, per-task tables and plots from one or more results folders."""
    versus = not_blank(versus, "--versus", "press")
    chosen = press_list(presses) if presses is not None else None
    if screenshot:
        require_browser()  # before any work
    check_folder_writable(out, "--out folder")  # before any row is read
    costs = read_costs(costs_dir) if costs_dir is not None else None  # checked before any row is read too
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            out_dir = render_report(list(result_dirs), out, recursive, versus, chosen, every_state, costs)
        except KvbenchError as error:  # said after what was skipped while reading, which may explain it
            out_dir = error
    for caught_warning in caught:  # one line each, not Python's two-line warning format
        click.echo(f"Warning: {caught_warning.message}", err=True)
    if isinstance(out_dir, NoResults):
        raise click.UsageError(str(out_dir)) from out_dir
    if isinstance(out_dir, KvbenchError):
        raise out_dir
    click.echo(f"Report written to {out_dir / 'README.md'} and {out_dir / 'index.html'}")
    if screenshot:
        click.echo(
            f"Screenshot written to {take_screenshot(out_dir / 'index.html', out_dir / 'screenshot.png')}"
        )


def not_blank(value: str | None, option: str, what: str) -> str | None:
    """`value` as given; BadInput when it is blank: `--versus ''` names no press (not none)."""
    if value is not None and not value.strip():
        raise BadInput(f"{option} names no {what}")
    return value
