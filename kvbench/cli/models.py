"""`kvbench models`: the built-in models, and `kvbench models fetch`, which readies one ahead of a run."""

from pathlib import Path

import click


@click.group(name="models", invoke_without_command=True)
@click.pass_context
def models(ctx):
    """List the built-in models: name, size, shape, where the GGUF comes from, and whether it is here.

    \b
    Any model also runs by its path or id:
      --model path/to/model.gguf     any GGUF file transformers reads (converted once, keyed by its sha256)
      --model path/to/folder         a transformers folder
      --model Qwen/Qwen2.5-7B-Instruct   a Hugging Face id (its local cache, or the hub where reachable)
    """
    if ctx.invoked_subcommand is not None:
        return
    from kvbench.bridge import builtin, gguf_files
    from kvbench.bridge.models import EMBEDDED, cache_dir
    from kvbench.learned.catalog import LEARNED
    from kvbench.learned.common.state import shipped_state_dir

    for model in builtin.BUILTIN.values():
        default = " (default)" if model.name == EMBEDDED else ""
        if gguf_files.is_converted(cache_dir() / "models" / model.name):
            state = "converted"
        elif builtin.is_present(model, cache_dir()):
            state = "GGUF here, not converted yet"
        else:
            state = "not here: fetched on first use"
        wheels = model.wheels[0].package if len(model.wheels) == 1 else f"{len(model.wheels)} wheels "
        if len(model.wheels) > 1:
            wheels += f"{model.wheels[0].package[:-1]}1..{len(model.wheels)}"
        click.echo(f"{model.name}{default}: {model.describe()}")
        click.echo(
            f"  GGUF {model.gguf_bytes / 1e6:,.0f} MB from {wheels}=={model.wheels[0].version} "
            f"(sha256 {model.gguf_sha256[:12]}...); {state}"
        )
        shipped = [
            press.name
            for press in LEARNED
            if (shipped_state_dir(press.name, model.name) / "card.json").is_file()
        ]
        click.echo(f"  learned states shipped: {', '.join(shipped) or 'none'}")


@models.command(name="fetch")
@click.argument("name")
@click.option(
    "--gguf",
    "gguf",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="A copy of the model's GGUF already on disk: checked by its sha256 and copied into the cache "
    "instead of fetched.",
)
def fetch(name, gguf):
    """Fetch, check and convert the built-in model NAME now (what its first use would do), e.g. before a
    long run or with no network later: `kvbench models fetch qwen2.5-coder-1.5b`."""
    from kvbench.bridge import builtin
    from kvbench.bridge.models import cache_dir, converted, usable_cache_dir
    from kvbench.core.errors import BadInput

    if name not in builtin.BUILTIN:
        raise BadInput(f"{name!r} is not a built-in model: {', '.join(builtin.BUILTIN)}")
    model = builtin.BUILTIN[name]
    if gguf is not None:
        if not gguf.is_file():
            raise BadInput(f"--gguf {gguf}: no such file")
        usable_cache_dir()
        builtin.place_gguf(model, gguf, cache_dir())
    click.echo(f"{name}: {converted(name)}")
