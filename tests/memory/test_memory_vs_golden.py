"""The last stage's allocated peak against Megatron-LM's own GPU logs (issue 21).

Megatron-LM's functional tests on DGX H100 log ``mem-max-allocated-bytes``
(``torch.cuda.max_memory_allocated``) on the last rank; ``tests/data/megatron_golden/
h100.json`` holds them with each case's real flags. Every case the flag reader accepts is
compared (``primus_ext/published/golden_memory.py``; the generated section of
docs/memory.md lists them with the path each exercises).
"""
from __future__ import annotations

import pytest

from primus_ext.published.golden_memory import figures, golden_rows, percentile


@pytest.fixture(scope="module")
def rows():
    return golden_rows()


def test_every_golden_case_with_a_peak_is_compared(rows):
    assert len(rows) >= 74
    assert sum(r.is_moe for r in rows) >= 23


def test_allocated_peak_matches_megatron_lm_logs(rows):
    f = figures(rows)
    assert f.median_abs_error <= 0.02, f
    assert f.p90_abs_error <= 0.08, f
    assert f.moe_p90_abs_error <= 0.10, f


def test_the_static_part_matches_what_stays_allocated_after_a_step(rows):
    """``mem-allocated-bytes`` after a step: weights, gradients, optimizer state,
    workspaces and buffers; the dense cases without CUDA graphs within 10%."""
    errs = [abs(r.ours_static_bytes / r.measured_static_bytes - 1) for r in rows
            if r.measured_static_bytes and not r.is_moe and "CUDA graphs" not in r.note]
    assert len(errs) >= 40
    assert percentile(errs, 0.5) <= 0.03 and percentile(errs, 0.9) <= 0.10


def test_percentile_is_nearest_rank():
    values = [float(v) for v in range(1, 11)]
    assert percentile(values, 0.9) == 9.0 and percentile(values, 0.5) == 5.0
    assert percentile([3.0], 0.9) == 3.0
