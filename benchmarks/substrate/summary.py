"""Summary of the substrate study's rows (benchmarks.substrate.study): per (model, method, keep), the
mean over seeds and a Student-t 95 % interval (scipy.stats.t, n - 1 degrees of freedom) of the perplexity and
of the perplexity change against the model's own no-eviction reference (paired within a seed: the same trained
model, the same windows). Writes summary.csv, summary.md (the tables the study page quotes) and
substrate.png (change against keep fraction, one panel per model)."""

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import annotated_types

from kvbench.core.errors import DataFileError
from kvbench.core.validation import (
    STRICT,
    Int64,
    NonNegative,
    Positive,
    PositiveReal,
    check_json,
    jsonl_lines,
    parse_json,
)

MODEL_ORDER = [
    f"{a}-{g}-{r}" for a in ("softmax", "sigmoid") for g in ("gate", "nogate") for r in ("rope", "nope")
]
METHOD_ORDER = ["gate", "h2o", "keydiff", "window"]


def t_interval(values: list[float]) -> tuple[float, float]:
    """(mean, 95 % half-width); the half-width is nan for a single value."""
    from scipy import stats

    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, float("nan")
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n)


@dataclass
class ModelSize:
    __pydantic_config__ = STRICT
    n_layer: Positive
    d_model: Positive
    n_head: Positive
    context: Positive


@dataclass
class Steps:
    __pydantic_config__ = STRICT
    steps: Positive


@dataclass
class StudyRow:
    """One line of a substrate study's rows.jsonl, its schema (checked wherever the file is read: resume,
    merge, summary); the fields the summary and the resume use."""

    __pydantic_config__ = STRICT
    model: str
    seed: Int64
    method: str
    keep: Annotated[float, annotated_types.Interval(gt=0, le=1)]
    ppl: PositiveReal
    ppl_late: PositiveReal
    train_s: NonNegative
    gate_mean_last20: float | None
    config: ModelSize
    settings: Steps


def load(rows_path: Path) -> list[dict]:
    """The rows of `rows_path`, each checked against StudyRow: DataFileError with one line (file, line,
    field) for a damaged one, and for a file without rows."""
    rows = []
    for number, line in enumerate(jsonl_lines(rows_path.read_text(encoding="utf-8")), 1):
        if line.strip():
            check_json(StudyRow, line, f"{rows_path} line {number}", DataFileError)
            rows.append(parse_json(line))
    if not rows:
        raise DataFileError(f"{rows_path}: no rows")
    if not any(r["method"] == "none" for r in rows):
        raise DataFileError(f"{rows_path}: no full-cache ('none') row to compare against")
    return rows


def aggregate(rows: list[dict]) -> list[dict]:
    ref = {(r["model"], r["seed"]): r for r in rows if r["method"] == "none"}
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["model"], r["method"], r["keep"]), []).append(r)
    out = []
    for (model, method, keep), rs in groups.items():
        ppl = t_interval([r["ppl"] for r in rs])
        change = t_interval([100 * (r["ppl"] / ref[(model, r["seed"])]["ppl"] - 1) for r in rs])
        change_late = t_interval(
            [100 * (r["ppl_late"] / ref[(model, r["seed"])]["ppl_late"] - 1) for r in rs]
        )
        gates = [r["gate_mean_last20"] for r in rs if r["gate_mean_last20"] is not None]
        out.append(
            {
                "model": model,
                "method": method,
                "keep": keep,
                "seeds": len(rs),
                "ppl": ppl[0],
                "ppl_hw": ppl[1],
                "change_pct": change[0],
                "change_pct_hw": change[1],
                "change_late_pct": change_late[0],
                "change_late_pct_hw": change_late[1],
                "train_s": sum(r["train_s"] for r in rs) / len(rs),
                "gate_mean": sum(gates) / len(gates) if gates else None,
            }
        )
    key = {m: i for i, m in enumerate(MODEL_ORDER)}
    mkey = {m: i for i, m in enumerate(["none", *METHOD_ORDER])}
    out.sort(key=lambda a: (key.get(a["model"], 99), -a["keep"], mkey.get(a["method"], 99)))
    return out


def fmt(mean: float, hw: float, digits: int = 1) -> str:
    if math.isnan(hw):
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {hw:.{digits}f}"


