"""The flex dispatcher (DeepEP / HybridEP) against megatron-core's routing and DeepEP's
published bandwidths.

- ``ranks_hit`` / ``expected_domains_hit`` (compute/routing.py): the distinct EP ranks and
  domains a token's experts fall in, against megatron-core's own top-k routing on CPU
  (moe_utils.topk_routing_with_score_function on RandomSTE-like normal logits, with and
  without group-limited routing).
- ``flex_dispatch_s`` (comm/moe_comm.py) on DeepEP's own test setting (DeepEP README,
  normal kernels: H800, NVLink ~160 GB/s, CX7 400 Gb/s, 4096 tokens, hidden 7168, top-8 of
  256 experts in 8 groups, top-4 groups, FP8 dispatch): intranode EP 8 at 153 GB/s NVLink;
  internode EP 16 / 32 / 64 at 43 / 58 / 51 GB/s of "RDMA" bandwidth, which counts every
  (token, node) copy.
"""
from __future__ import annotations

import pytest

from primus_ext import compose
from primus_ext.comm.groups import group_span
from primus_ext.comm.moe_comm import flex_dispatch_s
from primus_ext.compute.routing import expected_domains_hit, ranks_hit

HIDDEN_FP8 = 7168  # bytes per token of an FP8 dispatch at hidden 7168
TOKENS = 4096


def _dsv3(ep: int, nodes: int):
    return compose(["model=deepseek_v3", "cluster.hardware=h800",
                    f"cluster.num_nodes={nodes}", f"parallel.ep={ep}", "parallel.pp=16",
                    "parallel.moe_token_dispatcher_type=flex", "train.seq_length=4096",
                    "train.global_batch_size=4096"])


@pytest.mark.parametrize("experts,topk,ep,groups", [
    (64, 6, 8, None), (64, 6, 8, (8, 4)), (64, 6, 16, (4, 2)), (256, 8, 8, (8, 4)),
    (256, 8, 32, (8, 4)), (256, 8, 64, (8, 4)), (160, 6, 8, (8, 3))])
