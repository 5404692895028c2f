"""Collective cost model: alpha-beta per link tier with a message-size-dependent bus bandwidth.

Two tiers: *scale-up* (NVLink / xGMI inside a domain) and *scale-out* (the NICs, one per
GPU, rail-optimised). On one tier, moving ``S`` bytes costs::

    S / busbw(S),   busbw(S) = link_gbps * eff * max(ll_fraction, S / (S + S_half))

The saturating term is the Simple protocol (bandwidth grows with the message until
pipelining fills every channel); the floor (scale-up tier only) is the low-latency
protocol, which NCCL caps at half the Simple bandwidth but which starts at once. On
8x MI300X this form with ``S_half = 8 MB`` and a 13 us floor reproduces the rccl-tests
all-reduce sweep from 1 KB to 1 GB within 25% (achievable-performance.md 4.2). A collective adds a base
latency (``*_latency_s``: launch and the first hop) and per-step hop latencies (NCCL's
tuning model, 4.2: ring steps pay a hop each, inter-node steps at network cost).

Algorithms (``n`` ranks over ``k`` domains, at most ``g`` ranks per domain; ``S`` the full
buffer, as nccl-tests counts it):

- ring all-reduce ``2(n-1)/n * S``; reduce-scatter / all-gather ``(n-1)/n * S``; a flat
  ring that leaves the domain runs at ``min(busbw_up, g * busbw_out)`` (one ring per NIC);
- reduce-scatter / all-gather across domains: one flat ring over all ``n`` ranks, NCCL's
  only algorithm for them on a network without NVLS / CollNet, in the fastest of the
  LL / LL128 / Simple protocols with NCCL's per-protocol latencies (``cross_ring_s``);
- all-reduce across domains: the flat ring or a hierarchical one, the intra-domain
  reduce-scatter / all-gather on the scale-up tier and the inter-domain step on the
  ``S/g`` shard over the NICs, pipelined (the slower of the two; the 4-node B200
  measurement sits at this bound, 4.2), the inter step a ring or a double binary tree,
  whichever has fewer hops;
- all-to-all: of the ``S`` bytes a rank holds, ``S(g-1)/n`` go over the scale-up links and
  ``S(n-g)/n`` over its NIC, concurrently; latency grows by ``a2a_peer_latency_s`` a peer;
- p2p: one transfer over the tier that joins the two ranks.

On a mesh (``scale_up_mesh``, AMD xGMI: one link per GPU pair, no switch) a group of ``g``
of the ``N`` GPUs of a domain uses ``g-1`` of the ``N-1`` links of each GPU, and a pair one.
Each algorithm's time is monotone in bytes and never grows with any bandwidth; the model
takes the cheapest algorithm, which keeps both properties.
"""
from __future__ import annotations

from math import ceil, log2

from primus_ext.comm.groups import GroupSpan, group_span
from primus_ext.spec.hardware import HardwareSpec
from primus_ext.spec.run import RunSpec


def _xfer_s(nbytes: float, peak_bps: float, half: float, ll: float) -> float:
    """Seconds to move ``nbytes`` through one tier at the size-dependent bus bandwidth."""
    if nbytes <= 0:
        return 0.0
    return nbytes / (peak_bps * max(ll, nbytes / (nbytes + half)))


def _mesh_share(hw: HardwareSpec, span: GroupSpan, ranks: int) -> float:
    """Fraction of a GPU's scale-up bandwidth a group with ``ranks`` per domain can use."""
    if not hw.scale_up_mesh or span.domain_size <= 1:
        return 1.0
    return max(ranks - 1, 1) / (span.domain_size - 1)


def _up_bps(hw: HardwareSpec, span: GroupSpan, a2a: bool = False) -> float:
    eff = hw.scale_up_a2a_efficiency if a2a else hw.scale_up_efficiency
    return hw.scale_up_gbps * 1e9 * eff * _mesh_share(hw, span, span.ranks_per_domain)


def _out_bps(hw: HardwareSpec) -> float:
    return hw.scale_out_gbps * 1e9 * hw.scale_out_efficiency


def _up(hw: HardwareSpec, span: GroupSpan, nbytes: float, a2a: bool = False) -> float:
    return _xfer_s(nbytes, _up_bps(hw, span, a2a), hw.scale_up_half_bytes,
                   hw.ll_bandwidth_fraction)


