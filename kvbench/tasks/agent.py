"""Agent traces generated offline: multi-turn tool-use transcripts as chat turns, with one fact to recall.

A sample is a conversation (`Sample.messages`): a system prompt stating the session's facts (account id,
deployment region, deadline, project code name) and rules, a user request, then rounds of agent work until
the requested length is filled. A round is an optional scratchpad turn (the assistant thinking, region
"scratchpad"), an assistant tool call (JSON) and the tool's output: table rows, log lines, a file listing,
search hits or a config file, made from word lists (wonderwords) and the stdlib's prose
(`pydoc_data.topics`). The question, asked in a last user turn, targets one value that appears exactly once
in the whole conversation, in one chosen turn, under a key that appears nowhere else, so it can only be
answered from the context:

- agent_system_fact: one of the system prompt's facts, the farthest turn from the question;
- agent_tool_value: an error code in a log output or a setting in a config file, in a tool output after
  the first (any depth);
- agent_early_tool_value: the same in the first tool output, the farthest tool output from the question;
- agent_scratchpad: a number the assistant noted in one of its scratchpad turns, among other such notes.

The answer prefix repeats the words that introduce the value in the context ("Job X failed with error
code", "The deadline is"), as RULER's prefixes repeat its needles: with facts listed as "- Deadline: 4 July"
and the prefix "The deadline is", the embedded 135M model found 1 of 8 system facts.

As in RULER (kvbench.tasks.ruler), the trace is the longest that fits: the input as the engine builds it
(turns rendered with the chat template, question turn, answer prefix) + max_new_tokens <= length, found by
search on the number of tool-output rows (a round cut short keeps its first rows). Each round draws from its
own `random.Random` seeded by (task, seed, index, round), the facts and the needle from one seeded by (task,
seed, index), so a longer trace only adds rounds. Scores are RULER's `string_match_all` on the single
reference.
"""

import functools
import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kvbench.core.errors import BadInput, UnknownTask
from kvbench.tasks import ruler
from kvbench.tasks.base import Sample
from kvbench.tasks.family import Family
from kvbench.tasks.prompt import tokenize_sample, transcript
from kvbench.tasks.words import adjective, adjective_noun, free_of, noun, two_nouns

TASKS = {
    "agent_system_fact": "agent trace: a fact of the system prompt (account id, region, deadline, code name)",
    "agent_tool_value": "agent trace: a value from one tool output after the first, among similar rows",
    "agent_early_tool_value": "agent trace: a value from the first tool output, far from the question",
    "agent_scratchpad": "agent trace: a number the assistant noted in one of its scratchpad turns",
}
METRICS = {"string_match_all": ruler.string_match_all}
MAX_NEW_TOKENS = 32
# Three rounds at least (a first tool output, a later one, room for notes): ~600 tokens with SmolLM2's
# template; the margin is for less efficient tokenizers.
MIN_ROUNDS = 3
ROWS = (2, 7)  # how many rows a tool output has (the needle's row comes on top)
MIN_LENGTH = 1024

SERVICES = ["billing", "auth", "checkout", "search", "inventory", "notifications", "reporting", "scheduler"]
CLOUD_REGIONS = [  # where the session's service is deployed (a fact of the system prompt)
    "us-east-1", "us-east-2", "us-west-1", "us-west-2", "eu-west-1", "eu-west-2", "eu-west-3", "eu-north-1",
    "eu-central-1", "eu-south-1", "ap-south-1", "ap-northeast-1", "ap-northeast-2", "ap-southeast-1",
    "ap-southeast-2", "ca-central-1", "sa-east-1", "me-south-1", "af-south-1",
]  # fmt: skip
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October"]
PROBLEMS = [
    "returning errors for some customers",
    "much slower than usual",
    "dropping requests every few minutes",
    "failing its health checks",
    "timing out on large requests",
]
RULES = [
    "Never delete data without the user's confirmation.",
    "Use the tools before you draw conclusions.",
    "Quote the tool output you rely on.",
    "Keep answers short.",
    "Do not restart production services on your own.",
    "Report every error code you find.",
]
EXTENSIONS = ["yaml", "json", "log", "py", "csv", "tar.gz"]
LOG_MESSAGES = [
    "cache miss for key {noun}:{number}",
    "retrying {noun} sync after timeout ({ms} ms)",
    "request served in {ms} ms",
    "worker {adjective}-{noun} picked up {small} tasks",
    "connection pool at {small} of 64",
    "slow query on table {noun}s ({ms} ms)",
    "scheduled job {noun}-cleanup finished",
    "token refresh for client {noun}-{small} succeeded",
]


