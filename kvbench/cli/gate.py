"""`kvbench gate`: train a model's sigmoid gates (soft, on the frozen model) and show their card."""

from pathlib import Path

import click

from kvbench.cli.learned import check_training, device_option, model_option, out_option, replace_option
from kvbench.cli.types import Number, Whole
from kvbench.learned.gate.config import TrainConfig

DEFAULTS = TrainConfig()


@click.group("gate")
def gate():
    """Learned sigmoid gates per (layer, KV head): trained soft on the frozen model, evicting hard.

    \b
    kvbench gate train --out presses/gate/smollm2-135m
    kvbench gate report presses/gate/smollm2-135m
    """


@gate.command()
@out_option("Gates folder.")
@replace_option
@model_option()
@device_option
@click.option(
    "--keep", default=DEFAULTS.keep, show_default=True, type=Number(0, 1, low_open=True, high_open=True)
)
@click.option("--sparsity", default=DEFAULTS.sparsity, show_default=True, type=Number(0))
@click.option("--steps", default=DEFAULTS.steps, show_default=True, type=Whole(1))
@click.option("--texts", default=DEFAULTS.texts, show_default=True, type=Whole(1))
@click.option("--val-texts", default=DEFAULTS.val_texts, show_default=True, type=Whole(1))
@click.option("--length", default=DEFAULTS.length, show_default=True, type=Whole(8))
@click.option(
    "--source", default=DEFAULTS.source, show_default=True, type=click.Choice(["prose", "code", "agent"])
)
@click.option("--lr", default=DEFAULTS.lr, show_default=True, type=Number(0, low_open=True))
@click.option(
    "--binarise",
    default=DEFAULTS.binarise,
    show_default=True,
    type=Number(0),
    help="Weight of the softness term 4 g (1 - g), driving gates to 0 or 1 so that the soft forward is "
    "what hard eviction does (0: the shipped gates' loss).",
)
@click.option("--eval-every", default=DEFAULTS.eval_every, show_default=True, type=Whole(1))
@click.option("--seed", default=DEFAULTS.seed, show_default=True)
def train(out, replace, model, device, **options):
    """Train the gates on generated texts with the model frozen; save the best step (lowest validation KL
    + binarise x softness, among steps at the keep fraction)."""
    from kvbench.bridge.models import load_model, load_tokenizer
    from kvbench.core.provenance import command_line
    from kvbench.learned.gate.press import save_gates
    from kvbench.learned.gate.train import TRAIN_SEED, VAL_SEED
    from kvbench.learned.gate.train import train as train_gates

    check_training(out, replace, device, model)
    config = TrainConfig(**options)
    llm, _ = load_model(model, device=device)
    tokenizer = load_tokenizer(model)
    data = (
        token_ids(tokenizer, config.source, config.texts, config.length, TRAIN_SEED),
        token_ids(tokenizer, config.source, config.val_texts, config.length, VAL_SEED),
    )
    gates, card = train_gates(llm, config, data, log=click.echo)
    save_gates(out, gates, {**card, "command": command_line()})
    click.echo(f"wrote {out}")


def token_ids(tokenizer, source: str, count: int, length: int, seed: int) -> list:
    """The live-cache protocol's generated texts as (1, length) token ids: what the gates train and validate
    on (kvbench.learned.gate.train may not import kvbench.harness.perplexity; this layer may)."""
    import torch

    from kvbench.harness.perplexity import generated_texts

    return [torch.tensor([text.ids]) for text in generated_texts(tokenizer, source, count, length, seed)]


@gate.command()
@click.argument("weights", type=click.Path(file_okay=False, path_type=Path))
def report(weights):
    """The card of the gates in WEIGHTS: training, validation KL (soft gates vs ungated), mean gate."""
    from kvbench.learned.common import read_card
    from kvbench.learned.gate.press import GatePress

    card = read_card(weights, GatePress.method, GatePress.hint("MODEL"))
    training, validation = card["training"], card["validation"]
    rounded = f", rounded {validation['rounded_kl']:.4f}" if "rounded_kl" in validation else ""
    click.echo(
        f"{card['model']['name']}: keep {training['keep']}, {training['steps']} steps (best "
        f"{training['best_step']}), {training['seconds']:.0f} s; validation KL {validation['kl']:.4f}"
        f"{rounded} (uniform start {validation['kl_ungated_start']:.4f}), mean gate "
        f"{validation['mean_gate']:.3f}"
    )
