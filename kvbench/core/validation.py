"""Values checked at the boundary: numbers from the command line and the Python API, and the files kvbench
reads, each refused in one line that names the culprit.

- Numbers: `parse_float` and `parse_int` are the one way a number from a user becomes a value (a ratio, a
  memory budget, a learning rate, a seed, a length). Text or a number is accepted; nan and inf never are
  (no option of kvbench means anything at nan, and an infinite rate or fraction trains nonsense); neither
  are booleans (`True` is an int to Python, never a ratio to a user). Click options take them through
  `cli.types.Number`, a ParamType, so `--lr nan` is a usage error like `--lr abc`.
- Values typed as text (`--press-arg KEY=VALUE`): `parse_value` types them by one rule (YAML 1.2's core
  schema, decimal only: `010` is 10, `5e-1` 0.5, `yes` and `0x10` text), its numbers through the two above.
- Files: each kind of file kvbench reads (results rows, run records, training manifests, calibrations,
  local task data) has one schema, declared where it is read, as pydantic models or as annotated fields of
  a dataclass (`check_fields`); `check` validates a decoded JSON value against one and turns pydantic's
  report into one line: where (file and line), which field, what is wrong. Validation is strict: a file
  kvbench wrote holds the exact JSON types it wrote, so "0.5" where a number belongs, 1.0 where an integer
  belongs or a list where an object belongs is a damaged file, not something to coerce.
- Integers in files must fit in 64 bits (`Int64`): what pandas and torch hold without overflow.
- JSONL lines: `jsonl_lines` is the one way every JSONL file kvbench reads (results rows, costs, traces,
  study rows, local texts) is cut into lines, so that all its readers agree on where a line ends.
- JSON decoded outside pydantic: `parse_json` is the one `json.loads` of the file readers; JSON nested deeper
  than `MAX_DEPTH` (pydantic's own parser's limit) is a ValueError like any malformed JSON, never a
  RecursionError traceback, so each reader refuses it in its one line naming the file.
- Opening a file: `open_plain` (and `read_bytes`, `read_text` on it) is the one way a reader opens a file
  kvbench is given or finds in a folder. Anything but a plain file is refused before a byte is read: a FIFO
  blocks the open, or the read, until a writer comes (for ever), a device may never end (/dev/zero), a
  socket cannot be read at all. It is opened without blocking and checked with fstat, on the opened file.
- Counts: `parse_count` bounds a count of things kvbench makes one by one (texts, samples, requests) at
  `MAX_COUNT`, so that a digit too many is refused at once, not found out after hours of work.

The lowest layer: of kvbench it imports only the errors (BadInput by default; callers that read files
pass their own type), and pydantic only when a first file is checked, so `kvbench --help` does not pay
for it.
"""

import dataclasses
import errno
import functools
import json
import math
import numbers
import os
import re
import stat
from pathlib import Path
from typing import Annotated, Any

import annotated_types

from kvbench.core.errors import BadInput

INT64 = 2**63
# The most of anything kvbench makes one at a time (texts, samples, requests): more than a machine gets
# through in days. A bigger count is a slip (a digit too many), and would run, or hang, until killed.
MAX_COUNT = 1_000_000
# Integer fields of files: 64-bit, as pandas and torch store them.
Int64 = Annotated[int, annotated_types.Interval(ge=-INT64, lt=INT64)]
Count = Annotated[int, annotated_types.Interval(ge=0, lt=INT64)]
Positive = Annotated[int, annotated_types.Interval(ge=1, lt=INT64)]
# Float fields of files (nan and inf are refused for every float of a schema: see `STRICT`).
NonNegative = Annotated[float, annotated_types.Ge(0)]
PositiveReal = Annotated[float, annotated_types.Gt(0)]  # a time, a rate: what ratios divide by
Ratio = Annotated[float, annotated_types.Interval(ge=0, lt=1)]  # fraction of KV entries removed
Memory = Annotated[float, annotated_types.Interval(gt=0, le=1)]  # fraction of the 16-bit full cache
MIB = 2**20  # bytes in a MiB: the unit of byte budgets given and shown
# What every schema is validated with: exact JSON types, finite floats.
STRICT = {"strict": True, "allow_inf_nan": False}
MAX_DEPTH = 200  # the deepest JSON nesting a reader accepts: pydantic's JSON parser's own limit
LINE_END = re.compile(r"\r\n|\r|\n")  # where a JSONL line ends: JSON text never holds these raw


