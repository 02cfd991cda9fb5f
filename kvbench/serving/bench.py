"""`kvbench prefix-cache` as a library call: options checked (before torch is imported), then the trace made
or read, every policy replayed at every budget, and the rows, the summaries and the trace written to one
folder."""

import dataclasses
import json
from pathlib import Path

from kvbench.bridge.builtin import BUILTIN
from kvbench.bridge.models import EMBEDDED, model_config
from kvbench.core.errors import BadInput
from kvbench.core.validation import MIB, parse_float, parse_int

POLICY_NAMES = ("none", "prefix", "chunk", "pegasus")


def config_bytes_per_token(model: str) -> int | None:
    if model in BUILTIN:  # layers x (keys, values) x KV heads x head_dim x 2 bytes
        shape = BUILTIN[model]
        return shape.layers * 2 * shape.kv_heads * shape.head_dim * 2
    config = model_config(model)
    if not config:
        return None
    config = {**config, **(config.get("text_config") or {})}
    try:
        head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
        kv_heads = config.get("num_key_value_heads") or config["num_attention_heads"]
        return config["num_hidden_layers"] * 2 * kv_heads * head_dim * 2
    except (KeyError, TypeError, ZeroDivisionError):
        return None


def check_policies(text: str) -> list[str]:
    names = [name.strip() for name in str(text).split(",") if name.strip()]
    from kvbench.core.errors import did_you_mean

    if not names:
        raise BadInput("--policies is empty: choose from " + ", ".join(POLICY_NAMES))
    for name in names:
        if name not in POLICY_NAMES:
            raise BadInput(
                f"unknown policy {name!r}{did_you_mean(name, POLICY_NAMES)}"
                f" (known: {', '.join(POLICY_NAMES)})"
            )
    return list(dict.fromkeys(["none", *names]))


def check_budgets(text: str, block: int, bytes_per_token: int | None) -> list[int]:
    """Budgets in MiB (comma-separated) as bytes; each must hold at least one block of `block` tokens."""
    budgets = []
    for part in str(text).split(","):
        mib = parse_float(part.strip(), "a store budget (MiB)", 0, low_open=True)
        budget = int(mib * MIB)
        if bytes_per_token is not None and budget < block * bytes_per_token:
            raise BadInput(
                f"store budget {mib:g} MiB is below one block ({block} tokens = "
                f"{block * bytes_per_token / MIB:.3g} MiB for this model)"
            )
        budgets.append(budget)
    return budgets


def check_compression(press: str, ratio, press_args: dict):
    """The press that compresses the stored entries (None for `none`), checked without torch: a known press
    of the registry that evicts (not a codec), a ratio in [0, 1)."""
    from kvbench.presses import resolve, resolve_press

    press = resolve_press(press)  # a registered name, or a user's press given by its target
    if press == "none":
        if ratio is not None or press_args:
            raise BadInput("--ratio and --press-arg need --press (the press that compresses stored entries)")
        return None
    resolved = resolve(press, press_args)  # the press, resolved once
    resolved.check_runnable()
    if resolved.spec.codec:
        raise BadInput(
            f"press {press!r} is a codec: its groups (32 tokens for quant) are longer than a store entry (a "
            "16-token block), so it cannot meet a budget entry by entry; choose an evicting press"
        )
    if ratio is None:
        raise BadInput(f"--press {press} needs --ratio (the fraction of each entry's KV entries removed)")
    ratio = parse_float(ratio, "--ratio", 0, 1, high_open=True)
    from kvbench.serving.replay import Compression  # torch's import: after every check

    return Compression(press, ratio, tuple(sorted(press_args.items())))


def check_press_kind(compression) -> None:
    """Refuse, before the model loads, press arguments the press does not take and a press that cannot
    compress an entry on its own: one that changes the forward, masks heads or compresses while decoding
    (only presses that compress in kvpress's hook can)."""
    from kvbench.bridge.adapter import is_shareable

    if not is_shareable(compression.build()):
        raise BadInput(
            f"press {compression.press!r} cannot compress a store entry on its own: it changes the forward, "
            "masks heads or compresses while decoding; choose a press that scores in kvpress's hook "
            "(knorm, snapkv, tova, kvp, ...)"
        )


