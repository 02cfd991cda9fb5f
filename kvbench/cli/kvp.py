"""`kvbench kvp`: make KVP agents for a model (datagen, then train) and look at how good they are (report)."""

from pathlib import Path

import click

from kvbench.cli.learned import data_option, datagen, out_option, replace_option
from kvbench.cli.types import Number, Whole
from kvbench.learned.kvp.config import ARCH_NAMES, BUDGET_WEIGHTS, UTILITIES, TrainConfig

DEFAULTS = TrainConfig()


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


@kvp.command()
@data_option
@out_option("Agents folder.")
@replace_option
@click.option("--layers", callback=int_list, help="Comma-separated layers to train (default: all).")
@click.option("--heads", callback=int_list, help="Comma-separated KV heads of each layer (default: all).")
@click.option("--steps", default=DEFAULTS.steps, show_default=True, type=Whole(1))
@click.option("--prompts", default=DEFAULTS.prompts, show_default=True, type=Whole(1), help="Per step.")
@click.option(
    "--tokens",
    default=DEFAULTS.tokens,
    show_default=True,
    type=Whole(2),
    help="Drawn per prompt.",
)
@click.option(
    "--rankings",
    default=DEFAULTS.rankings,
    show_default=True,
    type=Whole(2),
    help="K per prompt.",
)
@click.option("--lr", default=DEFAULTS.lr, show_default=True, type=Number(0, low_open=True))
@click.option(
    "--arch",
    type=click.Choice(ARCH_NAMES),
    default=DEFAULTS.arch,
    show_default=True,
    help="compact: width-64 MLP with length-free position features; apple: Apple's agent (LayerNorm, "
    "width 256, learned position embedding).",
)
@click.option(
    "--hidden",
    type=Whole(1),
    help="Scorer width [default: the arch's, compact 64, apple 256].",
)
@click.option(
    "--budget-weights",
    type=click.Choice(BUDGET_WEIGHTS),
    default=DEFAULTS.budget_weights,
    show_default=True,
    help="How much each cache budget counts in the training reward: uniform (the paper's), harmonic "
    "(budget k weighs 1/k: high compression ratios count most), quarter or tenth (only the budgets keeping "
    "at most a quarter or a tenth of the prompt count). Validation always uses uniform.",
)
@click.option(
    "--utility",
    type=click.Choice(UTILITIES),
    default=DEFAULTS.utility,
    show_default=True,
    help="What a token is worth in the reward and validation: future (attention the question and answer "
    "pay to it, the paper's), reconstruction (KVZip's score: attention while the model repeats the context; "
    "data made with `datagen --reconstruction`), or mixed (both, each summing to 1 over the prompt).",
)
@click.option("--eval-every", default=DEFAULTS.eval_every, show_default=True, type=Whole(1))
@click.option("--seed", default=DEFAULTS.seed, show_default=True)
def train(
    data,
    out,
    replace,
    layers,
    heads,
    steps,
    prompts,
    tokens,
    rankings,
    lr,
    arch,
    hidden,
    budget_weights,
    utility,
    eval_every,
    seed,
):
    """Train one agent per (layer, KV head) on datagen output and save the best (by validation) to --out."""
    from kvbench.learned.common import check_training_out
    from kvbench.learned.kvp.train import KVPData
    from kvbench.learned.kvp.train import train as train_agents
    from kvbench.store.results import check_writable

    check_training_out(out, replace, data)
    KVPData(list(data), utility)  # a missing or corrupt manifest, or a missing target, fails before any work
    check_writable(out)
    config = TrainConfig(
        steps=steps,
        prompts=prompts,
        tokens=tokens,
        rankings=rankings,
        lr=lr,
        warmup=min(DEFAULTS.warmup, steps // 10),
        eval_every=eval_every,
        arch=arch,
        hidden=hidden,
        budget_weights=budget_weights,
        utility=utility,
        seed=seed,
    )
    train_agents(list(data), out, config, layers=layers, kv_heads=heads, log=click.echo)


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
