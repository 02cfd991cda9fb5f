"""kvbench's tests, laid out like the package.

Where PYTHONDONTWRITEBYTECODE is set (this machine and CI on it, many container images), every process the
suite starts compiled torch, transformers and pandas from source again: 27 s of CPU for their imports against
13 s from bytecode. The suite writes bytecode as Python does by default, from its first process (pytest
imports this package before any conftest, so before torch) to the workers and subprocesses after it."""

import os
import sys

sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
