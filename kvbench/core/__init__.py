"""The vocabulary every layer shares: config and protocol names, errors, validation of numbers and
files, provenance, where shipped files are, and the registries users extend. Imports nothing of kvbench
above it."""
