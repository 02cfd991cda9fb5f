"""`kvbench compare-models`: whether the order of presses on one model carries to another."""

from pathlib import Path

import click

from kvbench.cli.types import Number


@click.command(name="compare-models")
@click.argument("first", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("second", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--ratios", default="0.25,0.5,0.75,0.9", show_default=True, help="Compression ratios compared.")
@click.option(
    "--floor",
    default=50.0,
    show_default=True,
    type=Number(0, 100),
    help="Tasks that SECOND's model scores below this uncompressed are left out of both (no room to order "
    "presses there).",
)
@click.option(
    "--learned",
    default="kvp",
    show_default=True,
    help="Comma-separated presses whose lead over the best of the others is shown on each model.",
)
@click.option("--resamples", default=2000, show_default=True, type=click.IntRange(100, 100_000))
def compare_models(first, second, ratios, floor, learned, resamples):
    """Whether the order of presses on one model (a results folder) carries to another.

    Does the order in results FIRST (one model) carry to results SECOND (another)? Per ratio, the presses
    both folders hold are ordered by mean score on each model; prints Kendall's tau-b between
    the orders with a 95 % bootstrap interval over each model's contexts (resampled within each task), a
    verdict (carries: interval above 0), and each --learned press's lead over the best other press on each
    model, paired by context, with the reports' paired interval (the sign-flip test inverted).

    \b
      kvbench compare-models results/reference results/qwen-ruler-1k
    """
    import numpy as np

    from kvbench.core.errors import BadInput
    from kvbench.core.validation import parse_float
    from kvbench.reporting import agreement
    from kvbench.reporting.read import collect, with_report_columns

    asked = [parse_float(value.strip(), "--ratios", 0, 1) for value in ratios.split(",") if value.strip()]
    if not asked:
        raise BadInput("--ratios names no ratio")
    sides = [with_report_columns(collect([folder]).rows) for folder in (first, second)]
    for folder, rows in zip((first, second), sides, strict=True):
        if rows["model"].nunique() > 1:
            raise BadInput(
                f"{folder} holds rows of {rows['model'].nunique()} models: give one model's results"
            )
    weak = agreement.weak_tasks(sides[1], floor)
    tasks = sorted((set(sides[0]["task"]) & set(sides[1]["task"])) - set(weak))
    if not tasks:
        raise BadInput(
            f"{first} and {second} share no task that {second}'s model scores {floor:g} or more on"
        )
    models = [str(rows["model"].iloc[0]) for rows in sides]
    click.echo(f"{models[0]} ({first}) against {models[1]} ({second}): {len(tasks)} tasks")
    if weak:
        click.echo(f"left out (uncompressed below {floor:g} on {models[1]}): {', '.join(weak)}")
    click.echo("")
    click.echo("| ratio | presses | order on the first | order on the second | tau-b [95 %] | verdict |")
    click.echo("|---|---|---|---|---|---|")
    leads = []
    for ratio in asked:
        presses = agreement.common_presses(*sides, ratio)
        if len(presses) < 3:
            click.echo(f"| {ratio:g} | {len(presses)} | | | too few presses in both | |")
            continue
        a, b = (agreement.side(rows, ratio, presses, tasks) for rows in sides)
        result = agreement.order_agreement(a, b, ratio, resamples)
        orders = [" > ".join(presses[i] for i in np.argsort(-means, kind="stable")) for means in result.means]
        click.echo(
            f"| {ratio:g} | {len(presses)} | {orders[0]} | {orders[1]} | "
            f"{result.tau:+.2f} [{result.low:+.2f}, {result.high:+.2f}] | {result.verdict} |"
        )
        for name in (name.strip() for name in learned.split(",") if name.strip()):
            if name in presses:
                others = [press for press in presses if press != name]
                for one in (a, b) if models[0] != models[1] else (a,):
                    leads.append((ratio, one.model, name, *agreement.lead_over_best(one, name, others)))
    if leads:
        click.echo("")
        click.echo("| ratio | model | press | best other | lead, paired [95 %] |")
        click.echo("|---|---|---|---|---|")
        for ratio, model, name, best, lead, low, high in leads:
            click.echo(f"| {ratio:g} | {model} | {name} | {best} | {lead:+.1f} [{low:+.1f}, {high:+.1f}] |")
