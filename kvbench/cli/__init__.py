"""The `kvbench` command line (the only place that imports click): the group and its main commands
(`commands`), the group's lazy loading and error handling (`group`), shared options (`options`), and a
module per other command."""

from kvbench.cli.commands import main
from kvbench.cli.group import LAZY_COMMANDS, Group
from kvbench.cli.options import model_options

__all__ = ["LAZY_COMMANDS", "Group", "main", "model_options"]
