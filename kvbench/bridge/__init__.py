"""Where kvbench meets transformers and kvpress: model loading (the embedded default among them) and
the adapter, the one module on kvpress's and transformers' internals."""
