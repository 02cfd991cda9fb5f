"""The held-out suites (`suites.SUITES`, in the order they were written), one module each."""

from kvbench.tasks.heldout.suites import SUITES

__all__ = ["SUITES"]
