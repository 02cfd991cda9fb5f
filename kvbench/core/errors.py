"""kvbench's own errors: problems a user can act on, each told in one line.

Library code raises these for bad input (a ratio out of range, an unknown press, a malformed data file, a
model that is not there); `kvbench`'s command line prints their first line and exits with `exit_code`
(2, or 1 for a full disk). Any other exception is a bug: the command line lets it through with its
traceback. The user-input errors also derive from ValueError, so code that caught ValueError before
these types existed still catches them.
"""

import difflib
from collections.abc import Iterable


class KvbenchError(Exception):
    """Base of kvbench's errors. The message's first line is what the command line shows."""

    exit_code = 2


class BadInput(KvbenchError, ValueError):
    """A value that is malformed or out of range: a ratio, a length, a press or protocol argument, a
    device, a folder that cannot be written."""


class UnknownPress(BadInput):
    """The press name is not in the registry, or needs something this machine lacks (the hub)."""


class UnknownTask(BadInput):
    """A task or suite name that is not in the registry (`kvbench tasks` lists them)."""


class ModelNotFound(KvbenchError):
    """The model name is neither the embedded alias, a local model folder, nor a reachable hub id."""


class TaskUnavailable(KvbenchError):
    """A task cannot run here: its data is neither on the hub nor in --data-dir."""


class DataFileError(KvbenchError, ValueError):
    """A file kvbench reads is missing or malformed (a LongBench JSONL, a suite YAML, a manifest, a
    checkpoint card); the message names the file (and line)."""


class TrainingFileError(DataFileError):
    """A data store or checkpoint that cannot be used: missing, corrupt, made for another model or by another
    method. The message names the file and the command that makes the right one."""


class KVPAgentsError(TrainingFileError):
    """KVP agents that cannot be used (missing, corrupt, made for another model)."""


class MemDecayError(DataFileError):
    """A MemDecay calibration that cannot be used (missing, or made for another model), or a bad press
    argument."""


class RayUnavailable(KvbenchError):
    """`sweep --ray`: Ray is not installed, its cluster cannot be reached, it lacks the resources asked per
    worker, or its workers load other learned state than the sweep planned with."""


class NoResults(BadInput):
    """A path given to the report holds no results."""


class WriteError(KvbenchError, OSError):
    """An output could not be written while the work ran (a full disk, a file size limit, permissions):
    not the user's input, so exit 1, but still one line; what was written before stays as it was."""

    exit_code = 1


class ResultsWriteError(WriteError):
    """The results store could not be written (disk full, permissions): not the user's input, so exit 1,
    but still one line."""


class KvbenchWarning(UserWarning):
    """Something the user should see, and that does not stop the work: a sweep cell a codec cannot reach, a
    corrupt results line skipped. The command line prints it as one `Warning:` line."""


def did_you_mean(name: object, known: Iterable[str]) -> str:
    """The tail of a message such as "unknown press 'knrom'": ": did you mean 'knorm'?" with the known names
    closest to the misspelt one (difflib's similarity ratio >= 0.6, its default), or "" when none is close."""
    close = difflib.get_close_matches(str(name), list(known), n=3)
    return f": did you mean {' or '.join(map(repr, close))}?" if close else ""