def _out(hw: HardwareSpec, nbytes: float, nics: int = 1) -> float:
    # No low-latency floor over the network: there NCCL's LL protocols move far less
    # than half the Simple bandwidth (the 4-node B200 sweep, 4.2, shows 12-16% of the NIC
    # at 2 MB per GPU), which the saturating term alone reproduces with S_half ~ 10 MB.
    return _xfer_s(nbytes, _out_bps(hw) * nics, hw.scale_out_half_bytes, 0.0)


def out_tier_s(hw: HardwareSpec, nbytes: float) -> float:
    """Bandwidth time of ``nbytes`` over one rank's NIC (no latency)."""
    return _out(hw, nbytes)


def _flat_ring_s(hw: HardwareSpec, span: GroupSpan, moved: float) -> float:
    """Bandwidth term of a flat ring crossing domains: every ring crosses each boundary
    once, one ring per NIC of the domain, so the bottleneck is min(up, g * out)."""
    if span.ranks_per_domain <= 1:
        return _out(hw, moved)
    return max(_up(hw, span, moved), _out(hw, moved, nics=span.ranks_per_domain))


def all_reduce_s(hw: HardwareSpec, span: GroupSpan, nbytes: float) -> float:
    n = span.size
    if n <= 1 or nbytes <= 0:
        return 0.0
    k, g = span.num_domains, span.ranks_per_domain
    if k == 1:
        return (hw.scale_up_latency_s + 2 * (n - 1) * hw.scale_up_hop_latency_s
                + _up(hw, span, 2 * (n - 1) / n * nbytes))
    base = hw.scale_out_latency_s
    flat = (base + 2 * (n - k) * hw.scale_up_hop_latency_s
            + 2 * (k - 1) * hw.scale_out_hop_latency_s
            + _flat_ring_s(hw, span, 2 * (n - 1) / n * nbytes))
    inter_hops = min(2 * (k - 1), 2 * ceil(log2(k)))  # ring or double binary tree
    hier = (base + 2 * (g - 1) * hw.scale_up_hop_latency_s
            + inter_hops * hw.scale_out_hop_latency_s
            + max(_up(hw, span, 2 * (g - 1) / g * nbytes),
                  _out(hw, 2 * (k - 1) / k * nbytes / g)))
    return min(flat, hier)


def cross_ring_s(hw: HardwareSpec, span: GroupSpan, moved: float, steps: int,
                 inter_steps: int) -> float:
    """A ring over ``k > 1`` domains that moves ``moved`` bytes per rank in ``steps``
    steps, ``inter_steps`` of them over the network, in the fastest of NCCL's three
    protocols (its tuner's choice, NVIDIA/nccl src/graph/tuning.cc v2.18-v2.21):

    - latency ``max(scale_out_latency_s, base_p) + in-domain steps * max(up hop_p,
      net overhead_p) + network steps * net hop_p``; the net overhead (posting each step
      to the network proxy) is ``net_step_overhead_s``, three times for Simple;
    - Simple moves at the flat ring's size-dependent bus bandwidth ``min(up, g * NIC)``;
      LL128 at ``ll128_bandwidth_fraction`` of it; LL at a quarter of its peak, at most
      ``scale_out_ll_gbps``.
    """
    g = span.ranks_per_domain
    intra = steps - inter_steps
    base = hw.scale_out_latency_s
    out_peak = _out_bps(hw) * max(g, 1)
    if g > 1:
        up_peak = _up_bps(hw, span)
        simple = max(_xfer_s(moved, up_peak, hw.scale_up_half_bytes, 0.0),
                     _xfer_s(moved, out_peak, hw.scale_out_half_bytes, 0.0))
        peak = min(up_peak, out_peak)
    else:
        simple = _xfer_s(moved, out_peak, hw.scale_out_half_bytes, 0.0)
        peak = out_peak
    ov = hw.net_step_overhead_s
    t_simple = (max(base, hw.ring_base_simple_s)
                + intra * max(hw.scale_up_hop_simple_s, 3 * ov)
                + inter_steps * hw.scale_out_hop_simple_s + simple)
    t_ll128 = (max(base, hw.ring_base_ll128_s) + intra * max(hw.scale_up_hop_ll128_s, ov)
               + inter_steps * hw.scale_out_hop_ll128_s
               + simple / hw.ll128_bandwidth_fraction)
    ll_bps = min(hw.scale_out_ll_gbps * 1e9, peak / 4)
    t_ll = (max(base, hw.ring_base_ll_s) + intra * max(hw.scale_up_hop_latency_s, ov)
            + inter_steps * hw.scale_out_hop_latency_s + moved / ll_bps)
    return min(t_simple, t_ll128, t_ll)