def scale(rows: list[dict]) -> str:
    """The models' size and training, as the rows record them (joined by "; " where a study mixes sizes)."""
    sizes = sorted(
        {
            f"{r['config']['n_layer']} layers, d = {r['config']['d_model']}, {r['config']['n_head']} heads, "
            f"context {r['config']['context']}, {r['settings']['steps']} steps"
            for r in rows
        }
    )
    return "; ".join(sizes)


def markdown(agg: list[dict], size: str) -> str:
    by = {(a["model"], a["method"], a["keep"]): a for a in agg}
    models = [m for m in MODEL_ORDER if (m, "none", 1.0) in by]
    keeps = sorted({a["keep"] for a in agg if a["method"] != "none"}, reverse=True)
    lines = [
        f"Models: {size}.",
        "",
        "Perplexity with the full cache (mean ± 95 % t half-width over seeds), and the change in perplexity "
        "(%) under live-cache eviction against the same model's full cache, paired per seed:",
        "",
        "| model | seeds | gate mean | full-cache ppl | keep | " + " | ".join(METHOD_ORDER) + " |",
        "|---|---|---|---|---|" + "---|" * len(METHOD_ORDER),
    ]
    for m in models:
        ref = by[(m, "none", 1.0)]
        for i, k in enumerate(keeps):
            cells = []
            for meth in METHOD_ORDER:
                a = by.get((m, meth, k))
                cells.append(fmt(a["change_pct"], a["change_pct_hw"]) if a else "-")
            head = (
                f"{m} | {ref['seeds']} | {ref['gate_mean']:.2f} | {fmt(ref['ppl'], ref['ppl_hw'], 2)}"
                if ref["gate_mean"] is not None
                else f"{m} | {ref['seeds']} | - | {fmt(ref['ppl'], ref['ppl_hw'], 2)}"
            )
            if i:
                head = " | | | "
            lines.append(f"| {head} | {k} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(agg: list[dict], path: Path, size: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # One colour per method in every panel: ungated models have no gate curve, and the default colour
    # cycle would shift the others' colours there.
    colour = {m: f"C{i}" for i, m in enumerate(METHOD_ORDER)}
    fig, axes = plt.subplots(2, 4, figsize=(16, 7), sharey=True)
    for ax, model in zip(axes.flat, MODEL_ORDER, strict=True):
        for meth in METHOD_ORDER:
            pts = sorted(
                (a["keep"], a["change_pct"], a["change_pct_hw"])
                for a in agg
                if (a["model"], a["method"]) == (model, meth)
            )
            if not pts:
                continue
            xs, ys, hw = zip(*pts, strict=True)
            ax.errorbar(
                xs,
                ys,
                yerr=[0 if math.isnan(h) else h for h in hw],
                marker="o",
                capsize=3,
                label=meth,
                color=colour[meth],
            )
        ax.set_title(model)
        ax.set_xscale("log")
        ax.set_xticks([0.1, 0.25, 0.5], ["0.1", "0.25", "0.5"])
        ax.minorticks_off()
        ax.axhline(0, color="grey", lw=0.5)
        ax.set_xlabel("keep fraction")
    axes[0, 0].set_ylabel("perplexity change vs own full cache (%)")
    axes[1, 0].set_ylabel("perplexity change vs own full cache (%)")
    # The legend from the first panel that has curves (a partial study may lack the first model).
    drawn = next((ax for ax in axes.flat if ax.get_legend_handles_labels()[0]), axes[0, 0])
    drawn.legend()
    fig.suptitle(
        "Substrate study: live-cache eviction on tiny byte-level models (mean, 95 % t-interval over seeds)\n"
        + size
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_summary(rows_path: Path, out: Path) -> None:
    rows = load(rows_path)
    agg = aggregate(rows)
    size = scale(rows)
    out.mkdir(parents=True, exist_ok=True)
    cols = list(agg[0])
    with (out / "summary.csv").open("w") as f:
        f.write(",".join(cols) + "\n")
        for a in agg:
            f.write(",".join("" if a[c] is None else str(a[c]) for c in cols) + "\n")
    (out / "summary.md").write_text(markdown(agg, size))
    plot(agg, out / "substrate.png", size)
