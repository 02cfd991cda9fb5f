"""benchmarks/protocol_order.py (docs/studies/decode-heavy.md's rule): a pair is shown apart only when
every paired sample agrees in sign (6 pairs), a swap needs both protocols to show it, and the cost of a
protocol is paired on the same samples."""

import importlib.util
from pathlib import Path

import pandas as pd

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "protocol_order.py"


def script():
    spec = importlib.util.spec_from_file_location("protocol_order", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rows(scores: dict[tuple[str, str], list[float]]) -> pd.DataFrame:
    """Rows at ratio 0.5 of one task: (protocol, press) -> a score per sample."""
    return pd.DataFrame(
        [
            {"ratio": 0.5, "protocol": protocol, "press": press, "task": "t", "sample_id": str(i), "score": s}
            for (protocol, press), values in scores.items()
            for i, s in enumerate(values)
        ]
    )


def test_a_swap_needs_both_protocols_to_show_it():
    order = script()
    up, down = [60, 61, 62, 63, 64, 65], [50, 50, 50, 50, 50, 50]
    swapped = rows({("dt", "a"): up, ("dt", "b"): down, ("qa", "a"): down, ("qa", "b"): up})
    lines, swaps = order.order_table(order.scores_by_sample(swapped), 0.5, ["dt", "qa"])
    assert swaps == ["ratio 0.5: a / b"]
    assert any("dt: a above b by 12.5 (p = 0.031)" in line for line in lines)
    mixed = [60, 40, 62, 63, 64, 65]  # one sample the other way: not shown under qa
    unshown = rows({("dt", "a"): up, ("dt", "b"): down, ("qa", "a"): [50] * 6, ("qa", "b"): mixed})
    lines, swaps = order.order_table(order.scores_by_sample(unshown), 0.5, ["dt", "qa"])
    assert swaps == [] and not any(line.startswith("  qa:") for line in lines)


def test_the_cost_of_a_protocol_is_paired_on_the_same_samples():
    order = script()
    table = order.scores_by_sample(
        rows({("dt", "a"): [10, 20, 30, 40, 50, 60], ("qa", "a"): [12, 22, 32, 42, 52, 62]})
    )
    (line,) = order.protocol_cost(table, ["dt", "qa"])
    assert "dt - qa = -2.0 (p = 0.031)" in line


def test_a_press_under_one_protocol_only_is_left_out(tmp_path):
    order = script()
    up, down = [60, 61, 62, 63, 64, 65], [50] * 6
    rows_ = rows({("dt", "a"): up, ("dt", "b"): down, ("qa", "a"): down, ("qa", "b"): up, ("dt", "c"): up})
    lines, swaps = order.order_table(order.scores_by_sample(rows_), 0.5, ["dt", "qa"])
    assert swaps == ["ratio 0.5: a / b"] and not any(" c " in line for line in lines[1:])


def test_bad_arguments_are_one_line_and_exit_2(tmp_path):
    import subprocess
    import sys

    for args, said in (
        ([str(tmp_path / "nope")], "is not a results folder"),
        ([str(tmp_path), "--protocols", "decode-time"], "takes two protocols"),
    ):
        done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True)
        assert done.returncode == 2 and said in done.stderr and "Traceback" not in done.stderr
