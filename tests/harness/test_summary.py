"""The summary `kvbench run`/`sweep` print and record: one labelled column per setting (ratio, memory,
budget), `none` first, then the presses as run, least compressed first."""

import pandas as pd

from kvbench.harness.runner import config_key, summarize


def frame(configs: list[tuple], tasks=("niah_single_1", "qa_1")) -> pd.DataFrame:
    """Rows of (press, ratio, memory, budget) configs, each task scored 10 x its position in the list."""
    return pd.DataFrame(
        [
            {"press": p, "ratio": r, "memory": m, "budget": b, "task": task, "score": 10.0 * i}
            for i, (p, r, m, b) in enumerate(configs)
            for task in tasks
        ]
    )


def test_a_memory_sweep_labels_ratio_and_memory_and_puts_none_first():
    table = summarize(
        frame(
            [
                ("quant", 0.0, 0.25, None),
                ("knorm", 0.75, 0.25, None),
                ("none", 0.0, None, None),
                ("quant", 0.0, 0.5, None),
                ("knorm", 0.5, 0.5, None),
            ]
        )
    )
    assert list(table.index.names) == ["press", "ratio", "memory"]
    assert list(table.index) == [
        ("none", "0.0", "-"),
        ("quant", "0.0", "0.5"),
        ("quant", "0.0", "0.25"),
        ("knorm", "0.5", "0.5"),
        ("knorm", "0.75", "0.25"),
    ]
    assert list(table.columns) == ["niah_single_1", "qa_1", "average"]
    assert table.loc[("knorm", "0.75", "0.25"), "average"] == 10.0  # the row of that config, not another's
    assert table.loc[("none", "0.0", "-"), "qa_1"] == 20.0
    keys = [config_key(dict(zip(table.index.names, key, strict=True))) for key in table.index]
    assert keys == [
        "none@0.0",
        "quant@memory=0.5",
        "quant@memory=0.25",
        "knorm@memory=0.5",
        "knorm@memory=0.25",
    ]


def test_a_ratio_sweep_has_a_ratio_column_only_and_budgets_are_whole_numbers():
    table = summarize(
        frame([("snapkv", 0.75, None, None), ("snapkv", 0.25, None, None), ("none", 0.0, None, None)])
    )
    assert list(table.index.names) == ["press", "ratio"]
    assert list(table.index) == [("none", "0.0"), ("snapkv", "0.25"), ("snapkv", "0.75")]
    budgets = summarize(frame([("kvp", 0.0, None, 128.0), ("none", 0.0, None, None)]))
    assert list(budgets.index) == [("none", "0.0", "-"), ("kvp", "0.0", "128")]
    assert config_key(dict(zip(budgets.index.names, budgets.index[1], strict=True))) == "kvp@budget=128"
