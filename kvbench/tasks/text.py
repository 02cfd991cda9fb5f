"""Training kinds for learned presses, generated offline: prose, records, logs, code and multi-document
contexts, each under three instruction wrappers (see docs/learned-presses.md and kvbench.tasks.mixture).

Every task asks for one value that appears verbatim in the material right after a key that appears
nowhere else, so it can only be answered from the context:

- text_prose_quote: passages of the Python language reference (`pydoc_data.topics`); how a sentence goes
  on after its first eight words.
- text_json_records: a JSON array of account records, one per line; the field that follows an owner.
- text_csv_table: a CSV inventory table; the column that follows a product.
- text_log_lines: logfmt access-log lines; the duration of a named request.
- text_code_signature: Python standard library source (the running interpreter's own files); the
  parameters of a function, by name.
- text_multidoc_author: sections of the language reference as documents with a metadata header each; the
  author of the document with a title.

The answer prefix repeats the key's text as it stands in the material (`{"owner": "calm otter",
"balance": "`, `def wrap(`), as RULER's prefixes repeat its needles: with a paraphrase ("The owner of record
R-60418 is") the embedded 135M model answered none of 5 JSON and none of 5 CSV samples. Scores: RULER's
`string_match_all` on the one reference. Layouts (the instruction wrappers; each sample draws one): the
instruction before the material in the user turn, the instruction in a system turn, or the material first
and the instruction with the question. The held-out suites (kvbench.tasks.heldout) use none of them.
"""

import functools
import json
import random
import re

from kvbench.tasks import agent, generated, prompt, words
from kvbench.tasks.family import Family
from kvbench.tasks.generated import Draft, Generator, Layout, Placed

# ---- Layouts ----


def instruction_first(draft: Draft) -> Placed:
    return Placed(f"{draft.instruction}\n\n{draft.body}\n\n", draft.question)


def system_instruction(draft: Draft) -> Placed:
    messages = [{"role": "system", "content": draft.instruction}, {"role": "user", "content": draft.body}]
    return Placed(prompt.transcript(messages), draft.question, messages)


def instruction_last(draft: Draft) -> Placed:
    return Placed(f"{draft.body}\n\n", f"{draft.instruction}\n{draft.question}")


LAYOUTS = (
    Layout("instruction-first", instruction_first),
    Layout("system-instruction", system_instruction),
    Layout("instruction-last", instruction_last),
)


# ---- Prose: quote a sentence of the language reference ----

OPENING_WORDS, QUOTED_WORDS = 8, 3


@functools.cache
def quotable() -> tuple[tuple[int, str, str], ...]:
    """(paragraph index, opening, continuation) of every sentence whose first words occur once in the prose
    and are followed by at least QUOTED_WORDS more words."""
    found = []
    every = "\n".join(generated.paragraphs())
    for index, paragraph in enumerate(generated.paragraphs()):
        for sentence in re.split(r"(?<=[.!?]) ", paragraph):
            words = sentence.split()
            if len(words) < OPENING_WORDS + QUOTED_WORDS or not sentence[0].isupper():
                continue
            opening = " ".join(words[:OPENING_WORDS])
            if every.count(opening) == 1:
                found.append((index, opening, " ".join(words[OPENING_WORDS : OPENING_WORDS + QUOTED_WORDS])))
    return tuple(found)


def prose_quote(seed: str, units: int) -> Draft:
    rng = random.Random(f"{seed}/needle")
    index, opening, continuation = rng.choice(quotable())
    pool = generated.paragraphs()
    start = generated.in_window(len(pool), units, index, rng.random())
    body = "\n\n".join(pool[(start + k) % len(pool)] for k in range(units))
    return Draft(
        body,
        "The text is made of passages from the Python language reference. "
        "You will be asked to quote one of its sentences exactly.",
        f'Quote the sentence that begins with "{opening}": how does it go on?',
        opening,
        continuation,
    )


# ---- Records: JSON, CSV, logs ----

STATUSES = ("active", "suspended", "closed", "pending")
METHODS = ("GET", "GET", "GET", "POST", "PUT", "DELETE")


def money(rng: random.Random, high: int) -> str:
    return f"{rng.randint(1, high)}.{rng.randint(0, 99):02d}"


