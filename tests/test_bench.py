"""Unit tests of the benchmark harness's pure helpers (no TensorFlow session)."""

from __future__ import annotations

import pytest

from benchmarks.flops import dense_flops_per_step, matmul_flops, mfu, param_bytes, ring_allreduce_min_bytes
from benchmarks.stats import fmt_summary, paired_ratios, summarize
from benchmarks.table import markdown_table

pytestmark = pytest.mark.unit


def test_summarize_median_min_max_odd_and_even():
    s = summarize([3.0, 1.0, 2.0, 10.0, 4.0])
    assert (s.median, s.min, s.max, s.n) == (3.0, 1.0, 10.0, 5)
    s = summarize([4.0, 1.0, 2.0, 3.0])
    assert s.median == 2.5 and s.n == 4


def test_summarize_drops_failed_runs_and_counts_them():
    s = summarize([1.0, None, float("nan"), 5.0])
    assert (s.median, s.n, s.failed) == (3.0, 2, 2)
    assert summarize([None, None]) is None


def test_paired_ratios_pair_by_round():
    assert paired_ratios([2.0, 3.0, None], [1.0, 6.0, 1.0]) == [2.0, 0.5, None]
    with pytest.raises(ValueError):
        paired_ratios([1.0], [1.0, 2.0])


def test_fmt_summary():
    s = summarize([1.0, 1.02, 1.05])
    assert fmt_summary(s) == "1.02 (1–1.05)"
    assert fmt_summary(None) == "n/a"


def test_dense_flops_counts_forward_and_backward_exactly():
    # One layer 3->2, batch 5: forward 2*3*2*5=60, weight grad 60, no input grad; bias 2*2*5=20.
    assert dense_flops_per_step([(3, 2)], 5) == 140
    assert dense_flops_per_step([(3, 2)], 5, bias=False) == 120
    # Second layer 2->4 also needs the input gradient: 3 x 2*2*4*5 = 240, bias 2*4*5 = 40.
    assert dense_flops_per_step([(3, 2), (2, 4)], 5) == 140 + 240 + 40


def test_dense_flops_close_to_six_params_batch_for_deep_stacks():
    layers = [(1024, 1024)] * 8
    params = sum(i * o for i, o in layers)
    f = dense_flops_per_step(layers, 32, bias=False)
    assert 0.9 * 6 * params * 32 < f < 6 * params * 32


def test_mfu_and_matmul_flops():
    assert matmul_flops(2, 3, 4) == 48
    assert mfu(1e9, 0.5, 4e9) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        mfu(1e9, 0.0, 1e9)


def test_ring_allreduce_minimum():
    assert ring_allreduce_min_bytes(1, 1000) == 0
    assert ring_allreduce_min_bytes(2, 1000) == 1000
    assert ring_allreduce_min_bytes(4, 1000) == 1500
    assert param_bytes([(64, 128), (128,)]) == (64 * 128 + 128) * 4
    with pytest.raises(ValueError):
        ring_allreduce_min_bytes(0, 10)


def test_markdown_table_renders_and_escapes():
    out = markdown_table(["what", "value"], [["a|b", 1], ["c", "2\n3"]])
    assert out.splitlines() == [
        "| what | value |",
        "| --- | ---: |",
        "| a\\|b | 1 |",
        "| c | 2 3 |",
    ]
    with pytest.raises(ValueError):
        markdown_table(["a", "b"], [[1]])
