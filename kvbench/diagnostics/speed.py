"""What a press costs when it runs for real (`kvbench speed`): each press alone, unbatched, as a user would
deploy it, on one context: the prefill's time with compression against the same prefill without, greedy
decoding's tokens per second on the compressed cache, and the cache's bytes as allocated (the storage of its
tensors) beside kvbench's accounting (16-bit entries, a codec's own codes and scales).

Choices:
- Random tokens (seeded) as the context: time depends on length, not content; the same ids for every press.
- Prefill: the model's body (no LM head), under the press's hook as kvpress's pipeline installs it; the
  fastest of `repeats`, interleaved with the uncompressed prefill, so that other processes on a shared
  machine, which only ever add time, cancel out of the ratio.
- Decoding: `new_tokens` greedy steps on the compressed cache, positions continuing from the context's
  length (kvpress's pipeline), no press while decoding (the query-agnostic protocol); tokens per second of
  the fastest repeat.
- Allocated bytes: the distinct storages behind the cache's key and value tensors. kvbench's codecs
  (quant, lowrank, qevict, ...) hand attention dequantised 16/32-bit tensors, so their allocated bytes are
  those of the kept entries at the model's dtype, not their accounted bytes: a real deployment needs a
  kernel that reads the codes. Both are written, so that the gap is visible.
"""

import json
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

from kvbench.core.config import Config
from kvbench.core.errors import BadInput
from kvbench.core.validation import MIB, parse_int
from kvbench.harness.planning import configs_for_sweep, split
from kvbench.store.costs import COSTS_FILE, Cost, cost_key, load_costs
from kvbench.store.results import check_folder_writable

DEFAULT_PRESSES = "knorm,snapkv,tova,streaming_llm,kvp,qevict,memdecay,quant"
DEFAULT_LENGTHS = "1024,4096"


@dataclass
class SpeedPlan:
    configs: list[Config]
    lengths: list[int]
    new_tokens: int
    repeats: int
    out: Path
    done: dict  # cost_key -> Cost already in out/costs.jsonl


def plan_speed(presses, lengths, out, memory=None, ratios=None, new_tokens=32, repeats=2, press_args=None):
    """Every check of `kvbench speed` on its own input (and on the costs already in `out`), before torch."""
    configs = configs_for_sweep(presses, ratios=ratios, memory=memory, press_args=press_args)[1:]
    length_values = [parse_int(value, "--lengths", low=16) for value in split(lengths) if str(value).strip()]
    if not length_values:
        raise BadInput("--lengths must name at least one context length")
    twice = next((value for value in length_values if length_values.count(value) > 1), None)
    if twice is not None:
        raise BadInput(f"--lengths names {twice} twice: each length is timed once")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise BadInput(f"--out {out} is a file, not a folder")
    check_folder_writable(out, "--out folder")  # a loop of links, a read-only folder: now, not after timing
    new_tokens, repeats = parse_int(new_tokens, "--new-tokens", low=1), parse_int(repeats, "--repeats", low=1)
    return SpeedPlan(configs, length_values, new_tokens, repeats, out, load_costs(out))


def allocated_bytes(cache) -> int:
    """Bytes of the distinct storages behind a cache's keys and values (views of one buffer count once)."""
    storages = {}
    for layer in cache.layers:
        for tensor in (layer.keys, layer.values):
            if tensor is not None and tensor.numel():
                storage = tensor.untyped_storage()
                storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def prefill(model, input_ids, press=None):
    """(seconds, cache, last hidden state) of the model body's prefill of `input_ids`, under `press`."""
    import contextlib

    import torch
    from transformers import DynamicCache

    cache = DynamicCache()
    started = time.perf_counter()
    with torch.no_grad(), press(model) if press is not None else contextlib.nullcontext():
        output = model.model(input_ids=input_ids, past_key_values=cache)
    return time.perf_counter() - started, cache, output.last_hidden_state[:, -1:]


def decode_rate(model, cache, last_hidden, context_tokens: int, steps: int) -> float:
    """Tokens per second of `steps` greedy steps on `cache` (positions from `context_tokens`)."""
    import torch

    with torch.no_grad():
        token = model.lm_head(last_hidden).argmax(-1)
        started = time.perf_counter()
        for step in range(steps):
            position = torch.tensor([[context_tokens + step]], device=token.device)
            logits = model(input_ids=token, past_key_values=cache, position_ids=position).logits
            token = logits[:, -1:].argmax(-1)
    return steps / (time.perf_counter() - started)


