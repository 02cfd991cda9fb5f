"""`lm-eval-kvbench`: lm-eval's own command line, with kvbench's model type `kvbench` registered and
kvbench's lm-eval tasks (`kvbench_*`) findable.

    lm-eval-kvbench --model kvbench --model_args press=snapkv,compression_ratio=0.5 --tasks kvbench_vt ...

lm-eval 0.4 (through 0.4.13) finds a model type only in its own table (lm_eval.models
.MODEL_MAPPING) or when something has imported the module that registers it: it reads no entry points and
has no flag that imports a module, so a plain `lm_eval --model kvbench` cannot see a model another package
defines. This script imports kvbench.lmeval, which registers the model, then runs lm-eval's own entry point
on the command line as given: every lm-eval flag and subcommand (`run`, `ls`, `validate`) works unchanged.
Without `--include_path` it adds kvbench's own task folder (shipped in the wheel), so the `kvbench_*` tasks
resolve from any install; lm-eval takes one include path, so a user who gives their own reaches kvbench's
tasks through it (e.g. a folder holding both). From Python, `import kvbench.lmeval` before
`lm_eval.simple_evaluate(model="kvbench", ...)` does the same.
"""

import sys

HELP = {"-h", "--help"}


def with_kvbench_tasks(argv: list[str]) -> list[str]:
    """`argv` with kvbench's lm-eval task folder as `--include_path`, unless it names one or asks for help."""
    if not argv or HELP & set(argv) or any(arg.split("=")[0] == "--include_path" for arg in argv):
        return argv
    from kvbench.resources import lm_eval_tasks_dir

    return [*argv, "--include_path", str(lm_eval_tasks_dir())]


def main() -> None:
    """lm-eval's command line; kvbench's own errors (a bad `--model_args` value: an unknown press, a ratio
    out of range, a missing model, a bad press argument) are one line and their exit code, as in `kvbench`."""
    from lm_eval.__main__ import cli_evaluate

    import kvbench.lmeval  # noqa: F401 (registers the model type `kvbench`)
    from kvbench.errors import KvbenchError
    from kvbench.models import first_line

    sys.argv = [sys.argv[0], *with_kvbench_tasks(sys.argv[1:])]
    try:
        cli_evaluate()
    except KvbenchError as error:
        print(f"Error: {first_line(error)}", file=sys.stderr)
        sys.exit(error.exit_code)


if __name__ == "__main__":
    main()
