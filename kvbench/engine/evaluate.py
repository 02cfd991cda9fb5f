"""The evaluation of one sample under many configs: each config's press built and seeded, its prompt
tokenized once per kind, and the configs handed, grouped by protocol, to their protocol's run
(`engine.protocols`, named by `core.config.Protocol.run`); presses that cannot share a prefill run alone
(`steps.run_alone`).
"""

import logging
import math
from dataclasses import replace

import torch
from kvpress.utils import compute_n_kept

from kvbench.bridge.adapter import (
    attention_implementation,
    is_shareable,
    seed_press,
)
from kvbench.core.config import PROTOCOLS, Config, Protocol, protocol_of
from kvbench.core.errors import BadInput
from kvbench.core.registry import first_line, load_target
from kvbench.engine.steps import Run, run_alone
from kvbench.presses import check_distinct_presses, config_press, press_of
from kvbench.tasks.base import Sample
from kvbench.tasks.prompt import tokenize_sample

logger = logging.getLogger(__name__)


def evaluate_sample(
    model, tokenizer, sample: Sample, configs: list[Config], *, batch_configs: int = 16
) -> list[dict]:
    """`_answer_sample`, where a press's code that exits (sys.exit, GeneratorExit: what a library never
    means) is BadInput naming the sample, so that the run stops in one line with its rows kept."""
    try:
        return _answer_sample(model, tokenizer, sample, configs, batch_configs=batch_configs)
    except (SystemExit, GeneratorExit) as error:
        presses = ", ".join(sorted({config.press for config in configs if config.press != "none"}))
        raise BadInput(
            f"a press exited on sample {sample.task}/{sample.id} ({first_line(error)}); of {presses}, "
            "kvbench check-press says which"
        ) from None


def _answer_sample(
    model, tokenizer, sample: Sample, configs: list[Config], *, batch_configs: int = 16
) -> list[dict]:
    """Answer `sample` under every config; one dict per config and question (config by config, each
    config's questions in order: one question but under the multi-question protocols).

    Keys: prediction, context_tokens, kv_kept, kv_total (KV entries = tokens x layers x KV heads, after and
    before compression), kv_bytes, kv_bytes_full (what a 16-bit store of the compressed and of the full
    context cache holds, metadata included), prefill_s, decode_s. Times are amortised: a config's share of
    the shared prefill plus its own compression time, and its share of the batched decoding, so that they
    add up to the wall time over configs. Configs are processed `batch_configs` at a time to bound memory.
    Under multi-turn, a turn's context_tokens and kv counts are those of the cache its question is asked
    of (the context and the turns before, compressed).
    """
    if batch_configs < 1:
        raise BadInput(f"batch_configs must be at least 1, got {batch_configs}")
    prompts = {}
    for config in configs:
        aware = protocol_of(config).question_prefilled
        if aware not in prompts:
            prompts[aware] = tokenize_sample(tokenizer, sample, query_aware=aware)
    runs = []
    for config in configs:
        prompt = prompts[protocol_of(config).question_prefilled]
        resolved = press_of(config)  # carried by a planned config: the registry is not asked again
        sized = sized_config(replace(config, resolved=resolved), prompt.context_ids.shape[1])
        # Each (sample, config) draws its own randomness: the same answer alone, in any sweep and on resume.
        press = seed_press(config_press(sized), f"{sample.task}/{sample.id}/{config!r}")
        runs.append(Run(sized, press, resolved.needs_eager, prompt))
    check_distinct_presses([run.config for run in runs], [run.press for run in runs])
    # Runs that prefill the same prompt under one protocol share a prefill and a batched decoding.
    groups: dict[tuple, list[Run]] = {}
    alone = []
    for run in runs:
        if is_shareable(run.press):
            groups.setdefault((id(run.prompt), run.config.protocol), []).append(run)
        else:
            alone.append(run)
    with torch.no_grad():
        for (_, protocol), group in groups.items():
            answer = protocol_run(PROTOCOLS[protocol])
            for start in range(0, len(group), batch_configs):
                answer(model, group[start : start + batch_configs], sample)
        _log_fallback(alone)
        for run in alone:
            # As the pipeline on an eager model when the press needs attention weights.
            eager = run.needs_attentions
            with attention_implementation(model, "eager" if eager else model.config._attn_implementation):
                run_alone(model, run, sample.max_new_tokens)
    results = []
    for run in runs:
        asked = sample.questions() if protocol_of(run.config).several_questions else [sample]
        for answer, part in zip(run.answers, asked, strict=True):
            prediction = decode_prediction(tokenizer, answer.pop("tokens"), part)
            results.append({**run.result, **answer, "prediction": prediction})
    return results


def protocol_run(protocol: Protocol):
    """The run of a protocol: its `run` callable, or the function its `module:function` target names."""
    return (
        protocol.run
        if callable(protocol.run)
        else load_target(protocol.run, f"protocol {protocol.name!r} run")
    )


def sized_config(config: Config, context_length: int) -> Config:
    """The config with the ratio its absolute budget gives for this context: exactly `budget` entries kept
    per head (kvpress's compute_n_kept of the ratio), none removed when the context is not longer."""
    if config.budget is None:
        return config
    if config.budget >= context_length:
        return replace(config, ratio=0.0)
    ratio = (context_length - config.budget) / context_length
    # (L - N) / L in floating point can keep N - 1 or N + 1 entries: step to the next float until it keeps N.
    while compute_n_kept(context_length, ratio) < config.budget:
        ratio = math.nextafter(ratio, 0.0)
    while compute_n_kept(context_length, ratio) > config.budget:
        ratio = math.nextafter(ratio, 1.0)
    return replace(config, ratio=ratio)


def _log_fallback(runs: list[Run]) -> None:
    """Say once per press class that it runs alone (it costs a prefill per config)."""
    for name in sorted({type(run.press).__name__ for run in runs} - _logged_fallbacks):
        logger.info("%s cannot share the prefill of other presses: it runs alone", name)
        _logged_fallbacks.add(name)


_logged_fallbacks: set[str] = set()


def decode_prediction(tokenizer, tokens: list[int], sample: Sample) -> str:
    prediction = tokenizer.decode(tokens, skip_special_tokens=True)
    if sample.first_line:
        prediction = prediction.lstrip("\n").split("\n")[0]
    return prediction