def jsonl_lines(text: str) -> list[str]:
    """The lines of JSONL `text`, without their ends. A line ends at "\n", "\r\n" or a lone "\r", and
    nowhere else: not at U+2028, U+2029 or U+0085, which JSON allows raw inside a string (`jq -c` writes
    them so), as `str.splitlines()` would. A last line without an end is a line; a final end starts none.
    Blank lines are kept (they count in line numbers); each reader skips them."""
    lines = LINE_END.split(text)
    if lines[-1] == "":
        lines.pop()
    return lines


def whole_lines_size(data: bytes) -> int:
    """How many bytes of `data` are whole lines: up to and with its last line end (b"\n" or b"\r", as
    `jsonl_lines` splits); 0 when it holds none. Safe on UTF-8: neither byte occurs inside a multi-byte
    character. A trailing b"\r" counts as an end (a "\n" after it would only add a blank line)."""
    return max(data.rfind(b"\n"), data.rfind(b"\r")) + 1


def parse_json(text: str | bytes) -> Any:
    """`json.loads(text)` for a file kvbench reads, with JSON nested deeper than `MAX_DEPTH` refused as a
    ValueError (as any malformed JSON is): at ~1000 levels json raises RecursionError, a traceback, and
    a value nested hundreds deep overflows the stack of whatever walks it next. A lone surrogate escape
    (`"\\ud800"`) is refused too, as pydantic's JSON parser refuses it."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise ValueError(f"JSON nested deeper than {MAX_DEPTH} levels") from None
    opening = (b"[", b"{") if isinstance(text, bytes | bytearray) else ("[", "{")
    if sum(text.count(bracket) for bracket in opening) > MAX_DEPTH and nesting(value) > MAX_DEPTH:
        raise ValueError(f"JSON nested deeper than {MAX_DEPTH} levels")
    if re.search(
        rb"\\u[dD][89a-fA-F]" if isinstance(text, bytes | bytearray) else r"\\u[dD][89a-fA-F]", text
    ):
        try:  # a surrogate escape not in a pair decodes to a str no tokenizer, file or UTF-8 writer takes
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("a \\uD800-\\uDFFF escape outside a surrogate pair (not a character)") from None
    return value


def nesting(value: Any) -> int:
    """How deep lists and dicts nest in a decoded JSON value (0 for a scalar), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is not None:
            deepest = max(deepest, level)
            stack.extend((child, level + 1) for child in children)
    return deepest


def interval_text(low: float | None, high: float | None, low_open: bool, high_open: bool) -> str:
    """'in [0, 1)', '> 0', '>= 1', or '' for no bounds (integers written out: 1000000, not 1e+06)."""

    def written(bound: float) -> str:
        return str(bound) if isinstance(bound, int) else f"{bound:g}"

    if low is not None and high is not None:
        return f"in {'(' if low_open else '['}{written(low)}, {written(high)}{')' if high_open else ']'}"
    if low is not None:
        return f"{'>' if low_open else '>='} {written(low)}"
    if high is not None:
        return f"{'<' if high_open else '<='} {written(high)}"
    return ""


# How a number is written, in ASCII: what parse_int and parse_float read (Python's int() and float() also
# take `1_000` and other scripts' digits, which a user did not mean as a number).
INTEGER = re.compile(r"[-+]?[0-9]+")
DECIMAL = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")
NOT_FINITE = re.compile(r"[-+]?\.?(inf|infinity|nan)", re.IGNORECASE)


