"""`kvbench fit NAME`: fit, for any model and offline, the state of a kvpress press that kvpress can only
download from a hub (kvbench.learned.fitted), on a training mixture's contexts."""

import click

from kvbench.cli.learned import (
    check_training,
    device_option,
    mixture_name,
    model_option,
    out_option,
    replace_option,
)
from kvbench.cli.types import Whole
from kvbench.learned.catalog import FITTED

METHODS = tuple(FITTED)
# e.g. "kvzap: tokens, hidden_dim, ...; duo_attention: q_len": the options each method takes
OPTIONS = "; ".join(
    f"{name}: {', '.join(press.fit.options)}" for name, press in FITTED.items() if press.fit.options
)


def options_of(ctx, param, value: tuple[str, ...]) -> dict:
    pairs = {}
    for item in value:
        key, sep, setting = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{item!r} is not NAME=VALUE")
        pairs[key.strip()] = setting.strip()
    return pairs


@click.command("fit")
@click.argument("name", type=click.Choice(METHODS))
@out_option("State folder (state.safetensors + card.json), e.g. presses/NAME/MODEL.")
@replace_option
@model_option()
@device_option
@click.option(
    "--mixture", default="broad", show_default=True, callback=mixture_name, help="Training mixture."
)
@click.option("--samples", default=1, show_default=True, type=Whole(1), help="Prompts of each mixture part.")
@click.option("--length", type=Whole(1), help="Every part at this many tokens [default: each part's own].")
@click.option(
    "--seed",
    default=10_000,
    show_default=True,
    type=Whole(1000),
    help="Sample seed; evaluation uses 0..999, so fitting starts at 1000.",
)
@click.option(
    "--option",
    "options",
    multiple=True,
    callback=options_of,
    help=f"NAME=VALUE of the method ({OPTIONS}).",
)
def fit(name, out, replace, model, device, mixture, samples, length, seed, options):
    """Fit offline, for any model, the state kvpress downloads for qfilter, kvzap, duo_attention, ...

    NAME's state for --model, fitted on a training mixture's contexts, is written to --out, where `--press
    NAME --press-arg weights=OUT` (or presses/NAME/MODEL/, the default folder) reads it.

    \b
    kvbench fit qfilter --out presses/qfilter/smollm2-135m
    kvbench fit kvzap --option hidden_dim=64 --out presses/kvzap/smollm2-135m
    """
    import sys
    import time

    from tqdm.auto import tqdm

    from kvbench.bridge.models import load_model, load_tokenizer
    from kvbench.core.provenance import command_line
    from kvbench.learned.fitted import FitConfig, card_of, check_options, check_prompts, method, save_fitted
    from kvbench.learned.fitted.data import mixture_contexts

    config = FitConfig(mixture, samples, length, seed, check_options(name, options))
    check_training(out, replace, device, model)
    tokenizer = load_tokenizer(model)
    contexts = mixture_contexts(tokenizer, mixture, samples, seed, length)
    check_prompts(name, len(contexts))
    llm, _ = load_model(model, device=device)
    started = time.perf_counter()
    # A bar over the contexts, which each method reads once: nearly all of a fit's time on a large model.
    with tqdm(contexts, desc=f"fit {name}", unit="context", file=sys.stderr) as passes:
        tensors, validation = method(name).fit(llm, tokenizer, passes, config.options)
    card = card_of(llm, config, contexts, time.perf_counter() - started, validation)
    card = save_fitted(out, name, tensors, {**card, "command": command_line()})
    click.echo(f"wrote {out}: {len(contexts)} prompts, {card['seconds']} s, validation {validation}")
