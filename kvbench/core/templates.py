"""The one Jinja environment for templates kvbench renders from files it did not write (a task YAML's
`templates:`, a model's chat template): sandboxed, immutable and capped, so that a shared file can neither
run code (`cycler.__init__.__globals__.os`) nor exhaust memory (`range(10**10)`, `'x' * 10**10`).

Caps, each refused with `jinja2.sandbox.SecurityError` before the value is built: `range` yields at most
Jinja's `MAX_RANGE` items; a call, filter or `%` given a whole number above `MAX_OUTPUT` (a width, a count),
and a `str.format` field of such a width;
a `*` whose result would hold more than `MAX_OUTPUT` items; a `**` of more than `MAX_OUTPUT` bits; a render
longer than `MAX_OUTPUT` characters.
"""

import functools
import operator
from numbers import Integral

MAX_OUTPUT = 10_000_000  # characters of one render (a long context is a few MB of text)


def security_error(message: str) -> Exception:
    from jinja2.sandbox import SecurityError

    return SecurityError(message)


def check_numbers(values) -> None:
    """SecurityError when a template passes a whole number above MAX_OUTPUT (a width or a count)."""
    for value in values:
        if isinstance(value, Integral) and not isinstance(value, bool) and abs(int(value)) > MAX_OUTPUT:
            raise security_error(f"a template's number {value} is above the sandbox's cap of {MAX_OUTPUT}")


def check_format_widths(function) -> None:
    """SecurityError when `function` is a text's `format` whose fields ask for a width above MAX_OUTPUT."""
    import re
    import string

    text = getattr(function, "__self__", None)
    if isinstance(text, str) and getattr(function, "__name__", "") in ("format", "format_map"):
        for _, _, spec, _ in string.Formatter().parse(text):
            check_numbers(int(number) for number in re.findall(r"\d+", spec or ""))


def sized_product(left, right):
    """`left * right`, refused before it is built when it would hold more than MAX_OUTPUT items."""
    for sequence, count in ((left, right), (right, left)):
        if isinstance(sequence, (str, bytes, list, tuple)) and isinstance(count, Integral):
            if len(sequence) * max(int(count), 0) > MAX_OUTPUT:
                raise security_error(f"a template's product is longer than {MAX_OUTPUT} items")
    return operator.mul(left, right)


def sized_power(left, right):
    """`left ** right`, refused when the result would be a whole number of more than MAX_OUTPUT bits."""
    if isinstance(left, Integral) and isinstance(right, Integral) and abs(int(left)) > 1 and right > 0:
        if int(right) * abs(int(left)).bit_length() > MAX_OUTPUT:
            raise security_error(f"a template's power is larger than {MAX_OUTPUT} bits")
    return operator.pow(left, right)


def sized_format(left, right):
    """`left % right`, with the numbers it formats (a `%*d` width among them) checked."""
    check_numbers(right if isinstance(right, tuple) else [right])
    return operator.mod(left, right)


def capped_filter(function):
    @functools.wraps(function)  # keeps Jinja's pass_context and pass_environment marks
    def capped(*args, **kwargs):
        check_numbers([*args, *kwargs.values()])
        return function(*args, **kwargs)

    return capped


@functools.cache
def environment_class():
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class CappedSandbox(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**", "%"})
        binops = {"*": sized_product, "**": sized_power, "%": sized_format}

        def __init__(self, **options):
            super().__init__(**options)
            self.filters = {name: capped_filter(function) for name, function in self.filters.items()}

        def call_binop(self, context, operator, left, right):
            return self.binops[operator](left, right)

        def wrap_str_format(self, value):
            check_format_widths(value)
            return super().wrap_str_format(value)

        def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (Jinja's own signature)
            check_numbers([*args, *kwargs.values()])
            return super().call(__context, __obj, *args, **kwargs)

    return CappedSandbox


def sandboxed_environment(**options):
    """A sandboxed, immutable Jinja environment with kvbench's caps; `options` as `jinja2.Environment`'s."""
    return environment_class()(**options)


def render_capped(template, variables: dict) -> str:
    """`template` (of `sandboxed_environment`) rendered with `variables`; SecurityError once the text grows
    past MAX_OUTPUT characters, before more is built."""
    pieces, size = [], 0
    for piece in template.generate(variables):
        size += len(piece)
        if size > MAX_OUTPUT:
            raise security_error(f"a template renders more than {MAX_OUTPUT} characters")
        pieces.append(piece)
    return "".join(pieces)
