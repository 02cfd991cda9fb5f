"""The learned presses, one layout each: `press.py` (the kvpress press), its model (`agent.py`, `policy.py`),
`checkpoint.py`, `train.py` and `command.py` (its `kvbench <method> ...` commands). `common/` is what they
share: the data store and datagen, the checkpoint format, Plackett-Luce rankings, the CLI option block.
Training imports the press's model, never the reverse; no learned press imports another.
"""