@dataclass(frozen=True)
class Fact:
    question: str
    answer_prefix: str  # also how the system prompt states the fact, so the answer can be read off


FACTS = {
    "account": Fact("What is the user's account id?", "The user's account id is"),
    "region": Fact("What is the deployment region?", "The deployment region is"),
    "deadline": Fact("What is the deadline?", "The deadline is"),
    "code_name": Fact("What is the project code name?", "The project code name is"),
}


@dataclass(frozen=True)
class Needle:
    """The value asked about, the line that holds it, and how it is asked."""

    kind: str  # a tool in TOOLS, or "scratchpad"/"system"
    key: str
    value: str
    line: str
    question: str
    answer_prefix: str


@dataclass
class Trace:
    """One agent trace before it becomes a Sample: the turns, the value asked, the turn that holds it."""

    messages: list[dict]
    needle: Needle
    turn: int  # index in messages of the turn that holds the answer


# ---- Word material ----


@functools.cache
def snippet_sentences() -> list[str]:
    """Sentences of the stdlib's reference prose (ruler's essay), 40-120 characters, for search snippets."""
    sentences = ruler.essay_sentences(len(ruler.essay_words()))
    return [s for s in sentences if 40 <= len(s) <= 120 and re.fullmatch(r"[A-Z][^*`=|>]*[.]", s)]


def timestamp(rng: random.Random) -> str:
    month, day, hour, minute, second = (rng.randint(1, n) for n in (12, 28, 24, 60, 60))
    return f"2026-{month:02d}-{day:02d}T{hour - 1:02d}:{minute - 1:02d}:{second - 1:02d}Z"


# ---- Tools: a call and rows of output; two of them can hold the needle ----


@dataclass(frozen=True)
class Tool:
    """One tool: its call and header from a round's rng, and one output row."""

    call: Callable[[random.Random], dict]
    header: Callable[[random.Random], str] | None  # a first line (column names, a total), if the tool has one
    row: Callable[[random.Random], str]


def order_row(rng: random.Random) -> str:
    key, total = f"A-{rng.randint(10000, 99999)}", f"{rng.randint(10, 9999)}.{rng.randint(0, 99):02d}"
    return f"{key} | {adjective(rng)} {noun(rng)} | {rng.randint(1, 9)} | {total}"


def log_row(rng: random.Random) -> str:
    message = rng.choice(LOG_MESSAGES).format(
        noun=noun(rng),
        adjective=adjective(rng),
        number=rng.randint(100, 99999),
        ms=rng.randint(20, 9000),
        small=rng.randint(2, 60),
    )
    return f"{timestamp(rng)} {rng.choice(['INFO', 'INFO', 'WARN', 'DEBUG'])} {message}"


def file_row(rng: random.Random) -> str:
    name, size = f"{noun(rng)}_{noun(rng)}.{rng.choice(EXTENSIONS)}", str(rng.randint(1000, 999999))
    return f"-rw-r--r--  deploy  {size:>7}  {timestamp(rng)[:10]}  {name}"


def search_row(rng: random.Random) -> str:
    title, article = (
        f"{adjective(rng).capitalize()} {noun(rng)} {noun(rng)}",
        f"KB-{rng.randint(10000, 99999)}",
    )
    return f"{article}: {title} - {rng.choice(snippet_sentences())}"


