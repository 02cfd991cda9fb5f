"""The `kvbench` group's machinery: heavy commands loaded lazily (`LAZY_COMMANDS`), and the one place where
errors become one line and an exit code. A KvbenchError (bad input, a missing model or data file;
kvbench.core.errors) and click's usage errors are one line on stderr and exit code 2 (1 for a results
folder that cannot be written), raised before any work or any write. Any other exception is a bug: it keeps
its traceback (exit code 1)."""

import contextlib
import errno
import importlib
import signal
import warnings

import click

from kvbench.bridge.models import first_line
from kvbench.core.errors import KvbenchError, KvbenchWarning
from kvbench.learned.catalog import LEARNED

# Commands whose modules are heavy to import (plots, lm-eval, training) load only when called; their one-line
# help is here (a learned press's in its declaration) so that `kvbench --help` lists them without torch.
LAZY_COMMANDS = {
    "export": ("kvbench.cli.interop:export_command", "Write results as kvpress evaluation's output folders."),
    "import": ("kvbench.cli.interop:import_command", "Read kvpress evaluation's output folders as results."),
    "report": (
        "kvbench.cli.report:report",
        "Leaderboards, per-task tables and plots from one or more results folders.",
    ),
    **{press.name: press.command for press in LEARNED if press.command},  # `kvbench gate`, ...
    "fit": (
        "kvbench.cli.fit:fit",
        "Fit offline, for any model, the state kvpress downloads for qfilter, kvzap, duo_attention, ...",
    ),
    "lm-eval": (
        "kvbench.cli.lm_eval:lm_eval_command",
        "Run lm-eval tasks with every request answered under a press.",
    ),
    "perplexity": (
        "kvbench.cli.perplexity:perplexity",
        "Perplexity of long texts with each press's KV cache held at its budget as the text is read.",
    ),
    "models": (
        "kvbench.cli.models:models",
        "List the built-in models: name, size, shape, where the GGUF comes from, and whether it is here.",
    ),
    "compare-models": (
        "kvbench.cli.compare_models:compare_models",
        "Whether the order of presses on one model (a results folder) carries to another.",
    ),
    "check-press": (
        "kvbench.cli.check_press:check_press_command",
        "Whether PRESS does what it claims: budget, memory, cache order, determinism, isolation, parity.",
    ),
    "speed": (
        "kvbench.cli.speed:speed",
        "What each press costs run alone: prefill overhead, decode tokens/s, allocated vs accounted bytes.",
    ),
}


class Group(click.Group):
    """Loads heavy commands lazily; the one place where errors become one line and an exit code."""

    def list_commands(self, ctx):
        return sorted([*super().list_commands(ctx), *LAZY_COMMANDS])

    def get_command(self, ctx, cmd_name):
        if cmd_name in LAZY_COMMANDS:
            module, attribute = LAZY_COMMANDS[cmd_name][0].split(":")
            return getattr(importlib.import_module(module), attribute)
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx, formatter):
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(map(len, names))
        rows = [
            (name, LAZY_COMMANDS[name][1])
            if name in LAZY_COMMANDS
            else (name, self.commands[name].get_short_help_str(limit))
            for name in names
        ]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def invoke(self, ctx):
        with warnings.catch_warnings(), _terminate_as_interrupt():
            warnings.showwarning = _one_line_warnings(warnings.showwarning)
            try:
                return super().invoke(ctx)
            except click.UsageError as error:  # click's own: one line too, without the usage block
                click.echo(f"Error: {error.format_message()}", err=True)
                ctx.exit(2)
            except KvbenchError as error:
                click.echo(f"Error: {first_line(error)}", err=True)
                ctx.exit(error.exit_code)
            except _Terminated:
                click.echo("terminated", err=True)
                ctx.exit(128 + signal.SIGTERM)
            except KeyboardInterrupt:
                click.echo("interrupted", err=True)
                ctx.exit(130)
            except OSError as error:
                if error.errno != errno.ENAMETOOLONG:
                    raise
                # Looking a path up (is_file, exists) raises for a name longer than the file system takes,
                # wherever a command first looks: the path is the user's input, so one line and exit 2.
                named = str(error.filename or "")
                click.echo(f"Error: a path is too long for the file system: {named[:60]!r}...", err=True)
                ctx.exit(2)


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the command is, as Ctrl-C raises KeyboardInterrupt."""


@contextlib.contextmanager
def _terminate_as_interrupt():
    """While a command runs, SIGTERM (a `kill`, a job scheduler's time limit) unwinds it as Ctrl-C does:
    what it was writing is finished or rolled back (a half-made report's staging folder, a sweep's claims)
    rather than left behind by an abrupt exit. The previous handler is restored after."""

    def terminate(signum, frame):
        raise _Terminated

    try:
        previous = signal.signal(signal.SIGTERM, terminate)
    except ValueError:  # not the main thread: signals cannot be handled here
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _one_line_warnings(show):
    """A warnings.showwarning that prints kvbench's warnings as one `Warning:` line, others as `show` does."""

    def show_warning(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, KvbenchWarning):
            click.echo(f"Warning: {message}", err=True)
        else:
            show(message, category, filename, lineno, file, line)

    return show_warning
