"""A second held-out family, the confirmation suite (`tasks/heldout-confirm.yaml`): task kinds and layouts
that no training mixture and no task of the first held-out suite (mail_story_patch_meeting_html) holds,
written after the shipped KVP agents were chosen, to check on fresh kinds what the first held-out suite
showed. No agent, recipe or setting may be chosen on it (docs/learned-presses.md); it confirms or refutes.

The rule is docs/learned-presses.md's held-out rule, applied against both the training kinds and the first
held-out suite's kinds:

- confirm_recipe_oven: a cookbook of recipes (ingredients, numbered steps); the oven temperature of the
  one recipe that is baked, named by its dish.
- confirm_changelog_cve: Markdown release notes (version sections of Fixed / Added / Changed bullets); the
  CVE identifier of the one security fix.
- confirm_bibtex_doi: a BibTeX bibliography; the DOI of the one entry that has one, named by its title.
- confirm_subtitles_platform: SubRip subtitles (numbered cues, time ranges, spoken lines); the platform a
  line says the train to a city leaves from.

As in the first held-out family, each answer sits in a line of a shape the material holds once (a baking
step, a Security section, a doi field, a platform), the answer prefix repeats the words that lead to it,
and the score is RULER's `string_match_all` on the one reference. Layouts, neither used by a training or
first held-out task: the material quoted e-mail style (every line after "> ") in the user turn, or the
material in the system turn with the instruction and question in the user turn.
"""

import random

from kvbench.tasks import generated, prompt, words
from kvbench.tasks.family import Family
from kvbench.tasks.generated import Draft, Generator, Layout, Placed


def quoted(draft: Draft) -> Placed:
    lines = "\n".join(f"> {line}" if line else ">" for line in draft.body.splitlines())
    return Placed(f"{draft.instruction} Here it is, quoted:\n\n{lines}\n\n", draft.question)


def system_material(draft: Draft) -> Placed:
    messages = [{"role": "system", "content": f"Reference material:\n\n{draft.body}"}]
    return Placed(prompt.transcript(messages), f"{draft.instruction}\n{draft.question}", messages)


LAYOUTS = (Layout("quoted", quoted), Layout("system-material", system_material))


# ---- Cookbook: the oven temperature of the one baked dish ----

DISHES = ("pie", "stew", "soup", "salad", "risotto", "curry", "tart", "loaf", "casserole", "chowder")
UNITS = ("g", "ml", "tablespoons", "teaspoons", "cups")
STEPS = (
    "Chop the {noun} finely and set it aside.",
    "Stir the {noun} into the pan over a low heat.",
    "Simmer gently until the {noun} is soft.",
    "Season with salt and a little {noun}.",
    "Whisk the {noun} until smooth.",
    "Leave to rest before serving with the {noun}.",
    "Toss everything together in a large bowl.",
    "Serve warm, topped with the {noun}.",
)


def dish(rng: random.Random) -> str:
    return f"{words.adjective(rng).capitalize()} {words.noun(rng)} {rng.choice(DISHES)}"


def recipe(rng: random.Random, name: str | None = None, bake: str | None = None) -> str:
    ingredients = [
        f"- {rng.randint(1, 9) * 25} {rng.choice(UNITS)} {words.noun(rng)}" for _ in range(rng.randint(3, 5))
    ]
    steps = [rng.choice(STEPS).format(noun=words.noun(rng)) for _ in range(rng.randint(2, 4))]
    if bake:
        steps.insert(rng.randint(1, len(steps)), bake)
    return "\n".join(
        [
            f"## {name or dish(rng)}",
            f"Serves {rng.randint(2, 8)}.",
            "Ingredients:",
            *ingredients,
            "Method:",
            *(f"{k + 1}. {step}" for k, step in enumerate(steps)),
        ]
    )


def recipe_oven(seed: str, units: int) -> Draft:
    """One recipe is baked; the others are cooked on the stove or not at all, and say no temperature."""
    rng = random.Random(f"{seed}/needle")
    name, degrees, depth = dish(rng), str(rng.randint(150, 240)), rng.random()
    bake = f"Bake in the oven at {degrees} degrees for {rng.randint(2, 9) * 5} minutes."
    recipes = generated.with_needle(seed, units, recipe(rng, name, bake), depth, [name, degrees], recipe)
    return Draft(
        "# Family cookbook\n\n" + "\n\n".join(recipes),
        "The text is a cookbook.",
        f"At how many degrees is the {name} baked in the oven?",
        "Bake in the oven at",
        degrees,
    )


# ---- Release notes: the CVE of the one security fix ----

CHANGES = {
    "Fixed": ("Fixed a crash when the {noun} list was empty.", "Fixed the {adj} {noun} shown twice."),
    "Added": ("Added a {noun} option to the command line.", "Added support for {adj} {noun} files."),
    "Changed": ("The {noun} cache is now {adj} by default.", "Renamed the {noun} setting."),
}


def version_section(rng: random.Random, security: str | None = None) -> str:
    version = f"{rng.randint(1, 9)}.{rng.randint(0, 30)}.{rng.randint(0, 20)}"
    date = f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    lines = [f"## [{version}] - {date}"]
    for heading in rng.sample(list(CHANGES), rng.randint(1, 3)):
        lines.append(f"### {heading}")
        lines += [
            "- " + rng.choice(CHANGES[heading]).format(noun=words.noun(rng), adj=words.adjective(rng))
            for _ in range(rng.randint(1, 3))
        ]
    if security:
        lines += ["### Security", security]
    return "\n".join(lines)


