"""`lm-eval-kvbench`: lm-eval's own command line, with kvbench's model type `kvbench` registered.

    lm-eval-kvbench --model kvbench --model_args press=snapkv,compression_ratio=0.5 --tasks ruler_vt ...

lm-eval 0.4 (through 0.4.13) finds a model type only in its own table (lm_eval.models
.MODEL_MAPPING) or when something has imported the module that registers it: it reads no entry points and
has no flag that imports a module, so a plain `lm_eval --model kvbench` cannot see a model another package
defines. This script imports kvbench.lmeval, which registers the model, then runs lm-eval's own entry point
on the command line as given: every lm-eval flag and subcommand (`run`, `ls`, `validate`) works unchanged.
From Python, `import kvbench.lmeval` before `lm_eval.simple_evaluate(model="kvbench", ...)` does the same.
"""


def main() -> None:
    from lm_eval.__main__ import cli_evaluate

    import kvbench.lmeval  # noqa: F401 (registers the model type `kvbench`)

    cli_evaluate()


if __name__ == "__main__":
    main()
