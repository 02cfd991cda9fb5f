"""`kvbench distillcache`: make a DistillCache policy for a model (datagen, then train) and report on it.

Same shape as `kvbench kvp`, and the same data: both `datagen` commands are one (learned.common.command) and
write the shared store, so one datagen run serves both presses.
"""

from pathlib import Path

import click
from click.core import ParameterSource

from kvbench.cli.learned import (
    check_training,
    data_option,
    datagen,
    device_option,
    model_option,
    out_option,
    replace_option,
)
from kvbench.cli.types import Number, Whole
from kvbench.core.errors import BadInput
from kvbench.core.validation import parse_float
from kvbench.learned.distillcache.config import ARCHS, CREDITS, INITS, TrainConfig  # no torch: see config

DEFAULTS = TrainConfig()


def ratio_list(ctx, param, value: str) -> list[float]:
    try:
        ratios = [
            parse_float(item, "a ratio", 0, 1, low_open=True, high_open=True) for item in value.split(",")
        ]
    except BadInput as error:
        raise click.BadParameter(f"expected comma-separated ratios in (0, 1): {error}") from None
    if len(set(ratios)) != len(ratios):
        raise click.BadParameter(f"a ratio is given twice in {value}")
    return ratios


@click.group("distillcache")
def distillcache():
    """Make a DistillCache eviction policy for a model: datagen, then train; report shows how good it is.

    \b
    kvbench distillcache datagen --out data/distillcache/smollm2-135m [--mixture broad]
    kvbench distillcache train --data data/distillcache/smollm2-135m --out presses/distillcache/smollm2-135m
    kvbench distillcache report presses/distillcache/smollm2-135m
    """


distillcache.add_command(datagen)


@distillcache.command()
@data_option
@out_option("Policy folder.")
@replace_option
@model_option("The model the data was made with.")
@device_option
@click.option("--steps", default=DEFAULTS.steps, show_default=True, type=Whole(1))
@click.option(
    "--samples",
    default=DEFAULTS.samples,
    show_default=True,
    type=Whole(2),
    help="Keep-sets per ratio and step (K).",
)
@click.option(
    "--ratios",
    default=",".join(map(str, DEFAULTS.ratios)),
    show_default=True,
    callback=ratio_list,
    help="Compression ratios drawn from.",
)
@click.option("--ratios-per-step", default=DEFAULTS.ratios_per_step, show_default=True, type=Whole(1))
@click.option("--lr", default=DEFAULTS.lr, show_default=True, type=Number(0, low_open=True))
@click.option("--entropy-bonus", default=DEFAULTS.entropy_bonus, show_default=True, type=Number(0))
@click.option("--hidden", default=DEFAULTS.hidden, show_default=True, type=Whole(1), help="MLP width.")
@click.option(
    "--arch",
    default=DEFAULTS.arch,
    show_default=True,
    type=click.Choice(ARCHS),
    help="shared: one MLP for all heads (the paper's); per-head: one per (layer, KV head), as KVP's agents.",
)
@click.option(
    "--init",
    default=DEFAULTS.init,
    show_default=True,
    type=click.Choice(INITS),
    help="uniform: every entry scored alike at step 0; knorm: start from knorm's ranking (a warm start).",
)
@click.option(
    "--credit",
    default=DEFAULTS.credit,
    show_default=True,
    type=click.Choice(CREDITS),
    help="sequence: one keep-set at prefill, rewarded by the answer's summed KL; per-step: keep-sets "
    "re-decided every --interval decoding steps (the decode-time protocol), each credited with the KL "
    "that follows it.",
)
@click.option(
    "--interval",
    default=DEFAULTS.interval,
    show_default=True,
    type=Whole(1),
    help="per-step: decoding steps between compressions (run the press with the same "
    "--protocol decode-time --interval).",
)
@click.option("--eval-every", default=DEFAULTS.eval_every, show_default=True, type=Whole(1))
@click.option("--seed", default=DEFAULTS.seed, show_default=True)
def train(
    data,
    out,
    replace,
    model,
    device,
    steps,
    samples,
    ratios,
    ratios_per_step,
    lr,
    entropy_bonus,
    hidden,
    **rest,
):
    """Train the policy on datagen output with the model frozen; save the best (by validation) to --out."""
    from kvbench.bridge.models import load_model
    from kvbench.core.provenance import command_line
    from kvbench.learned.distillcache.config import DistillData

    given = click.get_current_context().get_parameter_source("interval") is ParameterSource.COMMANDLINE
    if given and rest["credit"] != "per-step":
        raise click.BadParameter(
            f"applies to --credit per-step only (got {rest['credit']})", param_hint="--interval"
        )
    DistillData(list(data))  # refuse a bad data store, an --out or a device that would fail after training
    check_training(out, replace, device, model, data)
    from kvbench.learned.distillcache.train import train as train_policy  # torch: after the checks

    config = TrainConfig(
        steps=steps,
        samples=samples,
        ratios=ratios,
        ratios_per_step=min(ratios_per_step, len(ratios)),
        lr=lr,
        entropy_bonus=entropy_bonus,
        hidden=hidden,
        **rest,
    )
    llm, _ = load_model(model, device=device)
    command = command_line()
    train_policy(llm, list(data), out, config, command=command, log=click.echo)


@distillcache.command()
@click.argument("policy", type=click.Path(file_okay=False, path_type=Path))
def report(policy):
    """Validation KL of the policy in POLICY vs knorm, snapkv and random, per ratio (lower is better)."""
    from kvbench.learned.common import read_card
    from kvbench.learned.distillcache.config import METHOD, train_command_hint

    card = read_card(policy, METHOD, train_command_hint("MODEL"))
    table = card["validation"]["kl"]
    ratios = list(next(iter(table.values())))
    click.echo("mean KL per continuation step on held-out prompts (lower is better)")
    click.echo(f"{'press':<14}" + "".join(f"{'ratio ' + r:>12}" for r in ratios) + f"{'mean':>10}")
    for name, row in table.items():
        mean = sum(row.values()) / len(row)
        click.echo(f"{name:<14}" + "".join(f"{row[r]:>12.4f}" for r in ratios) + f"{mean:>10.4f}")
    training = card["training"]
    click.echo(
        f"{training['steps']} steps (best {training['best_step']}), {training['seconds']:.0f} s; "
        f"{card['data']['train_prompts']} train / {card['data']['val_prompts']} val prompts"
    )
