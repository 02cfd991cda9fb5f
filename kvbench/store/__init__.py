"""The results store: rows, the append-only folder they live in, run records; the records of `kvbench speed`
(`costs`) and of `kvbench check-press --out` (`conformance`)."""
