"""The held-out suites, in the order they were written: one module each (its generators, layouts, the
family API of kvbench.tasks.generated and its `FAMILY`, named as its suite file `tasks/<name>.yaml`).

The order is part of the held-out rule (docs/learned-presses.md): each suite was written after the verdict of
the one before it, and may share no kind or layout with a training mixture or an earlier suite
(tests/tasks/test_mixture.py walks SUITES in this order). Adding a suite: its module here, its entry at the
end of SUITES, its YAML."""

from kvbench.tasks.heldout import (
    calendar_schema_forum_board,
    docker_cron_match_pgn,
    gitlog_yaml_contract_glossary,
    mail_story_patch_meeting_html,
    recipe_changelog_bibtex_subtitles,
    zone_traceback_screenplay_shell,
)

SUITES = (
    mail_story_patch_meeting_html,
    recipe_changelog_bibtex_subtitles,
    calendar_schema_forum_board,
    gitlog_yaml_contract_glossary,
    docker_cron_match_pgn,
    zone_traceback_screenplay_shell,
)
