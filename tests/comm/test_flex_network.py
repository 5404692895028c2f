"""The flex dispatcher across scale-up domains: DeepEP's and HybridEP's published RDMA
rates (deepseek-ai/DeepEP@dd758caf4518 README.md, H800 normal kernels; @94a9f8f6b146
hybrid-ep docs/README_Hybrid-EP.md, H100 over IB) count a token once per node its
experts fall in, its own node included (tests/test_internode.py ``num_rdma_token_sent``,
tests/utils.py ``count_rdma_send_from_routing_map``: "we do not set the local node map to
zeros"). The projection costs the network tier with the same count."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from primus_ext import compose
from primus_ext.comm.collectives import out_tier_s
from primus_ext.comm.groups import group_span
from primus_ext.comm.moe_comm import flex_dispatch_s
from primus_ext.compute.routing import expected_domains_hit
from primus_ext.presets import hardware_preset
from primus_ext.spec import HardwareSpec

# README tables: (dispatch, combine) GB/s at EP 16 / 32 / 64 (8 GPUs a node).
DEEPEP_H800 = {2: (43, 43), 4: (58, 57), 8: (51, 50)}
HYBRIDEP_H100_16SMS = {2: (54.47, 53.35), 4: (47.36, 52.53), 8: (41.24, 46.57)}


def _deepep_count(num_experts, topk, nodes, topk_groups=None, tokens=20000, seed=0):
    """Mean nodes hit per token, as DeepEP's test_internode.py draws and counts them:
    |N(0,1)| + 1 scores, the best ``topk_groups`` nodes by their best score (groups are
    nodes), the top-k experts among them, unique nodes incl. the token's own."""
    rng = np.random.default_rng(seed)
    scores = np.abs(rng.standard_normal((tokens, num_experts))) + 1
    if topk_groups:
        per_node = scores.reshape(tokens, nodes, -1)
        keep = np.argsort(-per_node.max(axis=-1), axis=-1)[:, :topk_groups]
        mask = np.zeros((tokens, nodes), dtype=bool)
        np.put_along_axis(mask, keep, True, axis=-1)
        scores = np.where(np.repeat(mask, num_experts // nodes, axis=-1), scores, 0.0)
    top = np.argsort(-scores, axis=-1)[:, :topk]
    node = top // (num_experts // nodes)
    return float(np.mean([len(set(r)) for r in node]))


@pytest.mark.parametrize("experts,topk,nodes,groups", [
    (128, 8, 2, None), (128, 8, 4, None), (256, 8, 8, None), (256, 8, 4, 4), (256, 8, 8, 4)])
def test_domains_hit_is_the_kernels_count(experts, topk, nodes, groups):
    mine = expected_domains_hit(experts, topk, nodes, nodes if groups else None, groups)
    assert mine == pytest.approx(_deepep_count(experts, topk, nodes, groups), rel=0.02)


def _spec(hardware: str, backend: str, nodes: int):
    spec = compose(["model=deepseek_v3", f"cluster.hardware={hardware}",
                    f"cluster.num_nodes={nodes}", f"parallel.ep={8 * nodes}",
                    "parallel.pp=1", "parallel.moe_token_dispatcher_type=flex",
                    f"parallel.moe_flex_dispatcher_backend={backend}",
                    "train.global_batch_size=1024"])
    hw = dataclasses.replace(spec.cluster.hardware, scale_up_gbps=1e6)  # network-bound
    return dataclasses.replace(spec, cluster=dataclasses.replace(spec.cluster, hardware=hw))


@pytest.mark.parametrize("hardware,backend,table", [
    ("h800", "deepep", DEEPEP_H800), ("h100", "hybridep", HYBRIDEP_H100_16SMS)])
def test_the_network_tier_runs_at_the_published_rate(hardware, backend, table):
    """The benchmark's shape (4096 tokens x 7168, BF16) on DeepSeek-V3's routing: the
    network tier's time gives back the table's rate (mean of dispatch and combine) when
    the bytes are counted as the kernels count them."""
    for nodes, (d, c) in table.items():
        spec = _spec(hardware, backend, nodes)
        m, hw = spec.model, spec.cluster.hardware
        t = flex_dispatch_s(spec, group_span(spec, "ep"), 4096, 7168 * 2) \
            - hw.scale_out_latency_s
        dom = expected_domains_hit(m.num_moe_experts, m.moe_router_topk, nodes,
                                   m.moe_router_num_groups, m.moe_router_group_topk)
        assert 4096 * 7168 * 2 * dom / t / 1e9 == pytest.approx((d + c) / 2, rel=0.01)


def test_law_between_beyond_and_without_points():
    hw = hardware_preset("h100")
    e2, e4 = (hw.flex_network_efficiency("hybridep", d) for d in (2, 4))
    assert hw.flex_network_efficiency("hybridep", 3) == pytest.approx((e2 + e4) / 2)
    assert hw.flex_network_efficiency("hybridep", 32) == \
        hw.hybridep_network_efficiency_by_domains[-1][1]
    # A preset with no published figure (B300's 800 Gb/s NIC) keeps the remote copies
    # at the NIC's efficiency.
    spec = _spec("b300", "deepep", 2)
    b300 = spec.cluster.hardware
    assert b300.flex_network_efficiency("deepep", 2) is None
    m = spec.model
    dom = expected_domains_hit(m.num_moe_experts, m.moe_router_topk, 2,
                               m.moe_router_num_groups, m.moe_router_group_topk)
    t = flex_dispatch_s(spec, group_span(spec, "ep"), 4096, 7168 * 2)
    assert t == pytest.approx(b300.scale_out_latency_s
                              + out_tier_s(b300, 4096 * 7168 * 2 * dom / 2))


@pytest.mark.parametrize("points,msg", [
    ([[4, 0.9], [2, 0.8]], "domain counts must rise"),
    ([[1, 0.9]], "domains >= 2"),
    ([[2, 2.5]], "efficiency in (0, 2]"),
    ([[2]], "pairs"),
])
def test_bad_points_name_the_field(points, msg):
    with pytest.raises(ValueError, match="hardware.hybridep_network_efficiency_by_domains") \
            as exc:
        HardwareSpec(name="x", bf16_tflops=1.0, hbm_bytes=1, hbm_gbps=1.0, scale_up_gbps=1.0,
                     scale_out_gbps=1.0, hybridep_network_efficiency_by_domains=points)
    assert msg in str(exc.value)