def parse_float(
    value: Any,
    what: str,
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
    high_open: bool = False,
    error: type[Exception] = BadInput,
) -> float:
    """`value` (a number or its text) as a finite float within the bounds; `error` naming `what` if not.
    -0.0 comes back as 0.0, so that it prints and hashes as the 0 it means."""
    bounds = interval_text(low, high, low_open, high_open)
    within = f" {bounds}" if bounds else ""
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, str)):
        raise error(f"{what} must be a number{within}, got {value!r}")
    if isinstance(value, str) and not (
        DECIMAL.fullmatch(value.strip()) or NOT_FINITE.fullmatch(value.strip())
    ):
        raise error(f"{what} must be a number{within}, got {value!r}")
    try:
        number = float(value)
    except ValueError:
        raise error(f"{what} must be a number{within}, got {value!r}") from None
    if not math.isfinite(number):
        raise error(f"{what} must be a finite number{within}, got {number}")
    below = low is not None and (number <= low if low_open else number < low)
    above = high is not None and (number >= high if high_open else number > high)
    if below or above:
        raise error(f"{what} must be {bounds}, got {value}")
    return number + 0.0


def parse_int(
    value: Any,
    what: str,
    low: int | None = None,
    high: int | None = None,
    *,
    error: type[Exception] = BadInput,
) -> int:
    """`value` (an integer or its text) as an int within the bounds (and 64 bits); `error` naming `what`
    if not. A float is refused even when whole (512.0): a length or a seed given as a float is a slip."""
    bounds = interval_text(low, high, False, False)
    within = f" {bounds}" if bounds else ""
    text = value.strip() if isinstance(value, str) else None
    if isinstance(value, bool) or not (isinstance(value, numbers.Integral) or INTEGER.fullmatch(text or "")):
        raise error(f"{what} must be a whole number{within}, got {value!r}")
    try:
        number = int(text) if text is not None else int(value)
    except ValueError:
        raise error(f"{what} must be a whole number{within}, got {value!r}") from None
    if low is not None and number < low:
        raise error(f"{what} must be at least {low}, got {number}")
    if number > (INT64 - 1 if high is None else high) or number < -INT64:
        raise error(f"{what} must be at most {INT64 - 1 if high is None else high}, got {number}")
    return number


TRUE, FALSE, NULL = ("true", "True", "TRUE"), ("false", "False", "FALSE"), ("null", "Null", "NULL", "~", "")


def parse_value(text: str, what: str, error: type[Exception] = BadInput) -> Any:
    """The value a user typed as text (a press argument), by one rule, YAML 1.2's core schema without its
    surprises: decimal digits with an optional sign are an int (`010` is 10: never octal, and `0x10`, `1:30`,
    `1_000` stay text); a decimal number with a point or an exponent is a float (`0.5`, `.5`, `5e-1`,
    `1E3`); `true`/`false` (or True, TRUE, ...) a bool and `null`, `~` or nothing None (`yes`, `on`, `no`
    stay text); `[a, 1]` and `{k: 1}` a list and a dict in YAML's flow style, each item read by this same
    rule; a value in quotes the text inside them; anything else the text itself, surrounding spaces
    dropped. Numbers go through `parse_int` and `parse_float`: an int beyond 64 bits, a float that
    overflows (`1e999`), inf and nan are refused, as `error` naming `what`."""
    text = text.strip()
    if text.startswith(("[", "{", "'", '"')):
        return flow_value(text, what, error)
    return plain_value(text, what, error)


def plain_value(text: str, what: str, error: type[Exception]) -> Any:
    if text in TRUE or text in FALSE:
        return text in TRUE
    if text in NULL:
        return None
    if INTEGER.fullmatch(text):
        return parse_int(text, what, error=error)
    if DECIMAL.fullmatch(text) or NOT_FINITE.fullmatch(text):
        return parse_float(text.replace(".inf", "inf").replace(".nan", "nan"), what, error=error)
    return text