def config_row(rng: random.Random, key: str | None = None, value: str | None = None) -> str:
    key = key or two_nouns(rng)
    if value is None:
        value = rng.choice([str(rng.randint(2, 50000)), rng.choice(["true", "false"]), f'"{adjective(rng)}"'])
    return f"{key}: {value}"


TOOLS = {
    "query_db": Tool(
        lambda rng: {
            "sql": f"SELECT order_id, item, quantity, total FROM orders WHERE status = "
            f"'{rng.choice(['pending', 'failed', 'refunded', 'held'])}' LIMIT 20"
        },
        lambda rng: "order_id | item | quantity | total",
        order_row,
    ),
    "read_logs": Tool(
        lambda rng: {"service": rng.choice(SERVICES), "since": timestamp(rng), "limit": 50}, None, log_row
    ),
    "list_files": Tool(
        lambda rng: {"path": f"/srv/{rng.choice(SERVICES)}/{noun(rng)}"},
        lambda rng: f"total {rng.randint(8, 400)}",
        file_row,
    ),
    "search_docs": Tool(
        lambda rng: {"query": f"{rng.choice(SERVICES)} {noun(rng)} {rng.choice(PROBLEMS).split()[0]}"},
        None,
        search_row,
    ),
    "read_file": Tool(
        lambda rng: {"path": f"deploy/{rng.choice(SERVICES)}/{noun(rng)}.yaml"},
        lambda rng: f"# {noun(rng)} settings",
        config_row,
    ),
}


def log_needle(rng: random.Random) -> Needle:
    """An error line: no other log line reports an error code, so the line is unique in its shape."""
    job, code = adjective_noun(rng, "-"), f"E{rng.randint(1000, 9999)}"
    return Needle(
        "read_logs",
        job,
        code,
        f"{timestamp(rng)} ERROR job {job} failed with error code {code}",
        f"In the logs, which error code did job {job} fail with?",
        f"Job {job} failed with error code",
    )


def config_needle(rng: random.Random) -> Needle:
    """A setting among other settings: its key is unique, its value a 6-digit number."""
    key, value = two_nouns(rng), str(rng.randint(100000, 999999))
    return Needle(
        "read_file",
        key,
        value,
        config_row(rng, key, value),
        f"In the config file, what is the value of {key}?",
        f"The value of {key} is",
    )


# The tool outputs a needle can sit in, chosen so that the embedded model can read its value off by the key
# (tables, listings and search hits, where the value is not next to its key, stay filler).
TOOL_NEEDLES = {"read_logs": log_needle, "read_file": config_needle}


# ---- Scratchpad notes ----

THOUGHTS = [
    "The last output does not explain the {problem} yet.",
    "Nothing about {noun} so far; I should look elsewhere.",
    "The {noun} entries look unrelated to the request.",
    "I need more evidence before I suggest a fix.",
    "The numbers look normal apart from the {noun} ones.",
]
PLANS = [
    "Next I will call {tool} to check the {service} service.",
    "I will use {tool} to compare with yesterday.",
    "Let me try {tool} next.",
]


def note_line(label: str, value: str) -> str:
    return f"Note: the {label} number is {value}."


def scratchpad_needle(rng: random.Random) -> Needle:
    label, value = adjective_noun(rng, "-"), str(rng.randint(1000000, 9999999))
    return Needle(
        "scratchpad",
        label,
        value,
        note_line(label, value),
        f"In your notes, what is the {label} number?",
        f"The {label} number is",
    )


def thought(rng: random.Random, next_tool: str, problem: str) -> list[Callable[[], str]]:
    """Draws of the lines of a scratchpad turn: an observation, sometimes a note, a plan."""
    lines = [lambda: rng.choice(THOUGHTS).format(problem=problem, noun=noun(rng))]
    if rng.random() < 0.5:
        lines.append(lambda: note_line(adjective_noun(rng, "-"), str(rng.randint(1000000, 9999999))))
    lines.append(lambda: rng.choice(PLANS).format(tool=next_tool, service=rng.choice(SERVICES)))
    return lines


# ---- One trace ----


