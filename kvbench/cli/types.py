"""Click parameter types of kvbench's options."""

import click

from kvbench.core.errors import BadInput
from kvbench.core.validation import interval_text, parse_float


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
