"""`kvbench speed`: the command, thin over kvbench.diagnostics.speed (loaded only when it runs)."""

import click

from kvbench.cli.options import model_options
from kvbench.cli.types import Folder
from kvbench.diagnostics.speed import DEFAULT_LENGTHS, DEFAULT_PRESSES, cost_table, plan_speed, run_speed


@click.command()
@click.option("--presses", default=DEFAULT_PRESSES, show_default=True, help="Comma-separated press names.")
@click.option("--memory", default=None, help="Comma-separated memory budgets in (0, 1] (default 0.25).")
@click.option("--ratios", default=None, help="Instead of --memory: comma-separated ratios in [0, 1).")
@click.option("--lengths", default=DEFAULT_LENGTHS, show_default=True, help="Context lengths in tokens.")
@click.option("--new-tokens", default="32", show_default=True, help="Greedy tokens decoded per measure.")
@click.option("--repeats", default="2", show_default=True, help="Interleaved repeats; the fastest counts.")
@click.option(
    "--press-arg", "press_args", multiple=True, metavar="KEY=VALUE", help="Press parameter for every press."
)
@click.option(
    "--out",
    type=Folder(),
    default="results/speed",
    show_default=True,
    help="Folder of costs.jsonl (resumed).",
)
@model_options
def speed(presses, memory, ratios, lengths, new_tokens, repeats, press_args, out, model, device, dtype):
    """What each press costs run alone: prefill overhead, decode tokens/s, allocated vs accounted bytes.

    Each press runs alone, unbatched, as deployed, on random context tokens: the prefill's time with
    compression against without (fastest of --repeats, interleaved), greedy decoding's tokens per second on
    the compressed cache, and the cache's bytes as allocated (tensor storage) beside kvbench's accounting.
    kvbench's codecs hand attention dequantised tensors: their allocated bytes are not their accounted
    ones. One line a (press, budget, length, device) in OUT/costs.jsonl; a stopped run resumes; a run
    record in OUT/runs/.

    \b
    Examples:
      kvbench speed --presses knorm,qevict,memdecay --lengths 1024
      kvbench speed --presses qevict --press-arg scored_queries=all --out results/speed-exact
      kvbench speed --device cuda --lengths 1024,4096,16384
    """
    from kvbench.presses import parse_press_args

    if memory is None and ratios is None:
        memory = "0.25"
    plan = plan_speed(
        presses, lengths, out, memory, ratios, new_tokens, repeats, parse_press_args(press_args)
    )
    costs = run_speed(plan, model, device, dtype)
    click.echo(cost_table(costs).round(2).to_string())
    click.echo(f"costs: {plan.out}/costs.jsonl")