def flow_value(text: str, what: str, error: type[Exception]) -> Any:
    """A list, dict or quoted text in YAML's flow style; plain items typed by `plain_value`. Anchors,
    aliases and tags are refused: the text is a value, not a YAML document."""
    import yaml

    class Composer(yaml.SafeLoader):
        def compose_node(self, parent, index):
            event = self.peek_event()
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
                raise yaml.YAMLError("anchors and aliases (&name, *name) are not read")
            if getattr(event, "tag", None) not in (None, "!"):
                raise yaml.YAMLError(f"tags ({event.tag}) are not read")
            return super().compose_node(parent, index)

    def build(node) -> Any:
        if isinstance(node, yaml.SequenceNode):
            return [build(item) for item in node.value]
        if isinstance(node, yaml.MappingNode):
            built = {}
            for key_node, value_node in node.value:
                key = build(key_node)
                if isinstance(key, (list, dict)):
                    raise error(f"{what}: a key of {text!r} is a list or a dict")
                built[key] = build(value_node)
            return built
        return node.value if node.style else plain_value(node.value, what, error)  # style: quoted

    try:
        loader = Composer(text)
        try:
            node = loader.get_single_node()
        finally:
            loader.dispose()
    except (yaml.YAMLError, RecursionError) as failure:
        reason = str(failure).splitlines()[0] if str(failure) else "nested too deeply"
        raise error(f"{what}: cannot read {text!r} ({reason})") from None
    return build(node)


@functools.cache
def json_adapter(schema):
    """pydantic's validator of `schema`, built once; pydantic is imported here, when a first file is read."""
    import pydantic

    return pydantic.TypeAdapter(schema)


def check_json(schema, text: str | bytes, where: str, error: type[Exception] = BadInput):
    """The JSON document `text` as `schema`: a dataclass whose `__pydantic_config__` is STRICT (each nested
    one too), or a list or dict of them; `error` with one line if it is not JSON or does not fit: where,
    the first bad field, what is wrong with it. JSON mode, so arrays fill tuple fields and objects fill
    dataclasses, as JSON can only say them; fields a schema does not name are ignored."""
    import pydantic

    try:
        return json_adapter(schema).validate_json(text)
    except pydantic.ValidationError as failure:
        raise error(f"{where}: {describe(failure)}" if where else describe(failure)) from None


def check(schema, value: Any, where: str, error: type[Exception] = BadInput):
    """`value` validated against `schema`, a pydantic model: the model's instance; `error` with one line if
    it does not fit: where, the first bad field, what is wrong with it."""
    import pydantic

    try:
        return schema.model_validate(value)
    except pydantic.ValidationError as failure:
        raise error(f"{where}: {describe(failure)}" if where else describe(failure)) from None


def check_fields(dataclass_type, values: dict, where: str, error: type[Exception] = BadInput) -> dict:
    """`values` validated against the annotated fields of a dataclass (`schema_of`): the values as checked
    (an int in a float field comes back a float); `error` with one line if one does not fit."""
    return check(schema_of(dataclass_type), values, where, error).model_dump(exclude_unset=True)


@functools.cache
def schema_of(dataclass_type):
    """A strict pydantic model of a dataclass's fields, built once, every field optional (absent), so that
    the caller says which must be there: a row of an older version lacks the newer fields. pydantic is
    imported here, when a first file is read."""
    import pydantic

    fields = {field.name: (field.type | None, None) for field in dataclasses.fields(dataclass_type)}
    return pydantic.create_model(
        f"{dataclass_type.__name__}Schema", __config__=pydantic.ConfigDict(**STRICT), **fields
    )


