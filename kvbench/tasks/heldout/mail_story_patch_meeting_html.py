"""Held-out kinds, generated offline: task kinds that no training mixture holds (see docs/learned-presses.md's
rule and kvbench.tasks.mixture), to test whether a learned press generalises beyond what it was trained on.

Each differs from every training kind (kvbench.tasks.text, RULER) in the structure of its material, in how
the answer is written and asked, and in its instruction wrapper:

- heldout_email_attachment: a mailbox export (From/To/Date/Subject headers, bodies of reference prose);
  the file attached to the one e-mail with an attachment, named by its subject.
- heldout_story_place: a story in paragraphs where people carry, clean and talk about objects; where a
  person hid an object (the story's one hiding).
- heldout_patch_value: a unified diff of settings files, one changed setting per hunk; the new value of a
  setting, whose old value is on the line just above.
- heldout_transcript_number: `Speaker: remark` lines of a meeting; the room a speaker says the workshop
  moved to, the only number said.
- heldout_html_link: an HTML page of navigation lists and paragraphs; the address of its one download link.

Each answer sits in a line of a shape that the material holds once (an Attachment header, a hiding, a
room number, a download link) or next to a look-alike (the old value): the embedded 135M model finds such a
line (>= 70 uncompressed, measured in tasks/heldout.yaml) but not a key among many look-alike records (the
training kinds' records, RULER's multikey needles), and a held-out suite it cannot answer uncompressed
would measure nothing.

The answer prefix repeats the words that lead to the value, as in the training kinds. Layouts (the
instruction wrappers; each sample draws one): the material between <document> tags with the instruction
after it, or a hand-off in three turns (the user announces the material, the assistant asks for it, the
user pastes it). Neither is a training layout. Scores: RULER's `string_match_all` on the one reference.
"""

import random

from kvbench.tasks import generated, prompt, words
from kvbench.tasks.family import Family
from kvbench.tasks.generated import Draft, Generator, Layout, Placed


def tagged(draft: Draft) -> Placed:
    return Placed(f"<document>\n{draft.body}\n</document>\n\n", f"{draft.instruction}\n{draft.question}")


def hand_off(draft: Draft) -> Placed:
    messages = [
        {"role": "user", "content": f"{draft.instruction} I will paste it in my next message."},
        {"role": "assistant", "content": "Understood. Please paste it."},
        {"role": "user", "content": draft.body},
    ]
    return Placed(prompt.transcript(messages), draft.question, messages)


LAYOUTS = (Layout("tagged", tagged), Layout("hand-off", hand_off))


# ---- E-mails: the file attached to one of them ----

DOMAINS = ("example.org", "mail.example.com", "corp.example.net")
WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri")
MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
TOPICS = ("review", "update", "plan", "report", "meeting", "budget", "draft", "schedule", "notes")
EXTENSIONS = ("pdf", "xlsx", "docx", "zip", "png")


def address(name: str) -> str:
    first, last = name.lower().split()
    return f"{name} <{first}.{last}@{DOMAINS[len(last) % len(DOMAINS)]}>"


def subject_line(rng: random.Random) -> str:
    return f"{words.adjective(rng).capitalize()} {words.noun(rng)} {rng.choice(TOPICS)}"


def email(rng: random.Random, attachment: str | None = None) -> str:
    date = (
        f"{rng.choice(WEEKDAYS)}, {rng.randint(1, 28)} {rng.choice(MONTHS)} 2026 "
        f"{rng.randint(7, 19):02d}:{rng.randint(0, 59):02d}"
    )
    headers = [
        f"From: {address(words.person(rng))}",
        f"To: {address(words.person(rng))}",
        f"Date: {date}",
        f"Subject: {subject_line(rng)}",
    ]
    if attachment:
        headers.append(f"Attachment: {attachment}")
    body = " ".join(rng.sample(generated.prose_sentences(), rng.randint(2, 4)))
    return "\n".join([*headers, "", body])