@dataclass(frozen=True)
class Setting:
    """What every round of a sample shares: the facts, the request, and which value is asked where."""

    facts: dict[str, str]
    service: str
    problem: str
    needle: Needle
    depth: float  # where the needle's round sits among the rounds, 0 = first


def fact_values(rng: random.Random) -> dict[str, str]:
    return {
        "account": f"ACC-{rng.randint(1000000, 9999999)}",
        "region": rng.choice(CLOUD_REGIONS),
        "deadline": f"{rng.randint(1, 28)} {rng.choice(MONTHS)}",
        "code_name": adjective_noun(rng, "-"),
    }


def setting(task: str, rng: random.Random) -> Setting:
    facts = fact_values(rng)
    service, problem = rng.choice(SERVICES), rng.choice(PROBLEMS)
    if task == "agent_system_fact":
        name = rng.choice(list(FACTS))
        fact = FACTS[name]
        line = f"{fact.answer_prefix} {facts[name]}."
        needle = Needle("system", name, facts[name], line, fact.question, fact.answer_prefix)
    else:
        make = (
            scratchpad_needle if task == "agent_scratchpad" else TOOL_NEEDLES[rng.choice(list(TOOL_NEEDLES))]
        )
        needle = make(rng)
        while any(
            part.lower() in fact.lower() for part in (needle.key, needle.value) for fact in facts.values()
        ):
            needle = make(rng)
    return Setting(facts, service, problem, needle, rng.random())


def needle_round(task: str, depth: float, rounds: int) -> int | None:
    """The round whose tool output (or scratchpad) holds the needle, None for a system fact."""
    if task == "agent_system_fact":
        return None
    if task == "agent_early_tool_value":
        return 0
    if task == "agent_tool_value":  # any round but the first
        return 1 + min(int(depth * (rounds - 1)), rounds - 2)
    return min(int(depth * rounds), rounds - 1)


def system_prompt(the: Setting, rng: random.Random) -> str:
    names = list(FACTS)
    rng.shuffle(names)
    facts = " ".join(f"{FACTS[name].answer_prefix} {the.facts[name]}." for name in names)
    rules = rng.sample(RULES, 3)
    return "\n".join(
        [
            "You are an operations agent with access to tools.",
            facts,
            "Rules:",
            *(f"- {rule}" for rule in rules),
        ]
    )


def round_turns(the: Setting, k: int, rows: int, needle_here: bool, reserved: list[str], sample_seed: str):
    """Round k: [scratchpad], tool call, tool output with `rows` rows (plus the needle's when `needle_here`).

    Drawn from the round's own rng, so a round cut short holds the first rows of the full one.
    """
    rng = random.Random(f"{sample_seed}/round/{k}")
    needle = the.needle
    name = rng.choice(list(TOOLS))
    if needle_here and needle.kind in TOOLS:
        name = needle.kind
    tool = TOOLS[name]
    turns = []
    if needle_here and needle.kind == "scratchpad" or rng.random() < 0.5:
        lines = [free_of(reserved, draw) for draw in thought(rng, name, the.problem)]
        if needle_here and needle.kind == "scratchpad":
            lines.insert(rng.randint(0, len(lines)), needle.line)
        turns.append({"role": "assistant", "content": "\n".join(lines), "region": "scratchpad"})
    call = free_of(reserved, lambda: json.dumps({"tool": name, "arguments": tool.call(rng)}))
    header = [free_of(reserved, lambda: tool.header(rng))] if tool.header else []
    lines = [free_of(reserved, lambda: tool.row(rng)) for _ in range(rows)]
    if needle_here and needle.kind == name:
        lines.insert(random.Random(f"{sample_seed}/needle row").randint(0, rows), needle.line)
    turns += [
        {"role": "assistant", "content": call},
        {"role": "tool", "content": "\n".join(header + lines)},
    ]
    return turns


