"""In-flight microbatches per schedule (memory/inflight.py)."""
from __future__ import annotations

import pytest

from primus_ext.memory.inflight import inflight_1f1b, inflight_interleaved


@pytest.mark.parametrize("pp,m", [(1, 8), (4, 8), (4, 2), (8, 64)])
def test_1f1b_first_stage_holds_min_pp_m(pp, m):
    assert [inflight_1f1b(pp, r, m) for r in range(pp)] == \
        [min(pp - r, m) for r in range(pp)]


@pytest.mark.parametrize("pp,vpp,m", [(2, 2, 4), (4, 2, 8), (4, 3, 16), (8, 4, 64)])
def test_interleaved_peak_is_megatron_warmup_plus_one(pp, vpp, m):
    for r in range(pp):
        alive = inflight_interleaved(pp, vpp, r, m, (1,) * vpp)
        warmup = min((pp - r - 1) * 2 + (vpp - 1) * pp, m * vpp)
        assert sum(alive) == min(warmup + 1, m * vpp)


def test_interleaved_counts_per_chunk():
    # pp 2, vpp 2, rank 0: warmup (2-0-1)*2 + 1*2 = 4 forwards = chunk 0, 0, 1, 1, then
    # the first steady forward is chunk 0 again.
    assert inflight_interleaved(2, 2, 0, 4, (1, 1)) == (3, 2)
    # rank 1: warmup 2 forwards (chunk 0, 0), then forward chunk 1 before its backward
    assert inflight_interleaved(2, 2, 1, 4, (1, 10)) == (2, 1)


def test_interleaved_all_warmup_when_few_microbatches():
    assert sum(inflight_interleaved(4, 2, 0, 4, (1, 1))) == 8
