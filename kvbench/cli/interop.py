"""`kvbench export` and `kvbench import`: results to and from kvpress evaluation's output folders (the format
its leaderboard reads; see kvbench.harness.interop). Imported rows are marked: press `NAME (kvpress)` and
`meta.imported` "kvpress"."""

from pathlib import Path

import click

FORMATS = ("kvpress",)


@click.command("export")
@click.option("--format", "format_", type=click.Choice(FORMATS), required=True, help="The format: kvpress.")
@click.argument("results", type=click.Path(path_type=Path))
@click.argument("out", type=click.Path(path_type=Path))
def export_command(format_, results, out):
    """Write results as kvpress evaluation's output folders.

    The results folder RESULTS goes to OUT, a new folder: one folder per config and dataset, named as
    kvpress's evaluate.py names it, holding predictions.csv, metrics.json and config.yaml. Rows of the
    tasks kvpress's evaluation has too (RULER, LongBench, LooGLE, ...: docs/usage.md lists them),
    query-agnostic or query-aware, at a compression ratio; anything else is refused, naming the tasks it
    takes, and nothing is written.

    A text cell of predictions.csv that a spreadsheet would open as a formula (=, +, -, @, tab, CR; not a
    number) is written after a single quote; import takes the quote off again.
    """
    from kvbench.harness.interop import export_kvpress

    summary = export_kvpress(results, out)
    click.echo(f"wrote {summary.folders} kvpress folder(s), {summary.rows} predictions, to {out}")


@click.command("import")
@click.option("--format", "format_", type=click.Choice(FORMATS), required=True, help="The format: kvpress.")
@click.argument("folder", metavar="DIR", type=click.Path(path_type=Path))
@click.argument("out", type=click.Path(path_type=Path))
def import_command(format_, folder, out):
    """Read kvpress evaluation's output folders as results.

    The folders at or below DIR go to OUT, a new kvbench results folder (the datasets export writes; not
    kvpress's DecodingPress runs). Each prediction becomes a row scored with kvbench's implementation of
    the same official metric (math-verify for aime25 and math500), its press named `NAME (kvpress)`
    and `meta.imported` "kvpress", so `kvbench report` sets them beside kvbench's own results. A
    published score its predictions do not give back is said in a warning.
    """
    from kvbench.harness.interop import import_kvpress

    summary = import_kvpress(folder, out)
    click.echo(f"imported {summary.rows} predictions from {summary.folders} kvpress folder(s) into {out}")