def email_attachment(seed: str, units: int) -> Draft:
    """One e-mail of the mailbox has an attachment; the question names it by its subject."""
    rng = random.Random(f"{seed}/needle")
    attachment = f"{words.noun(rng)}_{words.noun(rng)}.{rng.choice(EXTENSIONS)}"
    depth = rng.random()
    needle = email(rng, attachment)
    subject = next(line for line in needle.splitlines() if line.startswith("Subject: "))
    emails = generated.with_needle(seed, units, needle, depth, [attachment, subject], email)
    return Draft(
        "\n\n".join(f"--- Message {k + 1} ---\n{text}" for k, text in enumerate(emails)),
        "The text is an export of a mailbox.",
        f'Which file is attached to the e-mail with the subject "{subject.removeprefix("Subject: ")}"?',
        f"{subject}\nAttachment:",
        attachment,
    )


# ---- Story: where a person hid an object ----

PLACES = (
    "attic", "boathouse", "cellar", "chapel", "greenhouse", "library", "pantry", "workshop", "barn", "stable",
    "bakery", "lighthouse", "mill", "orchard", "kitchen", "study", "cloakroom", "conservatory", "garage",
    "laundry", "tower", "gatehouse", "dovecote", "forge", "gallery", "nursery", "observatory", "scullery",
)  # fmt: skip
EVENTS = (
    "{name} carried the {thing} to the {place}.",
    "{name} and {other} talked about the {noun} for a while.",
    "{name} cleaned the {thing} and left it by the door.",
    "Nobody had seen the {thing} since the storm.",
    "{name} laughed at the story about the {noun}.",
    "It rained all afternoon, and {name} read a book about {noun}s.",
    "{other} asked {name} whether the {thing} was still for sale.",
    "At dinner, {name} and {other} argued about the {noun}.",
)


def event(rng: random.Random, names: list[str]) -> str:
    name, other = rng.sample(names, 2)
    return rng.choice(EVENTS).format(
        name=name,
        other=other,
        thing=words.adjective_noun(rng),
        place=rng.choice(PLACES),
        noun=words.noun(rng),
    )


def story_place(seed: str, units: int) -> Draft:
    """One sentence hides something; the others carry, clean and talk about other things, in other places."""
    rng = random.Random(f"{seed}/needle")
    names = rng.sample(words.FIRST_NAMES, 5)
    name, hidden, place, depth = names[0], words.adjective_noun(rng), rng.choice(PLACES), rng.random()
    sentences = generated.with_needle(
        seed,
        units,
        f"{name} hid the {hidden} in the {place}.",
        depth,
        [hidden],
        lambda rng: event(rng, names),
    )
    paragraphs = [" ".join(sentences[k : k + 5]) for k in range(0, len(sentences), 5)]
    return Draft(
        "\n\n".join(paragraphs),
        "The text is a story about a household.",
        f"Where did {name} hide the {hidden}?",
        f"{name} hid the {hidden} in the",
        place,
    )


# ---- Patch: the new value of a changed setting ----


def hunk(rng: random.Random, key: str, old: str, new: str) -> str:
    path = f"services/{words.noun(rng)}/settings.ini"
    line = rng.randint(3, 400)
    before = [f" {words.two_nouns(rng)} = {rng.randint(1, 9999)}" for _ in range(rng.randint(1, 3))]
    after = [f" {words.two_nouns(rng)} = {rng.randint(1, 9999)}" for _ in range(rng.randint(1, 3))]
    size = len(before) + len(after) + 1
    return "\n".join(
        [
            f"diff --git a/{path} b/{path}",
            f"--- a/{path}",
            f"+++ b/{path}",
            f"@@ -{line},{size} +{line},{size} @@",
            *before,
            f"-{key} = {old}",
            f"+{key} = {new}",
            *after,
        ]
    )


def patch_value(seed: str, units: int) -> Draft:
    rng = random.Random(f"{seed}/needle")
    key, old, new = words.two_nouns(rng), str(rng.randint(10, 99999)), str(rng.randint(10, 99999))
    depth = rng.random()
    reserved = [key, f"= {new}"]

    def other(rng: random.Random) -> str:
        old, new = (str(rng.randint(10, 99999)) for _ in range(2))
        return hunk(rng, words.two_nouns(rng), old, new)

    hunks = generated.with_needle(seed, units, hunk(rng, key, old, new), depth, reserved, other)
    return Draft(
        "\n".join(hunks),
        "The text is a patch in unified diff format that changes settings files.",
        f"In the patch, what is the new value of {key}?",
        f"+{key} =",
        new,
    )


# ---- Meeting transcript: a number one speaker gave ----

