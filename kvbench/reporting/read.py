"""Reading results folders for a report: rows into one frame (report columns, learned-press states, only
the asked presses), their run records, and the labels configs and protocols get.
"""

import re
import warnings
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd

from kvbench.core.config import DEFAULT_PROTOCOL
from kvbench.core.errors import BadInput, NoResults
from kvbench.reporting.stats import SCORE_RANGE
from kvbench.store.results import check_results_path, load_rows, load_runs, results_files

REFERENCE_PRESS = "none"  # ratio 0.0: the no-compression reference


@dataclass
class Run:
    """One invocation recorded in `runs/*.json` of a results folder."""

    results_dir: str  # the folder, as the rows' `source` column names it
    command: str
    config: dict
    versions: dict
    hardware: dict  # machine, cpus and, on CUDA, gpu: what the timings ran on
    git_commit: str
    started: str
    finished: str  # "" while the run goes on, or when it was interrupted


def config_label(press: str, press_args: dict | None) -> str:
    """The press name, plus its arguments when any: two configs of one press stay apart."""
    if not press_args:
        return press
    args = ", ".join(f"{key}={value}" for key, value in sorted(press_args.items()))
    return f"{press}({args})"


def protocol_label(protocol: str | None, protocol_args: dict | None) -> str:
    """The protocol, plus its arguments when any; rows written before protocols were recorded are
    query-agnostic."""
    protocol = protocol if isinstance(protocol, str) and protocol else DEFAULT_PROTOCOL
    if not isinstance(protocol_args, dict) or not protocol_args:
        return protocol
    return f"{protocol} ({', '.join(f'{key}={value}' for key, value in sorted(protocol_args.items()))})"


def result_files(paths: list[Path], recursive: bool = False) -> list[Path]:
    """The rows.jsonl of each given folder (and of every folder below it when `recursive`); a path without any
    is bad input."""
    files = []
    for path in paths:
        check_results_path(path)
        found = results_files([path], recursive=recursive)
        if not found:
            nested = results_files([path], recursive=True)
            if nested:
                raise NoResults(
                    f"{path} holds no rows.jsonl itself; {len(nested)} folder(s) below it do "
                    f"(e.g. {nested[0].parent}): pass --recursive to read them"
                )
            raise NoResults(f"{path} holds no results (no rows.jsonl in it or below it)")
        files += [file for file in found if file not in files]
    return files


def read_runs(rows_file: Path) -> list[Run]:
    """The run records next to one rows.jsonl."""
    return [
        Run(
            results_dir=str(rows_file.parent),
            command=record.get("command") or "",
            config=record.get("config") or {},
            versions=record.get("versions") or {},
            hardware=record.get("hardware") or {},
            git_commit=record.get("git_commit") or "unknown",
            started=record.get("started") or "",
            finished=record.get("finished") or "",
        )
        for record in load_runs([rows_file])
    ]


# Bytes of one element in each compute dtype a run may record: rows written before `kv_bytes` counted the
# cache in the compute dtype (`kv_bytes_kept`), which the report converts to the 16-bit store of `kv_bytes`.
DTYPE_BYTES = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2}
PART_KEYS = ("question", "turn")  # meta keys of the protocols that ask one context several questions


def compute_dtypes(runs: list[Run] | tuple) -> dict[tuple[str, str], str]:
    """(results folder, model) -> the compute dtype its runs record, where they all record the same one."""
    dtypes: dict[tuple[str, str], set] = {}
    for run in runs:
        key = (run.results_dir, run.config.get("model"))
        dtypes.setdefault(key, set()).add(run.config.get("dtype"))
    return {key: found.pop() for key, found in dtypes.items() if len(found) == 1 and None not in found}


def sixteen_bit_bytes(rows: pd.DataFrame, runs: list[Run] | tuple) -> pd.Series:
    """KV bytes kept per row, as a 16-bit store holds them: `kv_bytes` where the row records it; for older
    rows, their `kv_bytes_kept` (the tensors in the compute dtype the row's runs record) scaled to 16 bits;
    NaN where neither is known. Without this, a table would put a float32 row at twice the bytes of a newer
    row that kept as many entries (the reference report did: 29.1 vs 14.5 MiB at 75 % kept)."""
    dtypes = compute_dtypes(runs)
    element = [
        DTYPE_BYTES.get(dtypes.get((source, model)), float("nan"))
        for source, model in zip(rows["source"], rows["model"], strict=True)
    ]
    legacy = rows["kv_bytes_kept"] * 2 / pd.Series(element, index=rows.index, dtype=float)
    return rows["kv_bytes"].fillna(legacy)


