"""The held-out suites, in the order they were written: one module each (its generators, layouts and the
family API of kvbench.tasks.generated), and its suite file `tasks/<name>.yaml`.

The order is part of the held-out rule (docs/learned-presses.md): each suite was written after the verdict of
the one before it, and may share no kind or layout with a training mixture or an earlier suite
(tests/tasks/test_mixture.py walks SUITES in this order). Adding a suite: its module here, its entry at the
end of SUITES, its YAML."""

from dataclasses import dataclass
from types import ModuleType

from kvbench.tasks.heldout import (
    calendar_schema_forum_board,
    docker_cron_match_pgn,
    gitlog_yaml_contract_glossary,
    mail_story_patch_meeting_html,
    recipe_changelog_bibtex_subtitles,
    zone_traceback_screenplay_shell,
)


@dataclass(frozen=True)
class HeldOutSuite:
    name: str  # the suite (tasks/<name>.yaml) and the family name in the task registry
    module: ModuleType  # TASKS, KINDS, METRICS, LAYOUTS, GENERATORS, min_length, make_samples

    @property
    def tasks(self) -> list[str]:
        return list(self.module.TASKS)


SUITES = (
    HeldOutSuite("heldout", mail_story_patch_meeting_html),
    HeldOutSuite("heldout-confirm", recipe_changelog_bibtex_subtitles),
    HeldOutSuite("heldout-third", calendar_schema_forum_board),
    HeldOutSuite("heldout-fourth", gitlog_yaml_contract_glossary),
    HeldOutSuite("heldout-fifth", docker_cron_match_pgn),
    HeldOutSuite("heldout-sixth", zone_traceback_screenplay_shell),
)