def changelog_cve(seed: str, units: int) -> Draft:
    rng = random.Random(f"{seed}/needle")
    cve, depth = f"CVE-2026-{words.digits(rng, 5)}", rng.random()
    security = f"- Patched {cve}, a flaw in the {words.noun(rng)} parser."
    sections = generated.with_needle(
        seed, units, version_section(rng, security), depth, [cve], version_section
    )
    return Draft(
        "# Changelog\n\n" + "\n\n".join(sections),
        "The text is the changelog of a software project.",
        "Which CVE identifier did the security fix in the changelog address?",
        "- Patched",
        cve,
    )


# ---- Bibliography: the DOI of the one entry that has one ----

VENUES = ("Journal of {Noun} Studies", "Proceedings of the {Adj} {Noun} Workshop", "{Noun} Review Letters")


def title(rng: random.Random) -> str:
    return f"{words.adjective(rng).capitalize()} {words.noun(rng)}s and the {words.noun(rng)} problem"


def bib_entry(rng: random.Random, name: str | None = None, doi: str | None = None) -> str:
    authors = [words.person(rng).split() for _ in range(rng.randint(1, 3))]
    year = rng.randint(1995, 2026)
    venue = rng.choice(VENUES).format(
        Noun=words.noun(rng).capitalize(), Adj=words.adjective(rng).capitalize()
    )
    fields = [
        ("author", " and ".join(f"{last}, {first}" for first, last in authors)),
        ("title", name or title(rng)),
        ("journal", venue),
        ("year", str(year)),
        ("pages", f"{(start := rng.randint(1, 300))}--{start + rng.randint(5, 30)}"),
    ]
    if doi:  # right after the title, so the answer prefix can name the entry as the e-mail task does
        fields.insert(2, ("doi", doi))
    key = f"{authors[0][1].lower()}{year}{words.noun(rng)}"
    return "\n".join([f"@article{{{key},", *(f"  {k} = {{{v}}}," for k, v in fields), "}"])


def bibtex_doi(seed: str, units: int) -> Draft:
    rng = random.Random(f"{seed}/needle")
    name, depth = title(rng), rng.random()
    doi = f"10.{words.digits(rng, 4)}/{words.noun(rng)}.{words.digits(rng, 4)}"
    entries = generated.with_needle(seed, units, bib_entry(rng, name, doi), depth, [name, doi], bib_entry)
    return Draft(
        "\n\n".join(entries),
        "The text is a BibTeX bibliography.",
        f'What is the DOI of the paper titled "{name}"?',
        f"title = {{{name}}},\n  doi = {{",
        doi,
    )


# ---- Subtitles: the platform the train to a city leaves from ----

LINES = (
    "Did you remember the {noun}?",
    "I left the {noun} on the table.",
    "We should have taken the {adj} road.",
    "Nobody tells me anything about the {noun}.",
    "Wait here, I will get the {noun}.",
    "That {noun} was {adj}, wasn't it?",
    "Come on, we are late again.",
    "Is this seat taken?",
)


def cue_time(rng: random.Random, start: int) -> str:
    end = start + rng.randint(1200, 4000)

    def clock(ms: int) -> str:
        return f"{ms // 3600000:02d}:{ms // 60000 % 60:02d}:{ms // 1000 % 60:02d},{ms % 1000:03d}"

    return f"{clock(start)} --> {clock(end)}"


def spoken(rng: random.Random) -> str:
    return rng.choice(LINES).format(noun=words.noun(rng), adj=words.adjective(rng))


def subtitles_platform(seed: str, units: int) -> Draft:
    """Cues of a film's dialogue; one line says where the train to a city leaves from. Cue numbers and times
    are filled in after placing, so they run in order through the file."""
    rng = random.Random(f"{seed}/needle")
    city, depth = rng.choice(words.CITIES), rng.random()
    platform = f"{rng.randint(1, 19)}{rng.choice('ABCD')}"
    lines = generated.with_needle(
        seed, units, f"The train to {city} leaves from platform {platform}.", depth, [platform, city], spoken
    )
    timing = random.Random(f"{seed}/timing")
    cues, start = [], timing.randint(1000, 60000)
    for k, line in enumerate(lines):
        cues.append(f"{k + 1}\n{cue_time(timing, start)}\n{line}")
        start += timing.randint(4000, 20000)
    return Draft(
        "\n\n".join(cues),
        "The text is the subtitle file (SubRip) of a film.",
        f"In the film, from which platform does the train to {city} leave?",
        f"The train to {city} leaves from platform",
        platform,
    )


GENERATORS = {
    "confirm_recipe_oven": Generator(
        "cookbook: the oven temperature of the one baked recipe, named by its dish",
        "recipe-book",
        recipe_oven,
        max_new_tokens=8,
    ),
    "confirm_changelog_cve": Generator(
        "release notes: the CVE identifier of the one security fix",
        "release-notes",
        changelog_cve,
        max_new_tokens=16,  # digits are single tokens: " CVE-2026-12345" is 13
    ),
    "confirm_bibtex_doi": Generator(
        "BibTeX bibliography: the DOI of the one entry with a doi field, named by its title",
        "bibtex",
        bibtex_doi,
        max_new_tokens=20,
    ),
    "confirm_subtitles_platform": Generator(
        "SubRip subtitles: the platform a line says the train to a city leaves from",
        "subtitles",
        subtitles_platform,
        max_units=generated.fixed(10**5),
        max_new_tokens=8,
    ),
}
TASKS, KINDS, METRICS, min_length, make_samples = generated.family_api(GENERATORS, LAYOUTS)
FAMILY = Family("heldout-confirm", KINDS)  # the suite tasks/heldout-confirm.yaml
