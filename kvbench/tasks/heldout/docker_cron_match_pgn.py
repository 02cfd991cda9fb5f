"""A fifth held-out family (`tasks/heldout-fifth.yaml`): task kinds and layouts in no training mixture and in
none of the four earlier held-out suites, written to judge a change chosen on those four
(docs/learned-presses.md). It chooses nothing.

- fifth_docker_port: a multi-stage Dockerfile (FROM, WORKDIR, COPY, RUN, ENV... stages); the port of the
  one EXPOSE instruction.
- fifth_cron_reboot: a crontab of commented jobs on five-field schedules; the command of the one job that
  runs at reboot.
- fifth_match_penalty: minute-by-minute live commentary of a football match; who took the one penalty,
  named by the team it was given to.
- fifth_pgn_annotator: a collection of chess games in PGN (tag pairs, then the moves); the annotator of the
  one game that has one.

As in the other held-out families, each answer sits in a line of a shape the material holds once, the
answer prefix repeats the words that lead to it, and the score is RULER's `string_match_all` on the one
reference. Layouts, used by no training or earlier held-out task: the material as a printout of numbered
pages after the instruction (`paginated`), or the material alone in the user turn, acknowledged by the
assistant, with the instruction and the question in the next user turn (`acknowledged`).
"""

import random
import textwrap

from kvbench.tasks import generated, prompt, words
from kvbench.tasks.family import Family
from kvbench.tasks.generated import Draft, Generator, Layout, Placed

PAGE_LINES = 24  # lines of material a page; every answer prefix is one line, so no page cuts one


def page_header(page: int, pages: int) -> str:
    return f"--- Page {page} of {pages} ---"


def paginated(draft: Draft) -> Placed:
    lines = draft.body.splitlines()
    pages = [lines[k : k + PAGE_LINES] for k in range(0, len(lines), PAGE_LINES)]
    text = "\n\n".join(
        page_header(k, len(pages)) + "\n" + "\n".join(page).strip("\n") for k, page in enumerate(pages, 1)
    )
    return Placed(f"{draft.instruction} It is printed on {len(pages)} pages.\n\n{text}\n\n", draft.question)


def acknowledged(draft: Draft) -> Placed:
    messages = [
        {"role": "user", "content": draft.body},
        {"role": "assistant", "content": "I have read the text. What would you like to know about it?"},
    ]
    return Placed(prompt.transcript(messages), f"{draft.instruction}\n{draft.question}", messages)


LAYOUTS = (Layout("paginated", paginated), Layout("acknowledged", acknowledged))


# ---- Dockerfile: the port of the one EXPOSE instruction ----


def stage(rng: random.Random, port: str | None = None) -> str:
    name, tool = words.noun(rng), words.noun(rng)
    steps = [
        f"COPY {name}/ ./{name}/",
        f"RUN apt-get install -y --no-install-recommends {tool}-tools",
        f"RUN make -C {name} {rng.choice(['build', 'install', 'check', 'release'])}",
        f"ENV {name.upper()}_MODE={words.adjective(rng)}",
        f"COPY --from={words.noun(rng)} /out/{tool} /usr/local/lib/{tool}",
        f'LABEL description="{words.adjective(rng)} {tool} build"',
        f"USER {tool}",
    ]
    lines = [
        f"FROM registry.example.org/{words.adjective(rng)}-{tool}:{rng.randint(1, 9)}.{rng.randint(0, 20)}"
        f" AS {name}",
        f"WORKDIR /srv/{name}",
        *rng.sample(steps, rng.randint(2, 4)),
    ]
    if port:
        lines.append(f"EXPOSE {port}")
    lines.append(f'CMD ["/usr/local/bin/{name}", "--{words.adjective(rng)}"]')
    return "\n".join(lines)


