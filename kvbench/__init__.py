"""kvbench: benchmark and comparison harness for KV-cache compression."""

import sys


def main():
    """The `kvbench` console script: Ctrl-C while the CLI's modules import is one line and exit 130 too
    (once a command runs, `kvbench.cli.Group` says the same)."""
    try:
        from kvbench.cli import main as cli
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    return cli()