def account_fields(rng: random.Random) -> dict[str, str]:
    return {
        "account": f"AC-{words.digits(rng, 6)}",
        "balance": money(rng, 99999),
        "city": rng.choice(words.CITIES),
        "status": rng.choice(STATUSES),
    }


def json_records(seed: str, units: int) -> Draft:
    """Records keyed by their owner (a word pair); the asked field comes right after the owner in every
    record of the sample (which field it is varies by sample), so the answer prefix can repeat the record's
    opening."""
    rng = random.Random(f"{seed}/needle")
    owner, depth, field = (
        words.adjective_noun(rng),
        rng.random(),
        rng.choice(["account", "balance"]),
    )
    needle = account_fields(rng)
    order = [field, *(name for name in needle if name != field)]

    def record(owner: str, fields: dict[str, str]) -> str:
        return json.dumps({"owner": owner, **{name: fields[name] for name in order}})

    def other(rng: random.Random) -> str:
        return record(words.adjective_noun(rng), account_fields(rng))

    lines = generated.with_needle(seed, units, record(owner, needle), depth, [owner, needle[field]], other)
    opening = json.dumps({"owner": owner, field: ""})[:-2]  # {"owner": "x y", "balance": "
    return Draft(
        "[\n" + ",\n".join(f"  {line}" for line in lines) + "\n]",
        "The data is a JSON array of customer account records. Answer with the value only.",
        f"What is the {field} of the record whose owner is {owner}?",
        opening,
        needle[field],
    )


def csv_fields(rng: random.Random) -> dict[str, str]:
    return {
        "sku": f"SKU-{words.digits(rng, 5)}",
        "unit_price": money(rng, 999),
        "warehouse": rng.choice(words.CITIES),
        "quantity": str(rng.randint(0, 500)),
    }


def csv_table(seed: str, units: int) -> Draft:
    """As json_records: rows keyed by their product (a word pair), the asked column right after it."""
    rng = random.Random(f"{seed}/needle")
    product, depth = words.adjective_noun(rng), rng.random()
    column = rng.choice(["sku", "unit_price"])
    needle = csv_fields(rng)
    order = [column, *(name for name in needle if name != column)]

    def row(product: str, fields: dict[str, str]) -> str:
        return ",".join([product, *(fields[name] for name in order)])

    def other(rng: random.Random) -> str:
        return row(words.adjective_noun(rng), csv_fields(rng))

    lines = generated.with_needle(seed, units, row(product, needle), depth, [product, needle[column]], other)
    return Draft(
        "\n".join([",".join(["product", *order]), *lines]),
        "The data is an inventory table in CSV format, one product per row. Answer with the value only.",
        f"What is the {column} of the product {product}?",
        f"{product},",
        needle[column],
    )


def log_line(rng: random.Random, request: str | None = None, ms: int | None = None) -> str:
    """A logfmt line: time, level, request name, duration, then the request."""
    request = request or words.adjective_noun(rng, "-")
    ms = ms if ms is not None else rng.randint(3, 4999)
    path = f"/v1/{words.noun(rng)}s/{rng.randint(1, 9999)}"
    status = rng.choice([200, 200, 200, 201, 204, 304, 404, 500])
    level = "error" if status >= 500 else "info"
    return (
        f"time={agent.timestamp(rng)} level={level} req={request} duration={ms}ms "
        f"method={rng.choice(METHODS)} path={path} status={status}"
    )


def log_lines(seed: str, units: int) -> Draft:
    rng = random.Random(f"{seed}/needle")
    request, ms, depth = words.adjective_noun(rng, "-"), rng.randint(3, 4999), rng.random()
    reserved = [request, f"={ms}ms"]
    lines = generated.with_needle(seed, units, log_line(rng, request, ms), depth, reserved, log_line)
    return Draft(
        "\n".join(lines),
        "The text is an access log of a web service in logfmt, one request per line.",
        f"How long did request {request} take?",
        f"req={request} duration=",
        f"{ms}ms",
    )


# ---- Code: a function's parameters in standard library source ----

SIGNATURE = re.compile(r"^\s*def (\w+)\(([^()]{3,60})\)( -> [^:]+)?:$")


