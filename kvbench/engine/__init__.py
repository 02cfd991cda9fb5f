"""The engine: one sample under many configs (`evaluate`), and the checks a config passes before any work
(`checks`); the protocols' runs (`protocols/`), what runs are made of (`steps`), the batched decoder."""

from kvbench.engine.checks import check_compresses_live, check_protocol
from kvbench.engine.evaluate import decode_prediction, evaluate_sample, protocol_run, sized_config

__all__ = [
    "check_compresses_live",
    "check_protocol",
    "decode_prediction",
    "evaluate_sample",
    "protocol_run",
    "sized_config",
]
