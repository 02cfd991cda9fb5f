"""A sixth held-out family (`tasks/heldout-sixth.yaml`): task kinds and layouts in no training mixture and
in none of the five earlier held-out suites, written to judge the mixed-target agents chosen on RULER and
the fifth suite (docs/learned-presses.md). It chooses nothing.

- sixth_zone_mail: a DNS zone file (SOA, NS, then A, AAAA, CNAME and TXT records grouped by service); the
  host of the one MX record.
- sixth_traceback_key: a Python traceback of chained exceptions (frames, then the exception line); the
  missing environment variable of the one KeyError.
- sixth_screenplay_call: a screenplay of scenes (scene heading, action, character cues and dialogue); the
  number dialled in the one phone call.
- sixth_shell_ssh: a terminal session (prompt, command, output); the host the one ssh command ran on.

As in the other held-out families, each answer sits in a line of a shape the material holds once, the
answer prefix repeats the words that lead to it, and the score is RULER's `string_match_all` on the one
reference. Layouts, used by no training or earlier held-out task: the material as the result of a tool
call that opened the user's attachment (`tool-result`), or a prompt in Markdown sections, the material
under "Input" and the question under "Question" (`headed-sections`).
"""

import random

from kvbench.tasks import generated, prompt, words
from kvbench.tasks.family import Family
from kvbench.tasks.generated import Draft, Generator, Layout, Placed


def tool_result(draft: Draft) -> Placed:
    messages = [
        {"role": "system", "content": "You can open the files that the user attaches with open_attachment."},
        {"role": "user", "content": f"{draft.instruction} I have attached it."},
        {"role": "assistant", "content": '{"name": "open_attachment", "arguments": {"attachment": 1}}'},
        {"role": "tool", "content": draft.body},
    ]
    return Placed(prompt.transcript(messages), draft.question, messages)


def headed_sections(draft: Draft) -> Placed:
    return Placed(
        f"## Task\n\n{draft.instruction} Read the input, then answer the question.\n\n"
        f"## Input\n\n{draft.body}\n\n## Question\n\n",
        draft.question,
    )


LAYOUTS = (Layout("tool-result", tool_result), Layout("headed-sections", headed_sections))


# ---- DNS zone file: the host of the one MX record ----


def address(rng: random.Random) -> str:
    """A documentation address. With 10.x.x.x addresses the model read "IN MX 10" as the start of one."""
    return f"{rng.choice(['192.0.2', '198.51.100', '203.0.113'])}.{rng.randint(1, 254)}"


def zone_group(rng: random.Random) -> str:
    """The records of one service, under a comment; the MX record is the needle's alone."""
    name, other = words.noun(rng), words.noun(rng)
    ttl = rng.choice([300, 600, 3600, 86400])
    records = [
        f"{name} {ttl} IN A {address(rng)}",
        f"{name} {ttl} IN AAAA fd00:{rng.randint(1, 9999)}::{rng.randint(1, 999)}",
        f"{other} {ttl} IN CNAME {name}",
        f"www.{name} {ttl} IN CNAME {name}",
        f'{name} {ttl} IN TXT "{words.adjective(rng)}-{other}={words.digits(rng, 6)}"',
    ]
    return f"; {words.adjective(rng)} {name} service\n" + "\n".join(rng.sample(records, rng.randint(2, 4)))


def zone_mail(seed: str, units: int) -> Draft:
    """The mail host is a full name in another domain: named relative to the origin, like every other record,
    it scored 88 uncompressed (the model wrote an address after "IN MX 10"), 92 as a full name."""
    rng = random.Random(f"{seed}/needle")
    host, depth = words.two_nouns(rng, "-"), rng.random()
    groups = generated.with_needle(
        seed, units, f"; mail\n@ 3600 IN MX 10 {host}.example.net.", depth, [host, "MX"], zone_group
    )
    serial = f"2026{rng.randint(1, 12):02d}{rng.randint(1, 28):02d}01"
    return Draft(
        "$ORIGIN example.org.\n$TTL 3600\n"
        f"@ 3600 IN SOA ns1.example.org. hostmaster.example.org. ({serial} 7200 3600 1209600 3600)\n"
        "@ 3600 IN NS ns1.example.org.\n@ 3600 IN NS ns2.example.org.\n\n" + "\n\n".join(groups),
        "The text is a DNS zone file.",
        "Which host receives the mail for the zone, according to its MX record?",
        "IN MX 10",
        host,
    )