def measure_cost(model, config: Config, press, input_ids, plan: SpeedPlan, device: str) -> Cost:
    """One config's Cost on one context, interleaved with the uncompressed prefill and decoding."""
    from kvbench.bridge.adapter import clear_head_masks, masked_entries
    from kvbench.engine.steps import cache_entries, kv_counts

    length = input_ids.shape[1]
    runs = []
    for _ in range(plan.repeats):
        none_s, none_cache, none_last = prefill(model, input_ids)
        full_bytes = allocated_bytes(none_cache)  # before decoding appends to it
        none_rate = decode_rate(model, none_cache, none_last, length, plan.new_tokens)
        try:
            press_s, cache, last = prefill(model, input_ids, press)
            kept_bytes = allocated_bytes(cache)
            # Head-wise presses (AdaKV's, AnDPro) mask entries they keep allocated: held as the engine counts.
            accounted = kv_counts(model, length, cache_entries(cache, masked_entries(model)), press)
            rate = decode_rate(model, cache, last, length, plan.new_tokens)  # under the press's masks
        finally:
            clear_head_masks(model)  # they would mask the next uncompressed prefill and decoding
        runs.append((press_s, none_s, rate, none_rate))
    press_s, none_s = min(run[0] for run in runs), min(run[1] for run in runs)
    return Cost(
        config.press,
        config.ratio,
        config.memory,
        dict(config.press_args),
        length,
        device,
        press_s,
        none_s,
        press_s / none_s - 1,
        max(run[2] for run in runs),
        max(run[3] for run in runs),
        kept_bytes,
        full_bytes,
        accounted["kv_bytes"],
        accounted["kv_bytes_full"],
    )


def check_context(model_name: str, plan: SpeedPlan, limit: int | None) -> None:
    """BadInput when the longest length and its new tokens do not fit the model's context (`limit`, None:
    not known yet: checked again once the model loads)."""
    longest = max(plan.lengths) + plan.new_tokens
    if limit is not None and longest > limit:
        raise BadInput(
            f"--lengths {max(plan.lengths)} and {plan.new_tokens} new tokens exceed the {limit}-token "
            f"context of model {model_name!r}"
        )


def run_speed(plan: SpeedPlan, model_name: str, device: str = "cpu", dtype: str = "float32") -> list[Cost]:
    """Measure every (config, length) of `plan` not yet in its folder, appending each Cost to costs.jsonl as
    it is measured (a stopped run resumes where it stopped), and write a run record; all costs back."""
    from tqdm.auto import tqdm

    from kvbench.bridge.models import context_limit, load_model
    from kvbench.core.provenance import run_record
    from kvbench.harness.planning import check_configs, check_learned_state

    started = datetime.now(timezone.utc).isoformat()
    check_context(model_name, plan, context_limit(model_name))
    presses = check_configs(plan.configs, max(plan.lengths))
    check_learned_state(presses, model_name)
    todo = [
        (length, config, press)
        for length in plan.lengths
        for config, press in zip(plan.configs, presses, strict=True)
        if cost_key(config.press, config.ratio, config.memory, dict(config.press_args), length, device)
        not in plan.done
    ]
    costs = dict(plan.done)
    if todo:
        import torch

        model, _ = load_model(model_name, device=device, dtype=dtype)
        check_context(model_name, plan, model.config.get_text_config().max_position_embeddings)
        plan.out.mkdir(parents=True, exist_ok=True)
        inputs = {}
        with open(plan.out / COSTS_FILE, "a") as file:
            for length, config, press in tqdm(todo, desc="costs", unit="config"):
                if length not in inputs:
                    generator = torch.Generator().manual_seed(length)
                    ids = torch.randint(100, model.config.vocab_size, (1, length), generator=generator)
                    inputs[length] = ids.to(device)
                    prefill(model, inputs[length])  # warm-up
                cost = measure_cost(model, config, press, inputs[length], plan, device)
                file.write(json.dumps(asdict(cost)) + "\n")
                file.flush()
                costs[cost.key()] = cost
    config = {
        "model": model_name,
        "lengths": plan.lengths,
        "new_tokens": plan.new_tokens,
        "repeats": plan.repeats,
    }
    config["configs"] = [config_.as_record() for config_ in plan.configs]
    summary = {
        f"{c.press} {c.memory or c.ratio} @{c.tokens}": round(c.prefill_overhead, 4) for c in costs.values()
    }
    runs = plan.out / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    record = run_record(config, summary, device, started)
    (runs / f"speed-{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%S.%f')}.json").write_text(
        json.dumps(record, indent=1, default=str)
    )
    return list(costs.values())


def cost_table(costs: list[Cost]):
    """A frame of the costs, one row a press, budget and length, for the command's summary and reports."""
    import pandas as pd

    frame = pd.DataFrame([asdict(cost) for cost in costs])
    frame["budget"] = [
        f"memory {m}" if m is not None else f"ratio {r}"
        for m, r in zip(frame.memory, frame.ratio, strict=True)
    ]
    frame["prefill +%"] = 100 * frame.prefill_overhead
    frame["decode x"] = frame.decode_tokens_per_s / frame.decode_none_tokens_per_s
    frame["allocated MiB"] = frame.allocated_bytes / MIB
    frame["accounted MiB"] = frame.accounted_bytes / MIB
    columns = ["prefill +%", "decode_tokens_per_s", "decode x", "allocated MiB", "accounted MiB"]
    return frame.set_index(["press", "budget", "tokens", "device"])[columns].sort_index()