def check_press_window(compression, shortest_entry: int) -> None:
    """Refuse, before any work, a press that scores with a window of last queries as long as the shortest
    entry it would compress (SnapKV asserts it has more)."""
    from kvpress import SnapKVPress

    from kvbench.engine.steps import pressed_tree

    windows = [p.window_size for p in pressed_tree(compression.build()) if isinstance(p, SnapKVPress)]
    if windows and max(windows) >= shortest_entry:
        raise BadInput(
            f"press {compression.press!r} scores with its last {max(windows)} queries, but the shortest "
            f"store entry holds {shortest_entry} tokens: give --press-arg window_size=N with N below "
            f"{shortest_entry}"
        )


def check_out(out: Path) -> Path:
    """`out`, refused if it holds a run already or cannot be written (a file, a dangling link or a loop of
    links on the way, a read-only folder): found out before the replay, not after it."""
    from kvbench.store.results import check_folder_writable

    out = Path(out)
    if (out / "summary.json").exists():
        raise BadInput(f"{out} already holds a prefix-cache run (summary.json); choose another --out")
    if out.exists() and not out.is_dir():
        raise BadInput(f"--out {out} is a file, not a folder")
    check_folder_writable(out, "--out folder")
    return out


def run(
    out,
    trace_path=None,
    trace_options: dict | None = None,
    policies: str = "none,prefix,chunk,pegasus",
    budgets: str = "4",
    block: int = 16,
    transition_tol: float = 0.05,
    answer_tokens: int = 4,
    press: str = "none",
    ratio=None,
    press_args: dict | None = None,
    model: str = EMBEDDED,
    device: str = "cpu",
    dtype: str = "float32",
    threads: int | None = None,
) -> list[dict]:
    """Check everything, replay, write `out`/{trace.jsonl, requests.jsonl, summary.json}; the summaries
    (`kvbench.reporting.prefix_cache` renders summary.md and the plots from them)."""
    from kvbench.serving import trace as traces

    out = check_out(out)
    names = check_policies(policies)
    block = parse_int(block, "--block", 1)
    tol = parse_float(transition_tol, "--transition-tol", 0)
    answer_tokens = parse_int(answer_tokens, "--answer-tokens", 0)
    budget_bytes = check_budgets(budgets, block, config_bytes_per_token(model))
    trace = traces.read_trace(Path(trace_path)) if trace_path else traces.make_trace(**(trace_options or {}))
    compression = check_compression(press, ratio, press_args or {})  # a press imports torch: checked last

    from datetime import datetime, timezone

    import torch

    from kvbench.bridge.models import check_device, load_model
    from kvbench.core.provenance import run_record
    from kvbench.serving.replay import Settings, bytes_per_token, run_policies

    started = datetime.now(timezone.utc).isoformat()
    if compression:
        check_press_kind(compression)
    check_device(device)
    if threads:
        torch.set_num_threads(threads)
    loaded, tokenizer = load_model(model, device, dtype)
    check_budgets(budgets, block, bytes_per_token(loaded))  # a model whose config was not at hand
    if compression:
        check_press_window(compression, shortest_entry(tokenizer, trace, names, block))
    settings = Settings(block=block, transition_tol=tol, answer_tokens=answer_tokens)
    rows, summaries, sparsity = run_policies(
        loaded, tokenizer, trace, names, budget_bytes, settings, compression
    )
    out.mkdir(parents=True, exist_ok=True)
    traces.write_trace(trace, out / "trace.jsonl")
    (out / "requests.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = {"model": model, "dtype": dtype, "policies": names, "budgets": budget_bytes}
    config["compression"] = dataclasses.asdict(compression) if compression else None
    config |= {
        "block": block,
        "transition_tol": tol,
        "answer_tokens": answer_tokens,
        "trace": str(trace_path),
    }
    summary = {"bytes_per_token": bytes_per_token(loaded), "transition_kept_per_layer": sparsity}
    record = run_record(config, summary | {"policies": summaries}, device, started)
    (out / "summary.json").write_text(json.dumps(record, indent=1) + "\n")
    return summaries


def shortest_entry(tokenizer, trace, policies: list[str], block: int) -> int:
    """Tokens of the shortest entry a policy stores: a block (prefix), a chunk (chunk, pegasus)."""
    lengths = [block] if "prefix" in policies else []
    if {"chunk", "pegasus"} & set(policies):
        lengths += [
            len(tokenizer(text, add_special_tokens=False)["input_ids"]) for text in trace.chunks.values()
        ]
    return min(lengths, default=block)
