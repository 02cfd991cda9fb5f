"""The public way to use kvbench from lm-eval's Python API: importing this module registers lm-eval's model
type `kvbench` (what `lm-eval-kvbench` does on the command line).

    import kvbench.lmeval  # noqa: F401
    lm_eval.simple_evaluate(model="kvbench", model_args={"press": "snapkv", "compression_ratio": 0.5}, ...)

A stable path: the implementation lives in kvbench.harness.lmeval, which may move.
"""

from kvbench.harness.lmeval import KVBenchLM

__all__ = ["KVBenchLM"]