def describe(failure) -> str:
    """pydantic's report as one line: 'field a.b: <what is wrong> (got <value>)' for the first bad field,
    'field a.b is null: ...' when it is null, and how many other fields are bad. A union (`str | list[str]`)
    is one field: a value of none of its kinds 'should be a text or a list of texts'; a value of one of its
    kinds that fails inside it (a list with a bad item) is told as that kind's error (`first_problem`)."""
    errors = failure.errors()
    loc, message, value, kind = first_problem(errors)
    where = ".".join(str(part) for part in loc)
    got = repr(value)
    got = got if len(got) <= 40 else got[:37] + "..."
    own = re.fullmatch(r"[Vv]alue error, field '([^']+)': (.*)", message) if kind == "value_error" else None
    if own:  # an object's own check of one of its fields (`__post_init__`): that field, not the object
        text = f"field {'.'.join(filter(None, (where, own[1])))!r}: {own[2]}"
    elif kind == "missing":  # a missing field's input is the object that lacks it
        text = f"field {where!r}: {message}" if where else message
    elif value is None and where:
        text = f"field {where!r} is null: {message}"
    else:
        text = f"{f'field {where!r}: ' if where else ''}{message} (got {got})"
    more = len({field_of(errors, error["loc"]) for error in errors} - {field_of(errors, errors[0]["loc"])})
    return text + (f"; {more} more bad field{'s' if more > 1 else ''}" if more else "")


# How pydantic labels the branches of a union in an error's location: a type ('str', 'list[str]',
# 'constrained-int', 'literal[...]') or a model's or dataclass's name.
BRANCH_LABEL = re.compile(r"[A-Z]\w*|[a-z-]+\[.*\]|constrained-\w+|str|int|float|bool|bytes|none")
NOUNS = {
    "str": ("a text", "texts"),
    "int": ("a whole number", "whole numbers"),
    "float": ("a number", "numbers"),
    "bool": ("a boolean", "booleans"),
    "bytes": ("bytes", "bytes"),
    "none": ("null", "nulls"),
}


def union_at(errors: list[dict], loc: tuple) -> int | None:
    """Where in `loc` the first union branch's label is: a label (`BRANCH_LABEL`) beside which another error
    has another label at the same place; None for a location without one."""
    for k, part in enumerate(loc):
        if isinstance(part, str) and BRANCH_LABEL.fullmatch(part):
            siblings = {
                other[k]
                for other in (error["loc"] for error in errors)
                if len(other) > k and other[:k] == loc[:k] and isinstance(other[k], str)
            }
            if len({label for label in siblings if BRANCH_LABEL.fullmatch(label)}) > 1:
                return k
    return None


def field_of(errors: list[dict], loc: tuple) -> tuple:
    """The field an error is of: its location up to its first union branch."""
    k = union_at(errors, loc)
    return loc if k is None else loc[:k]


def first_problem(errors: list[dict]) -> tuple[tuple, str, Any, str]:
    """(location, message, value, pydantic's error type) of the first error, union branches taken out of the
    location. When the first error is a union's and every branch refused the value's kind at its top, the
    message names the kinds the value should be; otherwise the problem is within the branches that took
    its kind (a bad item, a number out of range), found the same way among their errors."""
    first = errors[0]
    k = union_at(errors, first["loc"])
    if k is None:
        message = first["msg"][0].lower() + first["msg"][1:]
        return first["loc"], message, first.get("input"), first["type"]
    root = first["loc"][:k]
    branches = [error for error in errors if error["loc"][:k] == root and union_at(errors, error["loc"]) == k]
    inside = [error for error in branches if len(error["loc"]) > k + 1 or not wrong_kind(error["type"])]
    if inside:
        return first_problem([{**error, "loc": error["loc"][:k] + error["loc"][k + 1 :]} for error in inside])
    kinds = list(dict.fromkeys(noun(error["loc"][k]) for error in branches))
    return root, f"should be {either(kinds)}", first.get("input"), first["type"]


def either(words: list[str]) -> str:
    """'a', 'a or b', 'a, b or c'."""
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


def wrong_kind(error_type: str) -> bool:
    """Whether a pydantic error type says the value is of another kind (not a text, not a list, ...)."""
    return error_type.endswith("_type") or error_type in ("literal_error", "none_required", "is_instance_of")