REMARKS = (
    "I think we should look at the {noun} first.",
    "Agreed. The {noun} numbers looked fine last week.",
    "Can we move the {noun} item to the end?",
    "I will ask the {noun} team and report back.",
    "That sounds {adj} to me.",
    "Let us not spend too long on the {noun}.",
    "Does anyone have questions about the {noun}?",
    "We still need a decision on the {adj} {noun}.",
)


def remark(rng: random.Random, speakers: list[str]) -> str:
    text = rng.choice(REMARKS).format(noun=words.noun(rng), adj=words.adjective(rng))
    return f"{rng.choice(speakers)}: {text}"


def transcript_number(seed: str, units: int) -> Draft:
    """Lines of a meeting; one speaker gives the number of a room, and only that line holds a number."""
    rng = random.Random(f"{seed}/needle")
    speakers = rng.sample(words.FIRST_NAMES, 4)
    room, depth = f"{rng.randint(1, 9)}{rng.choice('ABCDEFGH')}{rng.randint(10, 99)}", rng.random()
    needle = f"{speakers[0]}: The workshop moved, it is now in room {room}."
    lines = generated.with_needle(seed, units, needle, depth, [room], lambda rng: remark(rng, speakers))
    return Draft(
        "Meeting notes (transcript)\n\n" + "\n".join(lines),
        "The text is the transcript of a team meeting.",
        f"According to {speakers[0]}, in which room is the workshop now?",
        "The workshop moved, it is now in room",
        room,
    )


# ---- HTML: the address of the page's download link ----


def slug(rng: random.Random) -> str:
    return f"/docs/{words.noun(rng)}-{words.noun(rng)}.html"


def label(rng: random.Random) -> str:
    return f"{words.adjective(rng).capitalize()} {words.noun(rng)} guide"


def html_block(rng: random.Random) -> str:
    if rng.random() < 0.3:
        return f"<p>{' '.join(rng.sample(generated.prose_sentences(), 2))}</p>"
    items = [f'  <li><a href="{slug(rng)}">{label(rng)}</a></li>' for _ in range(rng.randint(3, 6))]
    return "\n".join(["<ul>", *items, "</ul>"])


def html_link(seed: str, units: int) -> Draft:
    """Navigation lists of documentation links; one link, of class "download", points elsewhere."""
    rng = random.Random(f"{seed}/needle")
    # An absolute address: after `href="` the model writes "https://" whatever follows in the context
    # (measured: 2 of 20 relative /releases/... addresses copied).
    href = f"https://downloads.example.org/{words.noun(rng)}-{rng.randint(1, 9)}.{rng.randint(0, 20)}.tar.gz"
    depth = rng.random()
    needle = f'<p>Get the latest release: <a class="download" href="{href}">download</a></p>'
    blocks = generated.with_needle(seed, units, needle, depth, [href], html_block)
    return Draft(
        "<html>\n<body>\n" + "\n".join(blocks) + "\n</body>\n</html>",
        "The text is the HTML source of a documentation page.",
        "What is the address of the page's download link?",
        '<a class="download" href="',
        href,
    )


GENERATORS = {
    "heldout_email_attachment": Generator(
        "e-mails: the file attached to the one e-mail with an attachment, named by its subject",
        "email-headers",
        email_attachment,
        max_new_tokens=12,
    ),
    "heldout_story_place": Generator(
        "story: where a person hid an object, among other hidings, carryings and findings",
        "narrative-events",
        story_place,
        max_units=generated.fixed(10**5),
        max_new_tokens=8,
    ),
    "heldout_patch_value": Generator(
        "unified diff: the new value of a changed setting, its old value on the line above",
        "patch-diff",
        patch_value,
        max_new_tokens=12,
    ),
    "heldout_transcript_number": Generator(
        "meeting transcript: the room number one speaker gave, the only number said",
        "meeting-transcript",
        transcript_number,
        max_units=generated.fixed(10**5),
        max_new_tokens=10,
    ),
    "heldout_html_link": Generator(
        "HTML page: the address of the one download link among navigation links",
        "html-links",
        html_link,
        max_new_tokens=24,
    ),
}
TASKS, KINDS, METRICS, min_length, make_samples = generated.family_api(GENERATORS, LAYOUTS)
FAMILY = Family("heldout", KINDS)  # the suite tasks/heldout.yaml
