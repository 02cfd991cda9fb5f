"""QEvict's budget under the authors' accounting (their allocator's arithmetic, for rows set beside the
paper's nominal budgets) and under kvbench's bytes (the default)."""

from types import SimpleNamespace

import pytest
import torch

from kvbench.core.errors import BadInput
from kvbench.presses import build_press
from kvbench.presses.qevict import TIER_FLAG_BYTES, QEvictPress, int4_window_bytes

LAYER = SimpleNamespace(layer_idx=0)
HEADS, DIM, LENGTH, WINDOW, SINKS = 2, 64, 600, 8, 4


def authors_allocation(prompt: int, max_new: int, r_percent: int, p_percent=50, q_percent=10):
    """The authors' budget (R_RATIO, P_RATIO, Q_RATIO in integer percents), written from their allocator:
    (local tokens, 16-bit windows, int4 windows)."""
    total = (prompt + max_new) * r_percent // 100
    remaining = max(0, total - SINKS)
    local = min(total * p_percent // 100, remaining)
    remaining -= local
    sixteen_bit = remaining * (100 - q_percent) // 100
    int4 = (remaining - sixteen_bit) * 4  # int4 tokens at a quarter of a 16-bit token; scales not counted
    return local, -(-sixteen_bit // WINDOW), -(-int4 // WINDOW)  # whole windows, rounded up


def compressed(press: QEvictPress):
    torch.manual_seed(0)
    keys, values = torch.randn(1, HEADS, LENGTH, DIM), torch.randn(1, HEADS, LENGTH, DIM)
    attention = torch.rand(1, HEADS * 2, LENGTH, LENGTH).tril()
    kept, _ = press.compress(LAYER, None, keys, values, attention, {})
    state = press.states[0]
    int4_windows = int(state.quantised[0].sum()) // WINDOW
    windows = (kept.shape[2] - SINKS - (LENGTH - state.local_start)) // WINDOW
    return LENGTH - state.local_start, windows - int4_windows, int4_windows


@pytest.mark.parametrize("r_percent, max_new", [(20, 512), (30, 100), (50, 0)])
def test_the_authors_accounting_tiers_as_their_allocator_says(r_percent, max_new):
    press = QEvictPress(memory=r_percent / 100, accounting="authors", max_new_tokens=max_new)
    local_zone, sixteen_bit, int4 = compressed(press)
    local, expected_sixteen_bit, expected_int4 = authors_allocation(LENGTH, max_new, r_percent)
    assert (sixteen_bit, int4) == (expected_sixteen_bit, expected_int4)
    assert local - WINDOW < local_zone <= local  # from the first window boundary that leaves at most that
    # kvbench's bytes at the same memory buy other tiers: int4 windows cost 1/3.04 of 16 bits, not 1/4, and
    # the budget is a share of the prompt alone.
    assert compressed(QEvictPress(memory=r_percent / 100))[1:] != (sixteen_bit, int4)
    assert press.layer_bytes[0] > 0  # rows still record the real bytes stored


def test_the_authors_cap_is_fixed_at_the_first_call_whatever_the_decoding_target():
    fixed = compressed(QEvictPress(memory=0.2, accounting="authors"))
    targeted = QEvictPress(memory=0.2, accounting="authors", compression_ratio=0.9)
    assert compressed(targeted) == fixed
    # kvbench's bytes follow DecodingPress's target instead.
    assert compressed(QEvictPress(memory=0.2, compression_ratio=0.9)) != compressed(QEvictPress(memory=0.2))


def test_an_int4_window_at_head_dim_64_costs_a_3_04th_of_16_bits_in_kvbenchs_layout():
    sixteen_bit = WINDOW * 2 * 64 * 2  # keys and values, 2 bytes a number
    int4 = int4_window_bytes(WINDOW, 64) + TIER_FLAG_BYTES  # codes, key and value scales/zeros, tier byte
    assert (sixteen_bit, int4) == (2048, 673) and round(sixteen_bit / int4, 2) == 3.04


def test_accounting_is_a_press_argument_checked_in_one_line():
    assert build_press("qevict", 0.0, memory=0.2, accounting="authors").accounting == "authors"
    for bad in [{"accounting": "paper"}, {"max_new_tokens": -1}]:
        with pytest.raises(BadInput) as error:
            build_press("qevict", 0.0, memory=0.2, **bad)
        assert "\n" not in str(error.value)
