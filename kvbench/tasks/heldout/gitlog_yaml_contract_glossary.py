"""A fourth held-out family (`tasks/heldout-fourth.yaml`): task kinds and layouts in no training mixture and
in none of the three earlier held-out suites, written to judge a change chosen on those three
(docs/learned-presses.md: agents trained for high compression ratios only). It chooses nothing.

- fourth_commit_issue: a `git log` of commits (hash, author, date, subject, body); the issue number the one
  commit that closes one names in its subject, the commit named by its subject.
- fourth_config_secret: a YAML file of services (image, replicas, port); the secret of the one service that
  has one, named by the service.
- fourth_contract_interest: an agreement of numbered clauses; the yearly interest rate the one late-payment
  clause sets.
- fourth_glossary_former: a glossary of terms with their part of speech and a definition; the former name of
  the one term that had one, named by the term.

As in the other held-out families, each answer sits in a line of a shape the material holds once, the
answer prefix repeats the words that lead to it, and the score is RULER's `string_match_all` on the one
reference. Layouts, used by no training or earlier held-out task: the material with every line numbered as
`cat -n` prints it (`numbered-lines`), or the material as an earlier assistant turn that showed it to the user
(`assistant-shown`).
"""

import random

from kvbench.tasks import generated, prompt, words
from kvbench.tasks.family import Family
from kvbench.tasks.generated import Draft, Generator, Layout, Placed


def numbered_lines(draft: Draft) -> Placed:
    lines = "\n".join(f"{k:>6}\t{line}" for k, line in enumerate(draft.body.splitlines(), 1))
    return Placed(f"{lines}\n\n{draft.instruction}\n", draft.question)


def assistant_shown(draft: Draft) -> Placed:
    messages = [
        {"role": "user", "content": "Show me the file, please."},
        {"role": "assistant", "content": f"Here it is:\n\n{draft.body}"},
        {"role": "user", "content": draft.instruction},
    ]
    return Placed(prompt.transcript(messages), draft.question, messages)


LAYOUTS = (Layout("numbered-lines", numbered_lines), Layout("assistant-shown", assistant_shown))


# ---- git log: the issue the one closing commit closes ----

COMMIT_VERBS = ("Refactor", "Add", "Remove", "Rename", "Document", "Speed up", "Simplify")


def commit_subject(rng: random.Random) -> str:
    return f"{rng.choice(COMMIT_VERBS)} the {words.adjective(rng)} {words.noun(rng)} module"


def commit(rng: random.Random, subject: str | None = None) -> str:
    first, last = words.person(rng).split()
    lines = [
        f"commit {rng.getrandbits(160):040x}",
        f"Author: {first} {last} <{first.lower()}.{last.lower()}@example.org>",
        f"Date:   2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
        "",
        f"    {subject or commit_subject(rng)}",
    ]
    if rng.random() < 0.5:
        lines += ["", f"    {rng.choice(generated.prose_sentences())}"]
    return "\n".join(lines)


def commit_issue(seed: str, units: int) -> Draft:
    rng = random.Random(f"{seed}/needle")
    subject, issue, depth = commit_subject(rng), words.digits(rng, 5), rng.random()
    commits = generated.with_needle(
        seed, units, commit(rng, f"{subject} (closes #{issue})"), depth, [subject, issue], commit
    )
    return Draft(
        "\n\n".join(commits),
        "The text is the output of git log for a repository.",
        f'Which issue number does the commit "{subject}" close?',
        f"{subject} (closes #",
        issue,
    )


# ---- YAML config: the secret of the one service that has one ----


def service(rng: random.Random, name: str | None = None, secret: str | None = None) -> str:
    name = name or words.adjective_noun(rng, "-")
    lines = [f"  {name}:"]
    if secret:  # right under the name, so the answer prefix can name the service
        lines.append(f"    secret: {secret}")
    lines += [
        f"    image: registry.example.org/{name}:{rng.randint(1, 9)}.{rng.randint(0, 20)}",
        f"    replicas: {rng.randint(1, 8)}",
        f"    port: {rng.randint(3000, 9999)}",
    ]
    return "\n".join(lines)