def round_rows(sample_seed: str, rows: int) -> list[int]:
    """How many tool-output rows each round gets when the trace has `rows` rows in all (the last one may be
    cut short): the unit the length search counts, finer than whole rounds."""
    sizes = []
    while rows > 0:
        size = min(random.Random(f"{sample_seed}/rows/{len(sizes)}").randint(*ROWS), rows)
        sizes.append(size)
        rows -= size
    return sizes


def min_rows(sample_seed: str) -> int:
    """The fewest rows that make MIN_ROUNDS rounds."""
    return sum(random.Random(f"{sample_seed}/rows/{k}").randint(*ROWS) for k in range(MIN_ROUNDS - 1)) + 1


def trace(task: str, sample_seed: str, rows: int) -> Trace:
    """The sample's conversation with `rows` tool-output rows in all."""
    the = setting(task, random.Random(f"{sample_seed}/setting"))
    reserved = list(the.facts.values())
    if task != "agent_system_fact":
        reserved += [the.needle.key, the.needle.value]
    messages = [
        {"role": "system", "content": system_prompt(the, random.Random(f"{sample_seed}/system"))},
        {
            "role": "user",
            "content": f"The {the.service} service is {the.problem} since this morning. "
            "Investigate with the tools and tell me what to fix.",
        },
    ]
    sizes = round_rows(sample_seed, rows)
    target = needle_round(task, the.depth, len(sizes))
    turn = 0
    for k, size in enumerate(sizes):
        turns = round_turns(the, k, size, k == target, reserved, sample_seed)
        if k == target:
            turn = len(messages) + next(i for i, t in enumerate(turns) if the.needle.line in t["content"])
        messages += turns
    return Trace(messages, the.needle, turn)


# ---- Samples ----


def min_length(task: str) -> int:
    return MIN_LENGTH


def count_tokens(tokenizer, draft: Trace) -> int:
    """Tokens of the whole input as the engine builds it: the turns rendered with the chat template, the
    question in a last user turn, the answer prefix."""
    prompt = tokenize_sample(tokenizer, as_sample("", draft, 0))
    return prompt.context_ids.shape[1] + prompt.question_ids.shape[1]


def as_sample(task: str, draft: Trace, length: int, sample_id: str = "") -> Sample:
    return Sample(
        task=task,
        id=sample_id,
        context=transcript(draft.messages),
        question=draft.needle.question,
        answer_prefix=draft.needle.answer_prefix,
        references=[draft.needle.value],
        max_new_tokens=MAX_NEW_TOKENS,
        metric="string_match_all",
        meta={"length": length, "answer_turn": draft.turn},
        messages=draft.messages,
    )


def make_samples(
    task: str, length: int, samples: int, seed: int, tokenizer, data_dir: Path | None
) -> list[Sample]:
    """`samples` agent traces of `task` whose input, question and answer fit `length` tokens."""
    if task not in TASKS:
        raise UnknownTask(f"unknown agent task {task!r}: choose one of {', '.join(TASKS)}")
    if length < min_length(task):
        raise BadInput(f"{task} needs a length of at least {min_length(task)} tokens, got {length}")
    result, rows = [], None
    for i in range(samples):
        sample_seed = f"{task}/{seed}/{i}"
        draft_at = functools.cache(functools.partial(trace, task, sample_seed))
        tokens_at = functools.cache(lambda n, draft_at=draft_at: count_tokens(tokenizer, draft_at(n)))
        low, budget = min_rows(sample_seed), length - MAX_NEW_TOKENS
        if tokens_at(low) > budget:
            raise BadInput(f"{task} does not fit in {length} tokens with this tokenizer: use a larger length")
        # Samples differ little, so the previous sample's size is a good first guess.
        rows = ruler.largest_fitting(tokens_at, budget, low, 10**6, rows)
        result.append(as_sample(task, draft_at(rows), length, f"{seed}-{i}"))
    return result


FAMILY = Family(
    "agent",
    kinds={  # by where the answer sits
        "agent_system_fact": "agent-system-prompt",
        "agent_tool_value": "agent-tool-output",
        "agent_early_tool_value": "agent-tool-output",
        "agent_scratchpad": "agent-scratchpad",
    },
)
