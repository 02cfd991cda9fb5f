"""A third held-out family (`tasks/heldout-third.yaml`): task kinds and layouts in no training mixture and in
neither earlier held-out suite, written to judge a change chosen on those two (docs/learned-presses.md: KVP's
recent window, picked on the first and the confirmation suite, is judged here). Like the confirmation suite it
chooses nothing.

- third_calendar_location: an iCalendar file of events (SUMMARY, DTSTART, DTEND, UID); the place of the one
  event that has a LOCATION, named by its summary.
- third_schema_default: a SQL schema dump (CREATE TABLE statements); the default value of the one column
  that has a DEFAULT, named by its table and column.
- third_forum_network: a forum thread of numbered posts with quoted replies; the new Wi-Fi network name
  one post gives, named by its poster.
- third_tasks_due: a Markdown task board (sections of `- [ ]` / `- [x]` items with owners); the due date of
  the one item that has one, named by its title.

As in the other held-out families, each answer sits in a line of a shape the material holds once, the
answer prefix repeats the words that lead to it, and the score is RULER's `string_match_all` on the one
reference. Layouts, used by no training or earlier held-out task: the material as a file in a Markdown code
fence after the instruction (`fenced-file`), or the material split in two user turns around an assistant
acknowledgement (`two-part`).
"""

import itertools
import random

from kvbench.tasks import generated, prompt, words
from kvbench.tasks.family import Family
from kvbench.tasks.generated import Draft, Generator, Layout, Placed


def fenced_file(draft: Draft) -> Placed:
    return Placed(f"{draft.instruction} The file follows.\n\n```\n{draft.body}\n```\n\n", draft.question)


def two_part(draft: Draft) -> Placed:
    """Split at the blank line nearest the middle: every body separates its units by blank lines, so no
    unit (and no answer prefix) is cut in two."""
    units = draft.body.split("\n\n")
    ends = list(itertools.accumulate(len(unit) + 2 for unit in units))  # where each unit's text ends
    half = 1 + min(range(len(units) - 1), key=lambda k: abs(ends[k] - len(draft.body) / 2), default=0)
    messages = [
        {"role": "user", "content": f"{draft.instruction} Part 1 of 2:\n\n" + "\n\n".join(units[:half])},
        {"role": "assistant", "content": "Got it. Please send part 2."},
        {"role": "user", "content": "Part 2 of 2:\n\n" + "\n\n".join(units[half:])},
    ]
    return Placed(prompt.transcript(messages), draft.question, messages)


LAYOUTS = (Layout("fenced-file", fenced_file), Layout("two-part", two_part))


# ---- iCalendar: where the one located event takes place ----


def event_summary(rng: random.Random) -> str:
    return f"{words.adjective(rng).capitalize()} {words.noun(rng)} sync"


def calendar_event(rng: random.Random, summary: str | None = None, location: str | None = None) -> str:
    day, hour = rng.randint(1, 28), rng.randint(8, 17)
    lines = [
        "BEGIN:VEVENT",
        f"UID:{words.digits(rng, 8)}@calendar.example.org",
        f"SUMMARY:{summary or event_summary(rng)}",
        f"DTSTART:202605{day:02d}T{hour:02d}0000Z",
        f"DTEND:202605{day:02d}T{hour + 1:02d}0000Z",
        "END:VEVENT",
    ]
    if location:  # right after the summary, so the answer prefix can name the event
        lines.insert(3, f"LOCATION:{location}")
    return "\n".join(lines)


def calendar_location(seed: str, units: int) -> Draft:
    rng = random.Random(f"{seed}/needle")
    summary, depth = event_summary(rng), rng.random()
    location = f"{words.noun(rng).capitalize()} Hall {words.digits(rng, 3)}"
    events = generated.with_needle(
        seed, units, calendar_event(rng, summary, location), depth, [summary, location], calendar_event
    )
    return Draft(
        "BEGIN:VCALENDAR\nVERSION:2.0\n\n" + "\n\n".join(events) + "\n\nEND:VCALENDAR",
        "The text is a calendar in iCalendar format.",
        f'Where does the event "{summary}" take place?',
        f"SUMMARY:{summary}\nLOCATION:",
        location,
    )


# ---- SQL schema: the default value of the one column that has one ----

TYPES = ("INTEGER", "TEXT", "VARCHAR(64)", "BOOLEAN", "TIMESTAMP", "REAL")


def create_table(rng: random.Random, table: str | None = None, default: tuple[str, str] | None = None) -> str:
    columns = ["  id INTEGER PRIMARY KEY"]
    columns += [
        f"  {words.two_nouns(rng)} {rng.choice(TYPES)}{rng.choice(['', ' NOT NULL'])}"
        for _ in range(rng.randint(2, 5))
    ]
    if default:
        column, value = default
        columns.insert(rng.randint(1, len(columns)), f"  {column} VARCHAR(64) DEFAULT '{value}'")
    return f"CREATE TABLE {table or words.two_nouns(rng)} (\n" + ",\n".join(columns) + "\n);"