def docker_port(seed: str, units: int) -> Draft:
    rng = random.Random(f"{seed}/needle")
    port, depth = words.digits(rng, 4), rng.random()
    stages = generated.with_needle(seed, units, stage(rng, port), depth, [port, "EXPOSE"], stage)
    return Draft(
        "# syntax=docker/dockerfile:1\n\n" + "\n\n".join(stages),
        "The text is a Dockerfile.",
        "Which port does the Dockerfile expose?",
        "EXPOSE",
        port,
    )


# ---- Crontab: the command of the one job that runs at reboot ----

CRON_COMMENTS = (
    "Rotate the {noun} logs",
    "Back up the {noun} database",
    "Send the {adj} {noun} report",
    "Clean up old {noun} files",
    "Refresh the {noun} cache",
    "Sync the {noun} mirror",
    "Check the {adj} {noun} queue",
)
CRON_ARGUMENTS = ("--quiet", "> /dev/null 2>&1", "--since 7d", "--all", "--dry-run", "--verbose")


def script(rng: random.Random) -> str:
    """A script on the crontab's PATH, called by its name alone. With /usr/local/bin/NAME the model scored 60
    uncompressed: after the path every job shares it went on with `cron`, `sh` or another job's script."""
    return words.adjective_noun(rng, "-")


def cron_job(rng: random.Random, command: str | None = None) -> str:
    comment = rng.choice(CRON_COMMENTS).format(noun=words.noun(rng), adj=words.adjective(rng))
    if command:
        return f"# Start the {words.noun(rng)} service\n@reboot {command} {rng.choice(CRON_ARGUMENTS)}"
    schedule = " ".join(
        [
            str(rng.randint(0, 59)),
            rng.choice(["*", f"*/{rng.randint(2, 6)}", str(rng.randint(0, 23))]),
            rng.choice(["*", "*", str(rng.randint(1, 28))]),
            "*",
            rng.choice(["*", "*", "1-5", str(rng.randint(0, 6))]),
        ]
    )
    return f"# {comment}\n{schedule} {script(rng)} {rng.choice(CRON_ARGUMENTS)}"


def cron_reboot(seed: str, units: int) -> Draft:
    rng = random.Random(f"{seed}/needle")
    command, depth = script(rng), rng.random()
    jobs = generated.with_needle(seed, units, cron_job(rng, command), depth, [command, "@reboot"], cron_job)
    return Draft(
        "# m h dom mon dow command\nSHELL=/bin/sh\nPATH=/opt/jobs/bin:/usr/bin:/bin\n\n" + "\n\n".join(jobs),
        "The text is a crontab, the table of jobs that cron runs.",
        "Which command does the crontab run at reboot?",
        "@reboot",
        command,
    )


# ---- Match commentary: who took the one penalty ----

# Players go unnamed but for the penalty taker, who is named after a label ("Taker:"). Calibration (25
# samples, uncompressed): with a player named in every line the model answered 20, mostly with a name of its
# own; with unnamed players and "Penalty to TEAM, taken by NAME" 68 (it went on "a Lyon striker"), with
# "Penalty to TEAM! NAME scores" 24 (it stopped after the "!").
MATCH_EVENTS = (
    "Corner to {team}, but the ball is cleared.",
    "The {team} striker shoots from distance, just wide.",
    "Yellow card for a {team} defender after a late tackle.",
    "Substitution for {team} in midfield.",
    "Free kick to {team} in midfield.",
    "The {team} winger is caught offside.",
    "The {team} goalkeeper makes a great save.",
    "{team} keep the ball for a long spell.",
    "A {team} midfielder goes down injured, but carries on.",
    "Throw-in to {team} deep in their own half.",
)


def match_event(rng: random.Random, teams: tuple[str, str]) -> str:
    return rng.choice(MATCH_EVENTS).format(team=rng.choice(teams))