# ---- Python traceback: the environment variable of the one KeyError ----

CODE_LINES = (
    "{a} = self._{b}({a})",
    "return {a}.{b}(timeout={n})",
    "for {a} in self.{b}_items:",
    "with open({a}_path) as handle:",
    "result = load_{a}(config, {b}={n})",
    "self.{a}.update({b})",
    "yield from self._{a}_{b}()",
)
# No message opens with a quote, as the KeyError's does: after "KeyError: '" the model went on with
# "NoneType' object has no attribute" from an AttributeError (60 uncompressed).
ERRORS = (
    "ValueError: invalid {a} value: {n}",
    "RuntimeError: the {a} worker stopped",
    "TimeoutError: {a} did not answer within {n} s",
    "ConnectionError: cannot reach {a}-{b}:{n}",
    "FileNotFoundError: [Errno 2] No such file or directory: /srv/{a}/{b}.json",
    "IndexError: list index out of range",
    "TypeError: {a}() takes 2 positional arguments but {n} were given",
)


def fill(template: str, rng: random.Random) -> str:
    return template.format(a=words.noun(rng), b=words.noun(rng), n=rng.randint(2, 9999))


def frame(rng: random.Random, code: str | None = None) -> str:
    module, function = words.noun(rng), words.adjective_noun(rng, "_")
    code = code or fill(rng.choice(CODE_LINES), rng)
    return f'  File "/srv/app/{module}.py", line {rng.randint(12, 900)}, in {function}\n    {code}'


def exception(rng: random.Random, key: str | None = None) -> str:
    """One exception of the chain: its frames, then its line."""
    frames = [frame(rng) for _ in range(rng.randint(2, 5))]
    if key:  # as os.environ raises it
        frames += [frame(rng, "value = os.environ[name]"), '  File "<frozen os>", line 716, in __getitem__']
        line = f"KeyError: '{key}'"
    else:
        line = fill(rng.choice(ERRORS), rng)
    return "Traceback (most recent call last):\n" + "\n".join(frames) + "\n" + line


CHAINS = (
    "The above exception was the direct cause of the following exception:",
    "During handling of the above exception, another exception occurred:",
)


def traceback_key(seed: str, units: int) -> Draft:
    rng = random.Random(f"{seed}/needle")
    # An environment variable's name: with a lowercase key like the code's names around it (84 uncompressed)
    # the model answered with names of its own.
    key, depth = words.two_nouns(rng).upper(), rng.random()
    parts = generated.with_needle(seed, units, exception(rng, key), depth, [key, "KeyError"], exception)
    body = parts[0]
    for k, part in enumerate(parts[1:], 1):
        body += f"\n\n{CHAINS[random.Random(f'{seed}/chain/{k}').randrange(2)]}\n\n{part}"
    return Draft(
        body,
        "The text is a Python traceback of chained exceptions.",
        "Which environment variable was missing, according to the KeyError?",
        "KeyError: '",
        key,
    )


# ---- Screenplay: the number dialled in the one phone call ----

ACTIONS = (
    "{name} sets the {noun} down on the table.",
    "{name} looks at the {noun} for a long moment.",
    "{name} paces by the window, a {noun} under one arm.",
    "The {noun} on the wall has stopped.",
    "{name} laughs, then stops.",
)
LINES = (
    "Did you bring the {noun}?",
    "The {noun} is still where you left it.",
    "I told you, the {adjective} one.",
    "We leave at dawn, with or without the {noun}.",
    "Nobody asked about the {noun}.",
    "You should have called me.",
    "Then why are we still here?",
)


def place_name(rng: random.Random) -> str:
    return words.adjective_noun(rng).upper()


def scene(rng: random.Random, number: str | None = None) -> str:
    cast = rng.sample(words.FIRST_NAMES, 2)
    blocks = [f"{rng.choice(['INT.', 'EXT.'])} {place_name(rng)} - {rng.choice(['DAY', 'NIGHT'])}"]
    action = f"{{name}} picks up the phone and dials {number}." if number else rng.choice(ACTIONS)
    blocks.append(action.format(name=rng.choice(cast), noun=words.noun(rng)))
    for k in range(rng.randint(2, 4)):
        line = rng.choice(LINES).format(noun=words.noun(rng), adjective=words.adjective(rng))
        blocks.append(f"{cast[k % 2].upper()}\n{line}")
    return "\n\n".join(blocks)