def test_ranks_hit_matches_megatron_core_routing(experts, topk, ep, groups):
    import torch
    from megatron.core.transformer.moe.moe_utils import topk_routing_with_score_function

    kw = dict(num_groups=groups[0], group_topk=groups[1]) if groups else {}
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(20000, experts, generator=g)
    _, routing = topk_routing_with_score_function(logits, topk, **kw)
    measured = routing.view(-1, ep, experts // ep).any(dim=2).sum(dim=1).double().mean()
    model = expected_domains_hit(experts, topk, ep, *(groups or (None, None)))
    assert model == pytest.approx(float(measured), rel=0.05)


def test_deepep_intranode_bandwidth():
    spec = _dsv3(8, 16)
    span = group_span(spec, "ep")
    assert span.num_domains == 1
    t = flex_dispatch_s(spec, span, TOKENS, HIDDEN_FP8)
    nvlink = TOKENS * HIDDEN_FP8 * ranks_hit(spec.model, 8) / t / 1e9
    assert nvlink == pytest.approx(153, rel=0.05)


def test_deepep_intranode_bandwidth_h100():
    # tile-ai/tilescale examples/distributed (DeepEP intranode README): 8x H100 over
    # NVLink, 20 SMs, 8 ranks, 32 experts, top-8, 4096 tokens of 7168 BF16: DeepEP
    # dispatch 328.97 GB/s in 1.0045 ms, combine 287.14 GB/s in 1.1552 ms.
    spec = compose(["model=mixtral_8x7b", "cluster.hardware=h100", "cluster.num_nodes=1",
                    "parallel.ep=8", "parallel.moe_token_dispatcher_type=flex",
                    "model.hidden_size=7168", "model.num_moe_experts=32",
                    "model.moe_router_topk=8"])
    span = group_span(spec, "ep")
    t = flex_dispatch_s(spec, span, TOKENS, 7168 * 2)
    assert t == pytest.approx((1.0045e-3 + 1.1552e-3) / 2, rel=0.10)


@pytest.mark.parametrize("ep,published", [(16, 43), (32, 58), (64, 51)])
def test_deepep_internode_bandwidth(ep, published):
    spec = _dsv3(ep, 2 * ep)
    span = group_span(spec, "ep")
    assert span.num_domains == ep // 8
    m = spec.model
    t = flex_dispatch_s(spec, span, TOKENS, HIDDEN_FP8)
    nodes = expected_domains_hit(m.num_moe_experts, m.moe_router_topk, span.num_domains,
                                 m.moe_router_num_groups, m.moe_router_group_topk)
    rdma = TOKENS * HIDDEN_FP8 * nodes / t / 1e9
    assert rdma == pytest.approx(published, rel=0.30)


def test_flex_sends_fewer_bytes_than_alltoall():
    # one copy per destination rank, not per (token, expert) pair
    spec = _dsv3(8, 16)
    assert ranks_hit(spec.model, 8) < spec.model.moe_router_topk


@pytest.mark.parametrize("ep,nodes", [(8, 16), (16, 32)])
def test_hybridep_gathers_the_routing_map(ep, nodes):
    """HybridEP all-gathers each rank's boolean routing map before its metadata kernel
    (DeepEP hybrid-ep csrc/hybrid_ep/executor/executor.cu Executor::allgather_routing_map):
    the bytes are those of megatron-core's own routing map, gathered over the EP group,
    forward only, exposed; DeepEP has no such collective."""
    import torch
    from megatron.core.transformer.moe.moe_utils import topk_routing_with_score_function

    from primus_ext.comm.moe_comm import HYBRIDEP_ROUTING_MAP, ep_comm_ops

    spec = compose(["model=deepseek_v3", "cluster.hardware=h800",
                    f"cluster.num_nodes={nodes}", f"parallel.ep={ep}", "parallel.pp=16",
                    "parallel.moe_token_dispatcher_type=flex",
                    "parallel.moe_flex_dispatcher_backend=hybridep", "train.seq_length=4096",
                    "train.global_batch_size=4096"])
    m = spec.model
    _, routing = topk_routing_with_score_function(
        torch.randn(TOKENS, m.num_moe_experts), m.moe_router_topk)
    ops = ep_comm_ops(spec, TOKENS, HIDDEN_FP8, layer_compute_s=1.0, shared_fwd_s=0.0,
                      shared_bwd_s=0.0)
    gather = [o for o in ops if o.name == HYBRIDEP_ROUTING_MAP]
    assert len(gather) == 1 and gather[0].phase == "fwd"
    assert gather[0].num_bytes == routing.numel() * routing.element_size() * ep
    assert gather[0].exposed_s == gather[0].seconds > 0
    deepep = compose(["model=deepseek_v3", "cluster.hardware=h800",
                      f"cluster.num_nodes={nodes}", f"parallel.ep={ep}", "parallel.pp=16",
                      "parallel.moe_token_dispatcher_type=flex", "train.seq_length=4096",
                      "train.global_batch_size=4096"])
    assert not [o for o in ep_comm_ops(deepep, TOKENS, HIDDEN_FP8, layer_compute_s=1.0,
                                       shared_fwd_s=0.0, shared_bwd_s=0.0)
                if o.name == HYBRIDEP_ROUTING_MAP]


def test_hybridep_routing_map_gather_is_pre_sync():
    """The gather precedes the host's token-count wait, so it is not post-sync device
    time (compute/host_moe.py post_sync_device_s)."""
    from primus_ext.comm.moe_comm import HYBRIDEP_ROUTING_MAP
    from primus_ext.compute.host_moe import PRE_SYNC_COMMS

    assert HYBRIDEP_ROUTING_MAP in PRE_SYNC_COMMS