def config_secret(seed: str, units: int) -> Draft:
    rng = random.Random(f"{seed}/needle")
    name, depth = words.adjective_noun(rng, "-"), rng.random()
    secret = f"{words.noun(rng)}-key-{words.digits(rng, 4)}"
    services = generated.with_needle(seed, units, service(rng, name, secret), depth, [name, secret], service)
    return Draft(
        "version: 3\nservices:\n" + "\n".join(services),
        "The text is a YAML configuration file of services.",
        f"Which secret does the service {name} use?",
        f"{name}:\n    secret:",
        secret,
    )


# ---- Agreement: the interest rate the one late-payment clause sets ----

CLAUSES = (
    "Term. This agreement begins on the signing date and runs for {n} months.",
    "Delivery. The Supplier shall deliver each {noun} within {n} days of an order.",
    "Warranty. The Supplier warrants that every {noun} is free of defects for {n} months.",
    "Confidentiality. Neither party shall disclose the other's {noun} plans to any third party.",
    "Notices. Notices are given in writing to the address of the {noun} office.",
    "Assignment. Neither party may assign this agreement without written consent.",
    "Force majeure. Neither party is liable for delays caused by a {adj} {noun} beyond its control.",
    "Termination. Either party may end this agreement with {n} days' written notice.",
    "Inspection. The Customer may inspect any {noun} on delivery and reject {adj} ones.",
)


def clause(rng: random.Random) -> str:
    template = rng.choice(CLAUSES)
    return template.format(n=rng.randint(2, 90), noun=words.noun(rng), adj=words.adjective(rng))


def contract_interest(seed: str, units: int) -> Draft:
    """Clauses of a supply agreement; one sets the interest on late payments. Clause numbers are filled
    in after placing, so they run in order."""
    rng = random.Random(f"{seed}/needle")
    rate, depth = f"{rng.randint(2, 14)}.{words.digits(rng, 2)}", rng.random()
    needle = f"Late payment. Overdue amounts bear interest at {rate} percent per year."
    clauses = generated.with_needle(seed, units, needle, depth, [rate, "interest"], clause)
    return Draft(
        "SUPPLY AGREEMENT\n\n" + "\n\n".join(f"{k + 1}. {text}" for k, text in enumerate(clauses)),
        "The text is a supply agreement.",
        "At what yearly rate do overdue amounts bear interest under the agreement?",
        "Overdue amounts bear interest at",
        rate,
    )


# ---- Glossary: the former name of the one term that had one ----

PARTS_OF_SPEECH = ("noun", "verb", "adjective")


def glossary_entry(rng: random.Random, term: str | None = None, former: str | None = None) -> str:
    note = f'formerly "{former}"' if former else rng.choice(PARTS_OF_SPEECH)
    return f"**{term or words.adjective_noun(rng)}** ({note}): {rng.choice(generated.prose_sentences())}"


def glossary_former(seed: str, units: int) -> Draft:
    rng = random.Random(f"{seed}/needle")
    term, depth = words.adjective_noun(rng), rng.random()
    former = words.two_nouns(rng, " ")  # a made-up name the model cannot guess
    entries = generated.with_needle(
        seed, units, glossary_entry(rng, term, former), depth, [term, former, "formerly"], glossary_entry
    )
    return Draft(
        "# Glossary\n\n" + "\n\n".join(entries),
        "The text is a glossary of terms.",
        f'What was the term "{term}" formerly called?',
        f'**{term}** (formerly "',
        former,
    )


GENERATORS = {
    "fourth_commit_issue": Generator(
        "git log: the issue number the one closing commit closes, named by its subject",
        "git-log",
        commit_issue,
        max_new_tokens=12,
    ),
    "fourth_config_secret": Generator(
        "YAML services file: the secret of the one service that has one, named by the service",
        "yaml-config",
        config_secret,
        max_new_tokens=12,
    ),
    "fourth_contract_interest": Generator(
        "supply agreement: the yearly interest rate the one late-payment clause sets",
        "legal-agreement",
        contract_interest,
        max_new_tokens=12,
    ),
    "fourth_glossary_former": Generator(
        "glossary: the former name of the one term that had one, named by the term",
        "glossary",
        glossary_former,
        max_new_tokens=12,
    ),
}
TASKS, KINDS, METRICS, min_length, make_samples = generated.family_api(GENERATORS, LAYOUTS)
FAMILY = Family("heldout-fourth", KINDS)  # the suite tasks/heldout-fourth.yaml