def reduce_scatter_s(hw: HardwareSpec, span: GroupSpan, nbytes: float) -> float:
    """Reduce-scatter of an ``nbytes`` buffer (each rank keeps ``nbytes / n``). Across
    domains NCCL runs it as one flat ring over all ``n`` ranks (its only reduce-scatter
    and all-gather algorithm without NVLS / CollNet on the network: tuning.cc skips
    every other for these collectives), ``n - 1`` steps, ``k - 1`` of them inter-node."""
    n = span.size
    if n <= 1 or nbytes <= 0:
        return 0.0
    k = span.num_domains
    if k == 1:
        return (hw.scale_up_latency_s + (n - 1) * hw.scale_up_hop_latency_s
                + _up(hw, span, (n - 1) / n * nbytes))
    return cross_ring_s(hw, span, (n - 1) / n * nbytes, n - 1, k - 1)


def all_gather_s(hw: HardwareSpec, span: GroupSpan, nbytes: float) -> float:
    """All-gather into an ``nbytes`` buffer (each rank contributes ``nbytes / n``): the
    mirror of a reduce-scatter, same traffic and steps."""
    return reduce_scatter_s(hw, span, nbytes)


def all_to_all_s(hw: HardwareSpec, span: GroupSpan, nbytes: float) -> float:
    """All-to-all where each rank holds ``nbytes`` (its own slice included)."""
    n = span.size
    if n <= 1 or nbytes <= 0:
        return 0.0
    g = span.ranks_per_domain
    base = hw.scale_up_latency_s if span.num_domains == 1 else hw.scale_out_latency_s
    t_up = _up(hw, span, nbytes * (g - 1) / n, a2a=True)
    t_out = _out(hw, nbytes * (n - g) / n)
    return base + (n - 1) * hw.a2a_peer_latency_s + max(t_up, t_out)


def network_and_link_s(hw: HardwareSpec, span: GroupSpan, up_bytes: float,
                       out_bytes: float, *, a2a: bool = True) -> float:
    """A pattern that moves ``up_bytes`` over the scale-up links and ``out_bytes`` over
    the rank's NIC concurrently (an all-to-all, a DeepEP dispatch): latency as an
    all-to-all over the span, then the slower of the two tiers."""
    n = span.size
    if n <= 1 or (up_bytes <= 0 and out_bytes <= 0):
        return 0.0
    base = hw.scale_up_latency_s if span.num_domains == 1 else hw.scale_out_latency_s
    return (base + (n - 1) * hw.a2a_peer_latency_s
            + max(_up(hw, span, up_bytes, a2a=a2a), _out(hw, out_bytes)))


def p2p_s(hw: HardwareSpec, nbytes: float, *, cross_domain: bool,
          domain_size: int = 8) -> float:
    """One send/recv of ``nbytes`` between two ranks (inside a domain or across)."""
    if nbytes <= 0:
        return 0.0
    if cross_domain:
        return hw.scale_out_latency_s + _out(hw, nbytes)
    bps = hw.scale_up_gbps * 1e9 * hw.scale_up_efficiency
    if hw.scale_up_mesh and domain_size > 1:
        bps /= domain_size - 1  # one xGMI link between a pair
    return hw.scale_up_latency_s + _xfer_s(nbytes, bps, hw.scale_up_half_bytes,
                                           hw.ll_bandwidth_fraction)


def collective_s(hw: HardwareSpec, span: GroupSpan, collective: str, nbytes: float) -> float:
    """Dispatch by name (``all_reduce``, ``reduce_scatter``, ``all_gather``, ``all_to_all``)."""
    if collective == "all_reduce":
        return all_reduce_s(hw, span, nbytes)
    if collective == "reduce_scatter":
        return reduce_scatter_s(hw, span, nbytes)
    if collective == "all_gather":
        return all_gather_s(hw, span, nbytes)
    if collective == "all_to_all":
        return all_to_all_s(hw, span, nbytes)
    raise ValueError(f"collective {collective!r} is not one of all_reduce, reduce_scatter, "
                     "all_gather, all_to_all")


def group_collective_s(spec: RunSpec, axis: str, collective: str, nbytes: float) -> float:
    """Seconds of one collective over the group of ``axis`` in this run.

    ``axis`` is a group name of comm/groups.py, except that ``dp`` here means the
    gradient group of dense parameters, data x context parallel (megatron-core reduces
    gradients over dp x cp); the pure data-parallel group is ``dp_only``.
    """
    name = {"dp": "dp_cp", "dp_only": "dp"}.get(axis, axis)
    return collective_s(spec.cluster.hardware, group_span(spec, name), collective, nbytes)