@functools.cache
def signatures() -> tuple[tuple[int, str, str], ...]:
    """(line index, function name, parameters) of one-line `def` statements whose `def name(` is unique."""
    lines = generated.code_lines()
    found = [(i, m[1], m[2]) for i, line in enumerate(lines) if (m := SIGNATURE.match(line))]
    counts: dict[str, int] = {}
    for line in lines:
        for name in re.findall(r"def (\w+)\(", line):
            counts[name] = counts.get(name, 0) + 1
    return tuple((i, name, params) for i, name, params in found if counts[name] == 1)


def code_signature(seed: str, units: int) -> Draft:
    rng = random.Random(f"{seed}/needle")
    index, name, params = rng.choice(signatures())
    pool = generated.code_lines()
    start = generated.in_window(len(pool), units, index, rng.random())
    return Draft(
        "\n".join(pool[(start + k) % len(pool)] for k in range(units)),
        "The text is Python source code from the standard library.",
        f"What are the parameters of the function {name}, exactly as written in its definition?",
        f"def {name}(",
        params,
    )


# ---- Multi-document: the author of the document with a title ----


def document(section: generated.Section, number: int, author: str, rng: random.Random) -> str:
    """A metadata header and the section's first paragraphs, up to ~90 words."""
    excerpt, words = [], 0
    for paragraph in section.paragraphs:
        if excerpt and words + len(paragraph.split()) > 90:
            break
        excerpt.append(paragraph)
        words += len(paragraph.split())
    date = f"20{rng.randint(10, 25)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    header = f"Document {number}\nTitle: {section.title}\nAuthor: {author}\nDate: {date}"
    return header + "\n\n" + "\n\n".join(excerpt)


def multidoc_author(seed: str, units: int) -> Draft:
    rng = random.Random(f"{seed}/needle")
    pool = generated.sections()
    target, author = rng.randrange(len(pool)), words.person(rng)
    start = generated.in_window(len(pool), units, target, rng.random())
    documents = []
    for k in range(units):
        index, unit_rng = (start + k) % len(pool), random.Random(f"{seed}/unit/{k}")
        name = author if index == target else words.free_of([author], lambda rng=unit_rng: words.person(rng))
        documents.append(document(pool[index], k + 1, name, unit_rng))
    title = pool[target].title
    return Draft(
        "\n\n".join(documents),
        "Below are several documents, each with a title, an author and a date.",
        f"Who is the author of the document titled {title}?",
        f"Title: {title}\nAuthor:",
        author,
    )


GENERATORS = {
    "text_prose_quote": Generator(
        "prose: how a sentence of the Python language reference goes on after its first 8 words",
        "prose-quotation",
        prose_quote,
        max_units=lambda: len(generated.paragraphs()),
        max_new_tokens=16,
    ),
    "text_json_records": Generator(
        "records: one field of the JSON record with an id, among similar records",
        "json-records",
        json_records,
        min_units=2,
        max_units=generated.fixed(10**5),
        max_new_tokens=16,
    ),
    "text_csv_table": Generator(
        "records: one column of the CSV row with a SKU, among similar rows",
        "csv-table",
        csv_table,
        min_units=2,
        max_units=generated.fixed(10**5),
        max_new_tokens=16,
    ),
    "text_log_lines": Generator(
        "records: the duration of the request with an id, in web-server log lines",
        "log-lines",
        log_lines,
        min_units=2,
        max_units=generated.fixed(10**5),
        max_new_tokens=12,
    ),
    "text_code_signature": Generator(
        "code: the parameters of a function of the Python standard library's source, by name",
        "code-signature",
        code_signature,
        max_units=lambda: len(generated.code_lines()),
        max_new_tokens=24,
    ),
    "text_multidoc_author": Generator(
        "multi-document: the author of the document with a title, from the documents' headers",
        "multi-document-metadata",
        multidoc_author,
        max_units=lambda: len(generated.sections()),
        max_new_tokens=12,
    ),
}
TASKS, KINDS, METRICS, min_length, make_samples = generated.family_api(GENERATORS, LAYOUTS)
FAMILY = Family("text", KINDS)
