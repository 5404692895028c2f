"""Collective costs: textbook limits, published sweeps, monotonicity."""
from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from primus_ext.comm.collectives import all_gather_s, all_reduce_s, all_to_all_s, \
    collective_s, p2p_s, reduce_scatter_s
from primus_ext.comm.groups import GroupSpan
from primus_ext.presets import hardware_preset


def span(n: int, k: int = 1, dom: int = 8) -> GroupSpan:
    return GroupSpan(axis="x", size=n, num_nodes=k, num_domains=k, ranks_per_node=n // k,
                     ranks_per_domain=n // k, domain_size=dom)


def test_ring_all_reduce_big_message_limit():
    hw = hardware_preset("h100")
    bw = hw.scale_up_gbps * 1e9 * hw.scale_up_efficiency
    for n in (2, 4, 8):
        S = 8e9
        t = all_reduce_s(hw, span(n), S)
        assert t == pytest.approx(2 * (n - 1) / n * S / bw, rel=0.01)
        assert reduce_scatter_s(hw, span(n), S) == pytest.approx((n - 1) / n * S / bw, rel=0.01)
        assert all_gather_s(hw, span(n), S) == reduce_scatter_s(hw, span(n), S)


def test_h100_busbw_matches_nccl_tests():
    """8x H100: all-reduce busbw ~370, all-to-all ~320 GB/s; 4 nodes: all-reduce ~370-380
    (NVLink-bound), all-to-all ~48 (NIC-bound) (achievable-performance.md 4.1, 4.3)."""
    hw = hardware_preset("h100")
    S = 8e9
    assert 2 * 7 / 8 * S / all_reduce_s(hw, span(8), S) / 1e9 == pytest.approx(370, rel=0.05)
    assert 7 / 8 * S / all_to_all_s(hw, span(8), S) / 1e9 == pytest.approx(320, rel=0.05)
    ar32 = 2 * 31 / 32 * S / all_reduce_s(hw, span(32, 4), S) / 1e9
    assert ar32 == pytest.approx(375, rel=0.12)
    a2a32 = 31 / 32 * S / all_to_all_s(hw, span(32, 4), S) / 1e9
    assert a2a32 == pytest.approx(48, rel=0.15)


# 8x MI300X rccl-tests all-reduce, eager (achievable-performance.md 4.2): bytes, us.
MI300X_AR = [(1e3, 13.1), (64e3, 13.8), (256e3, 16.9), (1e6, 27.4), (4e6, 51.7),
             (16e6, 148.8), (64e6, 429.1), (256e6, 1537), (1e9, 5971)]


@pytest.mark.parametrize("nbytes,measured_us", MI300X_AR)
def test_mi300x_all_reduce_sweep(nbytes, measured_us):
    hw = hardware_preset("mi300x")
    t = all_reduce_s(hw, span(8), nbytes) * 1e6
    assert t == pytest.approx(measured_us, rel=0.25)


def test_small_messages_are_latency_bound():
    hw = hardware_preset("h100")
    t = all_reduce_s(hw, span(8), 1024)
    assert t == pytest.approx(hw.scale_up_latency_s + 14 * hw.scale_up_hop_latency_s, rel=0.05)
    assert all_reduce_s(hw, span(8), 2048) / t < 1.01


def test_all_to_all_traffic_leaving_the_domain_uses_the_nic():
    hw = hardware_preset("h100")
    S = 1e9
    inside = all_to_all_s(hw, span(8), S)
    across = all_to_all_s(hw, span(64, 8), S)
    nic = hw.scale_out_gbps * 1e9 * hw.scale_out_efficiency
    assert across > 5 * inside
    assert across == pytest.approx(S * 56 / 64 / nic, rel=0.05)


def test_hierarchical_beats_flat_ring_across_nodes():
    hw = hardware_preset("h100")
    # one rank per node: NIC bound, same either way
    S = 4e9
    t1 = all_reduce_s(hw, span(16, 16), S)
    nic = hw.scale_out_gbps * 1e9 * hw.scale_out_efficiency
    assert t1 == pytest.approx(2 * 15 / 16 * S / nic, rel=0.02)
    # 8 ranks per node: only S/8 crosses each NIC
    t8 = all_reduce_s(hw, span(128, 16), S)
    assert t8 < t1 / 4


def test_mesh_pairs_get_one_link():
    amd = hardware_preset("mi300x")
    S = 1e9
    pair = p2p_s(amd, S, cross_domain=False, domain_size=8)
    assert S / pair / 1e9 == pytest.approx(448 * amd.scale_up_efficiency / 7, rel=0.05)
    two = all_reduce_s(amd, span(2), S)
    eight = all_reduce_s(amd, span(8), S)
    assert two > 3 * eight  # a pair on a mesh uses 1 of 7 links: 7 S/bw vs 1.75 S/bw


coll = st.sampled_from(["all_reduce", "reduce_scatter", "all_gather", "all_to_all"])
layouts = st.sampled_from([(2, 1), (8, 1), (16, 2), (64, 8), (8, 8), (256, 32), (32, 4)])


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["h100", "mi300x", "gb200", "a100"]), coll, layouts,
       st.floats(1.0, 1e10), st.floats(1.0, 4.0),
       st.sampled_from(["scale_up_gbps", "scale_out_gbps"]))
def test_more_link_bandwidth_never_slower(gpu, name, layout, nbytes, factor, field):
    hw = hardware_preset(gpu)
    fast = replace(hw, **{field: getattr(hw, field) * factor})
    sp = span(*layout)
    assert collective_s(fast, sp, name, nbytes) <= collective_s(hw, sp, name, nbytes) * (1 + 1e-12)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["h100", "mi300x", "b200"]), coll, layouts, st.floats(1.0, 1e10),
       st.floats(1.0, 10.0))
def test_more_bytes_never_faster(gpu, name, layout, nbytes, factor):
    hw = hardware_preset(gpu)
    sp = span(*layout)
    assert collective_s(hw, sp, name, nbytes * factor) >= collective_s(hw, sp, name, nbytes)


def test_single_rank_groups_cost_nothing():
    hw = hardware_preset("h100")
    for name in ("all_reduce", "reduce_scatter", "all_gather", "all_to_all"):
        assert collective_s(hw, span(1), name, 1e9) == 0.0
    with pytest.raises(ValueError, match="collective 'bcast'"):
        collective_s(hw, span(8), "bcast", 1.0)
