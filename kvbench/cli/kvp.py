"""`kvbench kvp`: make KVP agents for a model (datagen, then train) and look at how good they are (report)."""

from dataclasses import replace
from pathlib import Path

import click

from kvbench.cli.learned import data_option, datagen, out_option, replace_option
from kvbench.cli.types import Number, Whole
from kvbench.learned.kvp.config import (
    ARCH_NAMES,
    BASELINES,
    BUDGET_WEIGHTS,
    RECIPE_CONFIGS,
    RECIPES,
    UTILITIES,
    TrainConfig,
)


def int_list(ctx, param, value: str | None) -> list[int] | None:
    if value is None:
        return None
    try:
        items = [int(item) for item in value.split(",")]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {value!r}") from None
    if len(set(items)) != len(items):
        raise click.BadParameter(f"an index is given twice in {value!r}")
    return items


@click.group("kvp")
def kvp():
    """Make KVP eviction agents for a model: datagen, then train; report shows how good they are.

    \b
    kvbench kvp datagen --out data/kvp/smollm2-135m [--mixture broad]
    kvbench kvp train --data data/kvp/smollm2-135m --out presses/kvp/smollm2-135m [--arch apple]
    kvbench kvp report presses/kvp/smollm2-135m --plot kvp.png
    """


kvp.add_command(datagen)


def tokens_option(ctx, param, value: str | None):
    """--tokens: a whole number of tokens (2 or more), or `all`."""
    if value is None or value == "all":
        return value
    return Whole(2).convert(value, param, ctx)


def flag_pair(name: str, off: str, help: str):
    return click.option(f"--{name}/--{off}", default=None, help=help)


@kvp.command()
@data_option
@out_option("Agents folder.")
@replace_option
@click.option("--layers", callback=int_list, help="Comma-separated layers to train (default: all).")
@click.option("--heads", callback=int_list, help="Comma-separated KV heads of each layer (default: all).")
@click.option(
    "--recipe",
    type=click.Choice(RECIPES),
    default="kvbench",
    show_default=True,
    help="The settings every option below starts from: kvbench's (the shipped agents') or the authors' "
    "(apple/ml-learning-to-evict: apple agent, raw inputs, 6000-row position table, 128 prompts a step, one "
    "ranking each, batch baseline, z-scored advantages clipped to 2, rewards clamped at -200, per-step "
    "loss, grad clip 5 per head, lr 5e-5, weight decay 1e-3, cosine to 1e-6, EMA after 100 steps, 4000 "
    "steps, eval every 200). An option given overrides the recipe's value.",
)
@click.option("--steps", type=Whole(1), help="[kvbench: 1000]")
@click.option("--prompts", type=Whole(1), help="Per step. [kvbench: 2]")
@click.option("--tokens", callback=tokens_option, help="Drawn per prompt, or `all`. [kvbench: 256]")
@click.option("--rankings", type=Whole(1), help="K per prompt. [kvbench: 16]")
@click.option("--lr", type=Number(0, low_open=True), help="[kvbench: 0.003]")
@click.option("--weight-decay", type=Number(0), help="[kvbench: 0.01]")
@click.option("--min-lr-fraction", type=Number(0, 1), help="Cosine floor, a fraction of --lr. [kvbench: 0.1]")
@click.option("--ema-burnin", type=Whole(0), help="Steps before the EMA starts averaging. [kvbench: 0]")
@click.option(
    "--arch",
    type=click.Choice(ARCH_NAMES),
    help="compact: width-64 MLP with length-free position features; apple: Apple's agent (LayerNorm, "
    "width 256, learned position embedding). [kvbench: compact]",
)
@click.option(
    "--hidden",
    type=Whole(1),
    help="Scorer width [default: the arch's, compact 64, apple 256].",
)
@click.option("--position-rows", type=Whole(1), help="apple: position-table rows [kvbench: longest prompt].")
@flag_pair("standardise", "raw-inputs", "Standardise keys and values per head. [kvbench: on]")
@click.option(
    "--baseline",
    type=click.Choice(BASELINES),
    help="Leave-one-out over a prompt's K rankings, or over every ranking of the step. [kvbench: prompt]",
)
@flag_pair("normalise-advantages", "raw-advantages", "z-score the advantages. [kvbench: off]")
@click.option("--advantage-clip", type=Number(0, low_open=True), help="Clip advantages to +-this.")
@click.option("--reward-floor", type=Number(), help="Clamp each ranking's reward from below.")
@flag_pair("loss-per-step", "loss-per-ranking", "Average the loss over decisions. [kvbench: per ranking]")
@click.option("--grad-clip", type=Number(0, low_open=True), help="Clip each head's gradient norm to this.")
@click.option(
    "--budget-weights",
    type=click.Choice(BUDGET_WEIGHTS),
    help="How much each cache budget counts in the training reward: uniform (the paper's), harmonic "
    "(budget k weighs 1/k: high compression ratios count most), quarter or tenth (only the budgets keeping "
    "at most a quarter or a tenth of the prompt count). Validation always uses uniform. [kvbench: uniform]",
)
@click.option(
    "--utility",
    type=click.Choice(UTILITIES),
    help="What a token is worth in the reward and validation: future (attention the question and answer "
    "pay to it, the paper's), reconstruction (KVZip's score: attention while the model repeats the context; "
    "data made with `datagen --reconstruction`), or mixed (both, each summing to 1 over the prompt). "
    "[kvbench: future]",
)
@click.option("--eval-every", type=Whole(1), help="[kvbench: 100]")
@click.option("--seed", type=int, help="[kvbench: 0]")
def train(data, out, replace, layers, heads, recipe, **options):
    """Train one agent per (layer, KV head) on datagen output and save the best (by validation) to --out."""
    from kvbench.learned.common import check_training_out
    from kvbench.learned.kvp.train import KVPData
    from kvbench.learned.kvp.train import train as train_agents
    from kvbench.store.results import check_writable

    config = recipe_config(recipe, options)
    if config.problem():
        raise click.UsageError(config.problem())
    check_training_out(out, replace, data)
    KVPData(list(data), config.utility)  # a missing or corrupt manifest, or a missing target, fails first
    check_writable(out)
    train_agents(list(data), out, config, layers=layers, kv_heads=heads, log=click.echo)


