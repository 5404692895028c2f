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


def _nccl_ring_us(n: int, k: int, proto: str) -> float:
    """NCCL's own ring latency for an all-gather / reduce-scatter over ``k`` nodes of
    ``n / k`` Intel-hosted GPUs (NVIDIA/nccl v2.18.1-1 src/graph/tuning.cc: baseLat
    Ring, hwLat NVLINK / NET Ring, getNetOverhead 1 us, x3 for Simple)."""
    base = {"ll": 6.6, "ll128": 14.0, "simple": 8.4}[proto]
    up = {"ll": 0.6, "ll128": 1.9, "simple": 3.4}[proto]
    net = {"ll": 2.7, "ll128": 4.0, "simple": 14.0}[proto]
    ov = 3.0 if proto == "simple" else 1.0
    return base + (n - k) * max(up, ov) + (k - 1) * net


def test_cross_node_all_gather_is_a_flat_ring_in_nccls_fastest_protocol():
    """Across nodes NCCL runs all-gather / reduce-scatter as one ring over all ranks
    (n - 1 steps) in the protocol its tuner finds fastest: LL for a tiny message, LL128
    in the middle (512 ranks: Simple's 3.4 / 14 us hops cost 2.4 ms), Simple's bandwidth
    for a huge one."""
    hw = hardware_preset("h100")
    ll_lat = max(hw.scale_out_latency_s * 1e6, 6.6) - 6.6 + _nccl_ring_us(16, 2, "ll")
    assert all_gather_s(hw, span(16, 2), 1024) * 1e6 == pytest.approx(ll_lat, rel=0.02)
    # 512 ranks, 400 MB: NCCL's latencies are LL128 1.12 ms, Simple 2.41 ms.
    assert _nccl_ring_us(512, 64, "ll128") == pytest.approx(1117, abs=1)
    assert _nccl_ring_us(512, 64, "simple") == pytest.approx(2414, abs=1)
    S = 4e8
    t = all_gather_s(hw, span(512, 64), S)
    nic8 = 8 * hw.scale_out_gbps * 1e9 * hw.scale_out_efficiency
    bw_s = (511 / 512 * S) / nic8 / (S / (S + hw.scale_out_half_bytes))
    assert t == pytest.approx(_nccl_ring_us(512, 64, "ll128") * 1e-6 + bw_s / 0.92, rel=0.01)
    assert t < _nccl_ring_us(512, 64, "simple") * 1e-6 + bw_s
    # Huge: Simple's bandwidth wins over LL128's 0.92 of it.
    S = 2e10
    big = reduce_scatter_s(hw, span(512, 64), S)
    bw_s = (511 / 512 * S) / nic8 / (S / (S + hw.scale_out_half_bytes))
    assert big == pytest.approx(_nccl_ring_us(512, 64, "simple") * 1e-6 + bw_s, rel=0.01)


def test_cross_node_ring_latency_grows_with_every_rank():
    """No hierarchical shortcut for all-gather: the latency of a small one grows by a
    hop per added rank, not per added node only."""
    hw = hardware_preset("h100")
    small = [all_gather_s(hw, span(8 * k, k), 64e3) for k in (2, 8, 64)]
    assert small[0] < small[1] < small[2]
    assert small[2] - small[1] > (448 - 56) * 1.0e-6
