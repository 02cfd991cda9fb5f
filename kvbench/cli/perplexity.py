"""`kvbench perplexity`: the command, thin over kvbench.harness.perplexity (loaded only when it runs)."""

from pathlib import Path

import click

from kvbench.cli.options import model_options
from kvbench.cli.types import Folder, Whole
from kvbench.core.validation import MAX_COUNT
from kvbench.harness.perplexity import (
    DEFAULT_EVERY,
    DEFAULT_LENGTH,
    DEFAULT_SOURCE,
    DEFAULT_SPAN,
    DEFAULT_TEXTS,
    SOURCES,
    summarize,
)
from kvbench.harness.perplexity import perplexity as measure


@click.command()
@click.option("--presses", required=True, help="Comma-separated press names, e.g. streaming_llm,snapkv,kvp.")
@click.option("--ratios", default=None, help="Comma-separated ratios in [0, 1) of the text read so far.")
@click.option(
    "--memory",
    default=None,
    help="Instead: comma-separated memory budgets in (0, 1] of the whole text's 16-bit cache.",
)
@click.option(
    "--budget",
    "budgets",
    default=None,
    help="Instead: comma-separated absolute budgets, KV entries kept per head and layer, e.g. 64,128,256.",
)
@click.option(
    "--press-arg", "press_args", multiple=True, metavar="KEY=VALUE", help="Press parameter for every press."
)
@click.option(
    "--every",
    type=Whole(),
    default=DEFAULT_EVERY,
    show_default=True,
    help="Tokens fed between compressions (1: token by token, StreamingLLM's scheme, the slowest).",
)
@click.option(
    "--source",
    "sources",
    default=None,
    help=f"Comma-separated generated texts: {', '.join(SOURCES)} [{DEFAULT_SOURCE}; none with --data-dir].",
)
@click.option(
    "--data-dir",
    type=click.Path(path_type=Path),
    default=None,
    help='Folder of local texts: .txt files, a text each, and .jsonl files, a {"text": ...} a line.',
)
@click.option(
    "--texts", type=Whole(1, MAX_COUNT), default=DEFAULT_TEXTS, show_default=True, help="Texts per source."
)
@click.option("--length", type=Whole(), default=DEFAULT_LENGTH, show_default=True, help="Tokens per text.")
@click.option(
    "--span", type=Whole(), default=DEFAULT_SPAN, show_default=True, help="Tokens per span of recorded NLLs."
)
@click.option("--seed", type=Whole(), default=0, show_default=True, help="Seed of the generated texts.")
@click.option(
    "--out",
    type=Folder(),
    default=Path("results"),
    show_default=True,
    help="Results folder (appended to; finished rows are never recomputed).",
)
@click.option("--force", is_flag=True, help="Recompute rows that are already in --out.")
@click.option(
    "--batch-configs",
    type=Whole(1),
    default=16,
    show_default=True,
    help="Configs read together per text (bounds memory).",
)
@model_options
def perplexity(presses, ratios, memory, budgets, press_args, **options):
    """Perplexity of long texts with each press's KV cache held at its budget as the text is read.

    Each text is teacher-forced through the model --every tokens at a time, all configs in one batch; after
    each chunk every config's cache is compressed back to its budget (an absolute --budget per head, a ratio
    of the text read so far, or a memory of the whole text's cache). Records each (config, text)'s mean NLL
    and its NLL per --span tokens in OUT/rows.jsonl (protocol perplexity; `kvbench report` draws it), plus
    no compression.

    \b
    Examples:
      kvbench perplexity --presses streaming_llm,snapkv,kvp --budget 64,128,256 --length 2048
      kvbench perplexity --presses knorm,tova --ratios 0.5,0.75 --every 1 --source prose,code
      kvbench perplexity --presses kvp --budget 128 --data-dir data/pg19 --texts 8 --length 8192
    """
    from kvbench.presses import parse_press_args

    frame = measure(
        presses, ratios, memory=memory, budgets=budgets, press_args=parse_press_args(press_args), **options
    )
    table = summarize(frame)
    click.echo(table.round(2).to_string(sparsify=False) if not table.empty else "no results")
    click.echo(f"results: {options['out']}/rows.jsonl  (kvbench report {options['out']} --out reports/NAME)")