def recipe_config(recipe: str, options: dict) -> TrainConfig:
    """The recipe's settings with the options given (not None) in their place; the warm-up is at most a
    tenth of the steps; a compact agent of the authors' recipe has no position table to size."""
    given = {name: value for name, value in options.items() if value is not None}
    if given.get("tokens") == "all":
        given["tokens"] = None
    base = RECIPE_CONFIGS[recipe]
    if given.get("arch") == "compact" and "position_rows" not in given:
        given["position_rows"] = None
    config = replace(base, **given)
    return replace(config, warmup=min(base.warmup, config.steps // 10))


@kvp.command()
@click.argument("agents", type=click.Path(file_okay=False, path_type=Path))
@click.option("--plot", type=click.Path(dir_okay=False, path_type=Path), help="Write a PNG plot per layer.")
@click.option(
    "--data",
    multiple=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Also score them on the validation prompts of these datagen folders (e.g. another mixture's).",
)
@click.option(
    "--utility",
    type=click.Choice(UTILITIES),
    help="With --data: the target to score them against [default: the one they were trained on].",
)
def report(agents, plot, data, utility):
    """Validation cost per head of the agents in AGENTS vs oracle, random, knorm and recency (1 = oracle),
    on the utility they were trained on.

    \b
    kvbench kvp report presses/kvp/smollm2-135m
    kvbench kvp report agents/broad --data data/ruler     # the same cost on another store's prompts
    kvbench kvp report presses/kvp/smollm2-135m --data data/recon-ruler --utility reconstruction
    """
    from kvbench.learned.kvp.checkpoint import (
        card_arch,
        card_utility,
        load_agents,
        load_card,
        plot_validation,
        validation_table,
    )

    if utility and not data:
        raise click.BadParameter("scores against another target need --data", param_hint="--utility")
    if plot:  # a plot that cannot be written fails before the validation prompts are scored
        from kvbench.store.results import check_folder_writable

        if plot.exists() and not plot.is_file():
            raise click.BadParameter(f"{str(plot)!r} is not a plain file", param_hint="--plot")
        if not plot.parent.is_dir():
            raise click.BadParameter(f"{str(plot.parent)!r} is not a folder", param_hint="--plot")
        check_folder_writable(plot.parent, "--plot folder")
    card = load_card(agents)
    if data:  # a bad data folder fails before anything is printed
        from kvbench.learned.kvp.train import validation_cost_on

        costs, prompts = validation_cost_on(load_agents(agents)[0], card, list(data), utility)
    agent, training = (
        card.get(key) if isinstance(card.get(key), dict) else {} for key in ("agent", "training")
    )
    click.echo(
        f"{card_arch(card)} agents (hidden {agent.get('hidden', '?')}) of {card['model']['name']}, "
        f"{training.get('steps', '?')} steps in {training.get('seconds', '?')} s, "
        f"utility {card_utility(card)}"
    )
    table = validation_table(card)
    click.echo(table.to_string(index=False, float_format="{:.3f}".format))
    means = table.drop(columns=["layer", "kv_head"]).mean()
    click.echo("mean   " + "  ".join(f"{name} {value:.3f}" for name, value in means.items()))
    if data:
        where = ", ".join(map(str, data))
        click.echo(
            f"on the {prompts} validation prompts of {where} ({utility or card_utility(card)} utility): "
            + "  ".join(f"{name} {cost:.3f}" for name, cost in costs.items())
        )
    if plot:
        plot_validation(card, plot)
        click.echo(f"plot: {plot}")