def match_penalty(seed: str, units: int) -> Draft:
    """Events of a match; one is a penalty. Minutes are filled in after placing, so they run in order."""
    rng = random.Random(f"{seed}/needle")
    teams = tuple(rng.sample(words.CITIES, 2))
    team, taker, depth = rng.choice(teams), words.person(rng), rng.random()
    events = generated.with_needle(
        seed,
        units,
        f"Penalty to {team}. Taker: {taker}. Goal!",
        depth,
        [taker, "penalty"],
        lambda r: match_event(r, teams),
    )
    last = max(len(events) - 1, 1)
    return Draft(
        f"LIVE: {teams[0]} v {teams[1]}\n\n"
        + "\n".join(f"{1 + 89 * k // last}' {e}" for k, e in enumerate(events)),
        "The text is the live commentary of a football match, minute by minute.",
        f"Who took the penalty for {team}?",
        f"Penalty to {team}. Taker:",
        taker,
    )


# ---- PGN: the annotator of the one annotated game ----

PIECES = ("", "", "", "N", "B", "R", "Q", "K")


def chess_move(rng: random.Random) -> str:
    if rng.random() < 0.04:
        return rng.choice(["O-O", "O-O-O"])
    square = f"{rng.choice('abcdefgh')}{rng.randint(1, 8)}"
    piece = rng.choice(PIECES)
    if rng.random() < 0.2:
        square = f"{piece or rng.choice('abcdefgh')}x{square}"
    else:
        square = piece + square
    return square + ("+" if rng.random() < 0.08 else "")


def pgn_name(rng: random.Random) -> str:
    first, last = words.person(rng).split()
    return f"{last}, {first}"


def pgn_game(rng: random.Random, annotator: str | None = None) -> str:
    city, result = rng.choice(words.CITIES), rng.choice(["1-0", "0-1", "1/2-1/2"])
    tags = [
        ("Event", f"{city} {rng.choice(['Open', 'Rapid', 'Masters', 'Championship'])}"),
        ("Site", city),
        ("Date", f"2026.{rng.randint(1, 12):02d}.{rng.randint(1, 28):02d}"),
        ("Round", str(rng.randint(1, 9))),
        ("White", pgn_name(rng)),
        ("Black", pgn_name(rng)),
        ("Result", result),
    ]
    if annotator:
        tags.append(("Annotator", annotator))
    moves = " ".join(f"{k}. {chess_move(rng)} {chess_move(rng)}" for k in range(1, rng.randint(8, 16) + 1))
    movetext = textwrap.fill(f"{moves} {result}", width=79)
    return "\n".join(f'[{tag} "{value}"]' for tag, value in tags) + f"\n\n{movetext}"


def pgn_annotator(seed: str, units: int) -> Draft:
    rng = random.Random(f"{seed}/needle")
    annotator, depth = pgn_name(rng), rng.random()
    games = generated.with_needle(
        seed, units, pgn_game(rng, annotator), depth, [annotator, "Annotator"], pgn_game
    )
    return Draft(
        "\n\n".join(games),
        "The text is a collection of chess games in PGN format.",
        "Who annotated the one annotated game of the collection?",
        '[Annotator "',
        annotator,
    )


GENERATORS = {
    "fifth_docker_port": Generator(
        "Dockerfile: the port of the one EXPOSE instruction", "dockerfile", docker_port, max_new_tokens=12
    ),
    "fifth_cron_reboot": Generator(
        "crontab: the command of the one job that runs at reboot", "crontab", cron_reboot, max_new_tokens=12
    ),
    "fifth_match_penalty": Generator(
        "live match commentary: who took the one penalty, named by the team it was given to",
        "match-commentary",
        match_penalty,
        max_new_tokens=12,
    ),
    "fifth_pgn_annotator": Generator(
        "chess games in PGN: the annotator of the one game that has one",
        "chess-pgn",
        pgn_annotator,
        max_new_tokens=12,
    ),
}
TASKS, KINDS, METRICS, min_length, make_samples = generated.family_api(GENERATORS, LAYOUTS)
FAMILY = Family("heldout-fifth", KINDS)  # the suite tasks/heldout-fifth.yaml
