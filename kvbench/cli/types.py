"""Click parameter types of kvbench's options."""

from pathlib import Path

import click

from kvbench.core.errors import BadInput
from kvbench.core.validation import interval_text, parse_float, parse_int


class Number(click.ParamType):
    """A click option's float, through `parse_float`: `--lr nan` and `--lr inf` are usage errors."""

    name = "float"

    def __init__(self, low=None, high=None, *, low_open=False, high_open=False):
        self.bounds = dict(low=low, high=high, low_open=low_open, high_open=high_open)

    def convert(self, value, param, ctx):
        try:
            return parse_float(value, "the value", **self.bounds)
        except BadInput as error:
            self.fail(str(error).removeprefix("the value "), param, ctx)

    def get_metavar(self, param, ctx=None) -> str:
        text = interval_text(**self.bounds)
        return f"FLOAT {text.removeprefix('in ')}" if text else "FLOAT"


class Whole(click.ParamType):
    """A click option's integer, through `parse_int`: ASCII digits only (`1_000`, `12.0` and other scripts'
    digits, which Python's int() reads, are usage errors), within [low, high]."""

    name = "integer"

    def __init__(self, low: int | None = None, high: int | None = None):
        self.low, self.high = low, high

    def convert(self, value, param, ctx):
        try:
            return parse_int(value, "the value", self.low, self.high)
        except BadInput as error:
            self.fail(str(error).removeprefix("the value "), param, ctx)

    def get_metavar(self, param, ctx=None) -> str:
        text = interval_text(self.low, self.high, False, False)
        return f"INTEGER {text.removeprefix('in ')}" if text else "INTEGER"


class Names(click.Choice):
    """One of a registry's names as it holds them when the command line is parsed (those of plugins
    installed since the command was built included), listed without loading any."""

    def __init__(self, registry):
        self.registry = registry
        super().__init__(())

    @property
    def choices(self) -> tuple[str, ...]:
        return tuple(self.registry)

    @choices.setter
    def choices(self, _value) -> None:
        """The names are the registry's: what click's constructor sets is ignored."""


class Folder(click.Path):
    """A folder option, as a Path: blank (`--out ''`) is a usage error, not the current folder."""

    def __init__(self, **checks):
        super().__init__(file_okay=False, path_type=Path, **checks)

    def convert(self, value, param, ctx):
        if isinstance(value, str) and not value.strip():
            self.fail("names no folder", param, ctx)
        return super().convert(value, param, ctx)
