"""What `kvbench lm-eval` and `lm-eval-kvbench` check before kvbench.harness.lmeval is imported: that module
registers the `kvbench` model type with lm-eval, so it imports torch, kvpress and lm-eval (15-20 s), and a
bad --length or --model_args is refused without them."""

import json

from kvbench.core.errors import BadInput
from kvbench.tasks import ruler


def check_length(length: int | None, names: list[str], limit: int | None, model: str) -> None:
    """Refuse a --length below what a RULER task needs or beyond the model's context, before any work."""
    if length is None:
        return
    for name in names:  # our RULER tasks (tasks/lm_eval); lm-eval's own size their samples themselves
        task = name.removeprefix("kvbench_")
        if not name.startswith("kvbench_"):
            continue
        minimum = min(ruler.min_length(t) for t in ([task] if task in ruler.TASKS else ruler.TASKS))
        if length < minimum:
            raise BadInput(f"--length {length} is below the minimum of task {name!r} ({minimum})")
    if limit is not None and length > limit:
        raise BadInput(f"--length {length} exceeds the {limit}-token context of model {model!r}")


def given_keys(values: list[str]) -> set[str]:
    """The keys of lm-eval's `--model_args` or `--metadata` values as given: a JSON object, or key=value
    pairs separated by commas (lm-eval's two forms)."""
    keys = set()
    for value in values:
        try:
            parsed = json.loads(value)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            keys |= set(parsed)
            continue
        keys |= {pair.split("=")[0].strip() for pair in value.split(",") if "=" in pair}
    return keys


def check_model_args(model: str | None, model_args: list[str], metadata: list[str]) -> None:
    """`lm-eval-kvbench --model kvbench` names its model: `pretrained=` in --model_args (or a `tokenizer=`
    there or in --metadata). kvbench's tasks and lm-eval's RULER size their samples with that tokenizer,
    and lm-eval hands them the model's arguments: without it lm-eval fails with a traceback after the
    model has loaded."""
    if model != "kvbench":
        return
    if {"pretrained", "tokenizer"} & given_keys(model_args) or "tokenizer" in given_keys(metadata):
        return
    raise BadInput(
        "--model kvbench needs pretrained=MODEL in --model_args (e.g. --model_args "
        "pretrained=smollm2-135m,press=snapkv,compression_ratio=0.5): tasks size their samples with its "
        "tokenizer"
    )
