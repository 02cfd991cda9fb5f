"""The learned and fitted presses. Each is declared once in `catalog.py` (what the press registry and the
commands read of it); its state is read and written by one spine (`common/state.py`: the card, model
matching, loading). A learned press is a package (`kvp/`, `distillcache/`, `gate/`, `memdecay/`: its press,
its model, its training; its commands in kvbench/cli/); a fitted press is one module of `fitted/` (kvpress's
press class and its `fit`). `common/` also holds the data store, datagen and Plackett-Luce rankings.
Training imports the press's model, never the reverse; no learned press imports another.
"""