def noun(label: str, plural: bool = False) -> str:
    """A union branch's label in words: 'str' a text, 'list[str]' a list of texts, a model an object."""
    wrapped = re.fullmatch(r"(?:function-\w+\[\w*\(\), |nullable\[)(.*)\]", label)  # the type inside
    label = wrapped.group(1) if wrapped else label.removeprefix("constrained-")
    base, _, inner = label.partition("[")
    inner = inner.removesuffix("]")
    if base in ("list", "tuple", "set", "frozenset"):
        item = inner.removesuffix(", ...")  # a tuple of any length
        simple = re.fullmatch(r"[\w-]+", item)  # else a union, a list of lists: "a list" says enough
        return "lists" if plural else f"a list of {noun(item, plural=True)}" if simple else "a list"
    if base == "dict" or label[:1].isupper():
        return "objects" if plural else "an object"
    if base == "literal":
        return f"one of {inner}"
    if label in NOUNS:
        return NOUNS[label][plural]
    return label


def load_yaml(path, error: type[Exception] = BadInput) -> Any:
    """The YAML document of the file at `path` (a suite, a task), read with the safe loader and without
    aliases (a few hundred bytes of nested aliases expand to gigabytes); `error` in one line naming the
    file when it is missing, a folder, not UTF-8 or not YAML."""
    import yaml

    class Loader(yaml.SafeLoader):
        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                raise yaml.YAMLError("aliases (*name) are not read")
            return super().compose_node(parent, index)

    try:
        return yaml.load(read_text(path, error), Loader=Loader)  # noqa: S506 (a SafeLoader)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        raise error(f"{path}: no such file") from None
    except UnicodeDecodeError:
        raise error(f"{path}: not UTF-8 text") from None
    except (yaml.YAMLError, RecursionError) as failure:
        raise error(
            f"{path}: not YAML ({str(failure).splitlines()[0] if str(failure) else 'too deep'})"
        ) from None


def as_path(value: Any, what: str, error: type[Exception] = BadInput) -> Path:
    """`value`, a str or os.PathLike, as a Path; `error` naming `what` for anything else (None, a number):
    the Python API's path arguments, checked where they come in rather than failing inside pathlib."""
    if isinstance(value, (str, os.PathLike)):
        return Path(value)
    raise error(f"{what}: a path (a str or os.PathLike), got {value!r}")


def as_paths(value: Any, what: str, error: type[Exception] = BadInput) -> list[Path]:
    """`value`, one path (`as_path`) or a list or tuple of them, as a list of Paths."""
    if isinstance(value, (list, tuple)):
        return [as_path(item, what, error) for item in value]
    return [as_path(value, what, error)]


def parse_count(
    value: Any, what: str, low: int = 1, high: int = MAX_COUNT, *, error: type[Exception] = BadInput
) -> int:
    """A count of things kvbench makes one by one (texts, samples, requests): `parse_int` in [low, high],
    `MAX_COUNT` at most unless told, so that 99999999999999999999 texts is refused now, saying the most
    it takes, instead of running until killed."""
    return parse_int(value, what, low, high, error=error)


KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}


def open_plain(path, error: type[Exception] = BadInput):
    """The file at `path` open for reading, in binary; `error` naming it when it is not a plain file (a FIFO,
    a device, a socket), before a byte is read. It is opened without blocking (a FIFO's open waits for a
    writer otherwise) and checked on the open file (fstat), so nothing can be swapped in between. A missing
    file, a folder or a file that cannot be opened raise the OSError open() raises (FileNotFoundError,
    IsADirectoryError, PermissionError, ...), for the caller's own message."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        if not stat.S_ISREG(mode):
            raise error(f"{path} is not a plain file ({KINDS.get(stat.S_IFMT(mode), 'of an unknown kind')})")
        os.set_blocking(fd, True)
        return open(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes(path, error: type[Exception] = BadInput) -> bytes:
    """The bytes of the plain file at `path` (`open_plain`)."""
    with open_plain(path, error) as file:
        return file.read()


def read_text(path, error: type[Exception] = BadInput, encoding: str = "utf-8") -> str:
    """The text of the plain file at `path` (`open_plain`); UnicodeDecodeError when it is not `encoding`."""
    return read_bytes(path, error).decode(encoding)