def schema_default(seed: str, units: int) -> Draft:
    rng = random.Random(f"{seed}/needle")
    table, column, depth = words.two_nouns(rng), words.two_nouns(rng), rng.random()
    value = f"{words.adjective(rng)}-{words.digits(rng, 4)}"
    tables = generated.with_needle(
        seed, units, create_table(rng, table, (column, value)), depth, [table, column, value], create_table
    )
    return Draft(
        "-- schema dump\n\n" + "\n\n".join(tables),
        "The text is the schema of a SQL database.",
        f"In the table {table}, what is the default value of the column {column}?",
        f"{column} VARCHAR(64) DEFAULT '",
        value,
    )


# ---- Forum thread: the Wi-Fi network name one post gives ----

POSTS = (
    "Has anyone tried the new {noun}? Mine arrived {adj}.",
    "Same here, the {noun} stopped working after a week.",
    "You could try resetting the {noun} first.",
    "Thanks, that fixed it. The {noun} is fine now.",
    "Is the {noun} meetup still on for Friday?",
    "I would not buy the {adj} one, the {noun} is too small.",
    "Please keep this thread about the {noun}.",
    "Does the {noun} come with a manual?",
)


def username(rng: random.Random) -> str:
    return f"{words.noun(rng)}{rng.randint(1, 99)}"


def post(rng: random.Random, text: str | None = None, user: str | None = None) -> str:
    lines = [f"Posted by {user or username(rng)}"]
    if not text and rng.random() < 0.3:
        lines.append("> " + rng.choice(POSTS).format(noun=words.noun(rng), adj=words.adjective(rng)))
    lines.append(text or rng.choice(POSTS).format(noun=words.noun(rng), adj=words.adjective(rng)))
    return "\n".join(lines)


def forum_network(seed: str, units: int) -> Draft:
    """Posts of a thread; one gives the new name of a clubhouse's Wi-Fi network. Post numbers are filled in
    after placing, so they run in order."""
    rng = random.Random(f"{seed}/needle")
    network = f"{words.adjective(rng)}-{words.noun(rng)}-{words.digits(rng, 2)}"
    user, depth = username(rng), rng.random()
    text = f"The clubhouse Wi-Fi network is now called {network}."
    posts = generated.with_needle(seed, units, post(rng, text, user), depth, [network, user], post)
    # Calibration: asked for a Wi-Fi password, the model wrote a made-up one ("123456") half the time even
    # with the poster named; a network name has no such prior. The prefix names the poster, as the e-mail
    # task's names the subject.
    return Draft(
        "Thread: clubhouse questions\n\n" + "\n\n".join(f"#{k + 1} {text}" for k, text in enumerate(posts)),
        "The text is a thread of a community forum.",
        f"According to {user}, what is the clubhouse Wi-Fi network called now?",
        f"Posted by {user}\nThe clubhouse Wi-Fi network is now called",
        network,
    )


# ---- Task board: the due date of the one item that has one ----

SECTIONS = ("Backlog", "In progress", "Review", "Done")
VERBS = ("Update", "Fix", "Write", "Review", "Plan")


def task_title(rng: random.Random) -> str:
    return f"{rng.choice(VERBS)} the {words.adjective(rng)} {words.noun(rng)}"


def task_item(rng: random.Random, title: str | None = None, due: str | None = None) -> str:
    owner, due = rng.choice(words.FIRST_NAMES), f" [due {due}]" if due else ""
    return f"- [{rng.choice([' ', 'x'])}] {title or task_title(rng)}{due} (@{owner})"


def board_section(rng: random.Random) -> str:
    items = [task_item(rng) for _ in range(rng.randint(3, 6))]
    return "\n".join([f"## {rng.choice(SECTIONS)}", *items])


def tasks_due(seed: str, units: int) -> Draft:
    rng = random.Random(f"{seed}/needle")
    title, depth = task_title(rng), rng.random()
    due = f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    needle = "\n".join([f"## {rng.choice(SECTIONS)}", task_item(rng), task_item(rng, title, due)])
    sections = generated.with_needle(seed, units, needle, depth, [title, due], board_section)
    return Draft(
        "# Team board\n\n" + "\n\n".join(sections),
        "The text is a team's task board in Markdown.",
        f'When is the task "{title}" due?',
        f"{title} [due",  # not "title, due": the model went on "due to the task ..." (80 uncompressed)
        due,
    )


GENERATORS = {
    "third_calendar_location": Generator(
        "iCalendar file: where the one event with a location takes place, named by its summary",
        "icalendar",
        calendar_location,
        max_new_tokens=12,
    ),
    "third_schema_default": Generator(
        "SQL schema: the default value of the one column that has one, named by table and column",
        "sql-schema",
        schema_default,
        max_new_tokens=12,
    ),
    "third_forum_network": Generator(
        "forum thread: the new Wi-Fi network name one post gives, named by its poster",
        "forum-thread",
        forum_network,
        max_new_tokens=12,
    ),
    "third_tasks_due": Generator(
        "Markdown task board: the due date of the one item that has one, named by its title",
        "task-board",
        tasks_due,
        max_new_tokens=16,
    ),
}
TASKS, KINDS, METRICS, min_length, make_samples = generated.family_api(GENERATORS, LAYOUTS)
FAMILY = Family("heldout-third", KINDS)  # the suite tasks/heldout-third.yaml
