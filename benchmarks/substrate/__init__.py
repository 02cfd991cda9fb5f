"""The attention-substrate study's code (docs/studies/attention-substrate.md): a finished study, kept beside
its script benchmarks/substrate_study.py rather than in the kvbench package: `model`, `study`, `summary`."""