def context_units(rows: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """Per row: the independent unit its score belongs to, and its question or turn (NaN for others). The
    questions or turns of one context share that context's cache, so they are one unit, the context (meta
    "context", as the runner records it); every other row is its own unit (its sample)."""
    metas = rows["meta"] if "meta" in rows else pd.Series([None] * len(rows), index=rows.index)
    metas = [meta if isinstance(meta, dict) else {} for meta in metas]
    parts = [next((meta[key] for key in PART_KEYS if key in meta), None) for meta in metas]
    units = [
        str(meta.get("context", sample)) if part is not None else str(sample)
        for sample, meta, part in zip(rows["sample_id"], metas, parts, strict=True)
    ]
    return pd.Series(units, index=rows.index), pd.to_numeric(pd.Series(parts, index=rows.index))


def with_report_columns(rows: pd.DataFrame, runs: list[Run] | tuple = ()) -> pd.DataFrame:
    """The rows with the fields older rows lack filled in, and the columns the report reads: protocol_label,
    memory (the memory budget asked, NaN otherwise), budget (the entries per head asked, NaN otherwise),
    kept_fraction, memory_ratio (kv_bytes / kv_bytes_full, or kv_kept / kv_total without bytes),
    kept_bytes (`sixteen_bit_bytes`), unit and part (`context_units`)."""
    rows = rows.copy()
    missing = pd.Series([None] * len(rows), index=rows.index, dtype=object)
    protocol, args = rows.get("protocol", missing), rows.get("protocol_args", missing)
    rows["protocol"] = [p if isinstance(p, str) and p else DEFAULT_PROTOCOL for p in protocol]
    rows["protocol_label"] = [protocol_label(p, a) for p, a in zip(protocol, args, strict=True)]
    for column in ("memory", "budget", "kv_bytes", "kv_bytes_full", "kv_bytes_kept"):
        rows[column] = pd.to_numeric(rows.get(column, missing), errors="coerce")
    rows["kept_fraction"] = rows["kv_kept"] / rows["kv_total"]
    rows["memory_ratio"] = (rows["kv_bytes"] / rows["kv_bytes_full"]).fillna(rows["kept_fraction"])
    rows["kept_bytes"] = sixteen_bit_bytes(rows, runs)
    rows["unit"], rows["part"] = context_units(rows)
    return rows


@dataclass
class Collected:
    """What a report reads: the rows under the given paths, their runs, and notes for the reader."""

    dirs: list[str]
    rows: pd.DataFrame
    runs: list[Run]
    notes: list[str]  # said at the top of the report: mixed models, skipped lines


def keep_latest_press_state(rows: pd.DataFrame, every_state: bool = False) -> tuple[pd.DataFrame, list[str]]:
    """Keep, for each model and press, the rows of the learned state (e.g. KVP agents) written last.

    Rows scored with older agents are other results; averaging them with the new ones would describe no
    agents at all. The reader is told what was set aside. With `every_state` they are kept instead, as a
    press of their own named PRESS@STATE, so agents before and after a retrain compare paired.
    """
    if "press_state" not in rows:
        return rows, []
    state = rows["press_state"].fillna("unrecorded")
    latest = state.groupby([rows["model"], rows["press"]]).transform("last")
    older = state != latest
    sources = rows["press_source"] if "press_source" in rows else pd.Series(None, index=rows.index)
    notes = [
        f"{press} on {model}: rows of {group.nunique()} versions of its {state_kind(sources[group.index])}; "
        f"the report uses the latest ({latest[group.index[0]]}) and "
        + (
            f"reports the older ones as {press}@STATE."
            if every_state
            else f"sets aside {int(older[group.index].sum())} rows of older ones."
        )
        for (model, press), group in state.groupby([rows["model"], rows["press"]])
        if group.nunique() > 1
    ]
    if every_state:
        rows = rows.copy()
        rows.loc[older, "press"] = rows.loc[older, "press"] + "@" + state[older]
        return rows, notes
    return rows[~older].reset_index(drop=True), notes


def state_kind(sources: pd.Series) -> str:
    """What a press's state digest is a digest of: a user's press is keyed by its source file (and any
    learned state it loads), kvbench's learned presses by their learned state."""
    files = sorted({source["file"] for source in sources if isinstance(source, dict) and source.get("file")})
    return f"source ({', '.join(files)})" if files else "learned state"


# Past this NLL per token, a perplexity (exp(nll)) overflows a float: no measurement of a language model.
MAX_NLL = 700.0


def off_scale(rows: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """The rows without those whose value the report cannot place, and a line per results folder saying
    what was set aside: a score outside [0, 100] (the scale of every table, interval and plot; a row
    schema allows any finite score, for lm-eval metrics that are not on it), an NLL whose perplexity
    overflows. Not a file's corruption: the lines stay as they are, the report leaves them out."""
    score, nll = pd.to_numeric(rows["score"]), pd.to_numeric(rows["nll"])
    low, high = SCORE_RANGE
    reasons = {
        f"a score outside [{low:g}, {high:g}]": score.notna() & ~score.between(low, high),
        f"an NLL above {MAX_NLL:g} (a perplexity beyond a float)": nll.notna() & (nll > MAX_NLL),
    }
    dropped = pd.Series(False, index=rows.index)
    notes = []
    for reason, bad in reasons.items():
        for source, group in rows[bad & ~dropped].groupby("source", sort=True):
            first = group.iloc[0]
            value = first["score"] if "score" in reason else first["nll"]
            count = f"{len(group)} row{'s' if len(group) > 1 else ''}"
            notes.append(
                f"{source}: set aside {count} with {reason}, which the report cannot place "
                f"(first: task {first['task']}, sample {first['sample_id']}: {value:g})"
            )
        dropped |= bad
    return rows[~dropped].reset_index(drop=True), notes


def collect(paths: list[Path], recursive: bool = False, every_state: bool = False) -> Collected:
    files = result_files([Path(p) for p in paths], recursive)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rows = load_rows(files)
        runs = [run for file in files for run in read_runs(file)]
    # results.read_rows already says once per file what it skipped; each message once.
    summary = list(dict.fromkeys(str(w.message) for w in caught))
    rows, set_aside = off_scale(rows)
    summary += set_aside
    for message in summary:  # recorded for the report, still shown to the user
        warnings.warn(message, stacklevel=2)
    if rows.empty:
        raise NoResults(f"no result rows in {', '.join(str(file) for file in files)}")
    rows["press_name"] = rows["press"]  # as the run was given it: `report --versus NAME` takes it too
    rows["press"] = [config_label(p, a) for p, a in zip(rows["press"], rows["press_args"], strict=True)]
    rows, notes = keep_latest_press_state(rows, every_state)
    models = sorted(rows["model"].unique())
    if len(models) > 1:
        notes.append(
            f"Warning: these results hold {len(models)} models ({', '.join(models)}); "
            "each gets its own leaderboard, scores are never averaged across models."
        )
    notes += [f"Skipped while reading: {message}" for message in summary]
    return Collected([str(file.parent) for file in files], rows, runs, notes)


def split_press_labels(text: str) -> list[str]:
    """`a,b(x=1, y=2),c` -> ["a", "b(x=1, y=2)", "c"]: commas inside a label's parentheses stay."""
    return [label.strip() for label in re.split(r",(?![^()]*\))", text) if label.strip()]


def press_list(text: str) -> list[str]:
    """The presses `--presses` names (`split_press_labels`); BadInput when it names none (`''`, `','`)."""
    presses = split_press_labels(text)
    if not presses:
        raise BadInput("--presses names no press")
    return presses


def press_labels(rows: pd.DataFrame, name: str) -> list[str]:
    """The presses (as the leaderboard labels them) that `name` names in `rows`: the label itself, else
    every label of the press the run was given as `name` (`outlier8` for `outlier8(window=8)`); none when
    it names none."""
    held = set(rows["press"])
    if name in held:
        return [name]
    names = rows["press_name"] if "press_name" in rows else rows["press"]
    return sorted(set(rows.loc[names == name, "press"]))


def held_presses(rows: pd.DataFrame) -> str:
    return ", ".join(sorted(set(rows["press"]) - {REFERENCE_PRESS}))


def only_presses(collected: Collected, presses: list[str]) -> Collected:
    """`collected` with the rows of `presses` (as the leaderboard names them, or as the run was given them:
    `press_labels`) and the reference only."""
    chosen = []
    for press in presses:
        labels = press_labels(collected.rows, press)
        if not labels:
            held = held_presses(collected.rows)
            raise BadInput(f"--presses {press!r} is not a press of these results (they hold {held})")
        chosen += labels
    rows = collected.rows[collected.rows["press"].isin([*chosen, REFERENCE_PRESS])]
    return replace(collected, rows=rows.reset_index(drop=True))


def versus_press(rows: pd.DataFrame, name: str) -> str:
    """The one press (as the leaderboard labels it) that `report --versus NAME` names (`press_labels`);
    BadInput when it names none, the reference, or several (then the labels to choose from)."""
    labels = [label for label in press_labels(rows, name) if label != REFERENCE_PRESS]
    if not labels:
        raise BadInput(f"--versus {name!r} is not a press of these results (they hold {held_presses(rows)})")
    if len(labels) > 1:
        raise BadInput(f"--versus {name!r} names {len(labels)} presses: give one of {', '.join(labels)}")
    return labels[0]