def screenplay_call(seed: str, units: int) -> Draft:
    """Calibration (25 samples, uncompressed): asked for the location of the one EXT. scene among INT. ones,
    the model answered with another scene's location (68); asked for a caption (SUPER: "Bonn, 1971", or a
    name and office), it wrote captions of its own after 'SUPER: "' ("The 2015 Olympics", 80 then 60)."""
    rng = random.Random(f"{seed}/needle")
    number, depth = f"{words.digits(rng, 3)}-{words.digits(rng, 4)}", rng.random()
    scenes = generated.with_needle(seed, units, scene(rng, number), depth, [number, "dials"], scene)
    return Draft(
        "FADE IN:\n\n" + "\n\n".join(scenes) + "\n\nFADE OUT.",
        "The text is a screenplay.",
        "Which number does the one phone call of the screenplay dial?",
        "picks up the phone and dials",
        number,
    )


# ---- Terminal session: the host the one ssh command ran on ----


def listed(rng: random.Random, name: str) -> str:
    size, day, minute = rng.randint(100, 99999), rng.randint(1, 28), rng.randint(10, 59)
    return f"-rw-r--r-- 1 dev dev {size:>5} Mar {day:>2} 09:{minute} {name}"


def shell_command(rng: random.Random) -> tuple[str, list[str]]:
    noun, other = words.noun(rng), words.noun(rng)
    n = rng.randint(2, 90)
    choices = [
        ("ls -l", [listed(rng, f"{word}.txt") for word in (noun, other)]),
        (f"git checkout -b {noun}-{other}", [f"Switched to a new branch '{noun}-{other}'"]),
        ("python -m pytest -q", [f"{n} passed in {rng.randint(1, 99) / 10} s"]),
        (f"du -sh {noun}", [f"{n}M\t{noun}"]),
        (f"grep -c {noun} {other}.log", [str(n)]),
        (f"echo ${noun.upper()}_HOME", [f"/opt/{noun}"]),
        (f"make {noun}", [f"make: *** No rule to make target '{noun}'.  Stop."]),
        (f"wc -l {noun}.csv", [f"{rng.randint(10, 9999)} {noun}.csv"]),
    ]
    return rng.choice(choices)


def shell_step(rng: random.Random, prompt: str, host: str | None = None) -> str:
    if not host:
        command, output = shell_command(rng)
        return "\n".join([prompt + command, *output])
    clock = f"{rng.randint(10, 23)}:{rng.randint(10, 59)}:07"
    load = ", ".join(f"{rng.randint(0, 300) / 100:.2f}" for _ in range(3))
    return f"{prompt}ssh deploy@{host} uptime\n {clock} up {rng.randint(2, 90)} days, load average: {load}"


def shell_ssh(seed: str, units: int) -> Draft:
    rng = random.Random(f"{seed}/needle")
    host, depth = words.two_nouns(rng, "-"), rng.random()
    folder = words.free_of(["ssh"], lambda: words.noun(rng))  # every step shows it
    prompt = f"{rng.choice(words.FIRST_NAMES).lower()}@laptop:~/{folder}$ "
    steps = generated.with_needle(
        seed, units, shell_step(rng, prompt, host), depth, [host, "ssh"], lambda r: shell_step(r, prompt)
    )
    return Draft(
        "\n".join(steps),
        "The text is a terminal session: each command after its prompt, then its output.",
        "On which host did the user run a command over ssh?",
        "ssh deploy@",
        host,
    )


GENERATORS = {
    "sixth_zone_mail": Generator(
        "DNS zone file: the host of the one MX record", "dns-zone", zone_mail, max_new_tokens=12
    ),
    "sixth_traceback_key": Generator(
        "Python traceback of chained exceptions: the environment variable of the one KeyError",
        "python-traceback",
        traceback_key,
        max_new_tokens=12,
    ),
    "sixth_screenplay_call": Generator(
        "screenplay: the number dialled in the one phone call",
        "screenplay",
        screenplay_call,
        max_new_tokens=12,
    ),
    "sixth_shell_ssh": Generator(
        "terminal session: the host the one ssh command ran on", "shell-session", shell_ssh, max_new_tokens=12
    ),
}
TASKS, KINDS, METRICS, min_length, make_samples = generated.family_api(GENERATORS, LAYOUTS)
FAMILY = Family("heldout-sixth", KINDS)  # the suite tasks/heldout-sixth.yaml
