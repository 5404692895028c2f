"""The combined-1F1B schedule nodes and the scoped MoE CUDA graphs on the host clock
(compute/host_moe.py), against megatron-core 0.16's own classes and functions."""
from types import SimpleNamespace

import pytest

from primus_ext.compute.host import HostWork
from primus_ext.compute.host_moe import (NODE_API_CALLS, captured_ops, node_profile,
                                         node_work, schedule_nodes)
from primus_ext.frameworks.megatron.args import parse_launch_args
from primus_ext.project.simulate_backend import simulate_layer_costs

MOE = ["--num-layers", "4", "--hidden-size", "512", "--num-attention-heads", "8",
       "--seq-length", "1024", "--max-position-embeddings", "1024", "--micro-batch-size",
       "4", "--global-batch-size", "32", "--bf16", "--vocab-size", "50257",
       "--num-experts", "8", "--moe-router-topk", "2", "--moe-grouped-gemm",
       "--moe-token-dispatcher-type", "alltoall", "--expert-model-parallel-size", "4",
       "--moe-shared-expert-intermediate-size", "512",
       "--target-hardware", "h100", "--target-nodes", "1", "--target-gpus-per-node", "8"]


def _moe(*extra):
    return simulate_layer_costs(parse_launch_args(MOE + list(extra)).spec).kinds["moe"]


class _Stub:
    def wait(self, *a):
        pass

    record = wait


@pytest.mark.parametrize("moe", [True, False])
def test_node_count_is_megatron_cores(monkeypatch, moe):
    """TransformerLayerSchedulePlan builds four schedule nodes for an MoE layer and two
    for a dense one (the others are NoopScheduleNode)."""
    from megatron.core.models.common import model_chunk_schedule_plan as plan_mod
    from megatron.core.models.gpt import fine_grained_callables as fgc
    from megatron.core.pipeline_parallel.utils import ScheduleNode
    from megatron.core.transformer.moe.moe_layer import MoELayer
    monkeypatch.setattr(fgc, "build_layer_callables", lambda layer: ([None] * 5, {}))
    cfg = SimpleNamespace(delay_wgrad_compute=False, moe_token_dispatcher_type="alltoall",
                          moe_flex_dispatcher_backend="deepep", cuda_graph_scope=[])
    mlp = MoELayer.__new__(MoELayer) if moe else object()
    layer = SimpleNamespace(config=cfg, mlp=mlp)
    plan = plan_mod.TransformerLayerSchedulePlan(layer, _Stub(), SimpleNamespace(),
                                                 _Stub(), _Stub())
    nodes = [n for n in (plan.attn, plan.moe_dispatch, plan.mlp, plan.moe_combine,
                         plan.mtp_post_process) if isinstance(n, ScheduleNode)]
    assert len(nodes) == schedule_nodes(moe)


@pytest.mark.parametrize("pp,vpp,m", [(2, 2, 8), (4, 2, 16), (2, 4, 6)])
def test_merged_share_follows_the_warm_up_of_megatron_core(pp, vpp, m):
    """The first stage's warm-up forwards with the overlap (schedules.py
    get_pp_rank_microbatches adds one) are the forwards that run unmerged."""
    from megatron.core.pipeline_parallel.schedules import get_pp_rank_microbatches

    from primus_ext.comm.moe_comm import merged_fraction
    comm = SimpleNamespace(pp_group=SimpleNamespace(size=lambda: pp, rank=lambda: 0),
                           virtual_pipeline_model_parallel_size=vpp)
    total, _, warm, _ = get_pp_rank_microbatches(m, vpp, pp, forward_only=False,
                                                 overlap_moe_expert_parallel_comm=True,
                                                 p2p_communicator=comm)
    spec = SimpleNamespace(parallel=SimpleNamespace(pp=pp, vpp=vpp), num_microbatches=m)
    assert merged_fraction(spec) == pytest.approx((total - warm) / total)


def test_schedule_nodes_cost_host_time_per_layer():
    """--overlap-moe-expert-parallel-comm: every layer's nodes wait on and record the
    chunk's event (two CUDA calls each, per phase) and add their measured Python."""
    plain, ovl = _moe(), _moe("--overlap-moe-expert-parallel-comm")
    f, b = node_work(parse_launch_args(MOE + ["--overlap-moe-expert-parallel-comm"]).spec,
                     moe=True)
    assert f.kernels == b.kernels == 4 * NODE_API_CALLS
    assert ovl.fwd_host_s > plain.fwd_host_s and ovl.bwd_host_s > plain.bwd_host_s
    assert ovl.fwd_s == plain.fwd_s
    assert node_work(parse_launch_args(MOE).spec, moe=True) == (HostWork(), HostWork())
    prof = node_profile()
    assert prof["reference_host"]["megatron_core"].startswith("0.16")
    assert 0 < prof["node_fwd_s"] and 0 < prof["node_bwd_s"]


def test_router_and_preprocess_graphs_take_part_of_the_moe_block():
    """--cuda-graph-scope attn moe_router [moe_preprocess] (the scopes megatron-core's
    MoE README recommends against host overhead): the router part and the dispatch
    preprocess replay inside the layer's graph; the all-to-alls, the experts and the
    combine stay eager, the token-count sync stays (outside the graph)."""
    te = ["--cuda-graph-impl", "transformer_engine", "--cuda-graph-scope"]
    attn = _moe(*te, "attn")
    router = _moe(*te, "attn", "moe_router")
    pre = _moe(*te, "attn", "moe_router", "moe_preprocess")
    assert pre.fwd_host_s < router.fwd_host_s < attn.fwd_host_s
    assert pre.bwd_host_s < router.bwd_host_s < attn.bwd_host_s
    assert pre.fwd_syncs == attn.fwd_syncs == 1
    assert pre.fwd_s == attn.fwd_s
    spec = parse_launch_args(MOE + te + ["attn", "moe_router", "moe_preprocess"]).spec
    assert {"router", "router_topk", "pre_mlp_layernorm", "permute"} <= captured_ops(spec)
    assert "experts_fc1" not in captured_ops(spec)


def test_host_work_after_a_sync_does_not_hide_behind_device_work_before_it():
    """project/stages.py run_clocks: one block is two_clocks; a synchronisation between a
    device-heavy block and a host-heavy one serialises them."""
    from primus_ext.project.stages import run_clocks, two_clocks
    assert run_clocks([(0.3, 1.0, False)], 0.0) == two_clocks(1.0, 0.3, 0, 0.0)
    assert run_clocks([(1.0, 0.3, False)], 0.0) == two_clocks(0.3, 1.0, 0, 0.0)
    assert run_clocks([(0.1, 1.0, True), (1.0, 0.1, False)], 0.0) == pytest.approx(2.0)
    assert run_clocks([(0.1, 1.0, False), (1.0, 0.1, False)], 0.0) == pytest.approx(1.1)


def test_the_moe_forward_splits_at_the_token_count_sync():
    """The alltoall dispatcher waits for the token counts before the dispatch
    (``cuda_sync_point = "before_ep_alltoall"``): the all-to-alls, experts and combine
    come after it, the router and the first permutation before."""
    lc = _moe()
    assert lc.fwd_syncs == 1
    assert 0 < lc.fwd_post_sync_s < lc.fwd_total_s
    assert 0 < lc.fwd_post_sync_host_s < lc.fwd_host_s
    spec = parse_launch_args(MOE).spec
    dense = simulate_layer_costs(spec).kinds.get("dense")
    assert dense is None or dense.fwd_post_sync_s == 0


def test_a_long_kernel_issued_after_a_host_bound_stretch_runs_past_the_host():
    """run_clocks op by op: a stretch of short kernels (ten launches, little device work)
    leaves the device idle, and the one long GEMM issued after it starts only then; as
    one block the same work would take max(host, device)."""
    from primus_ext.project.stages import run_clocks
    ops = [(1.0, 0.1, False, 10), (0.1, 1.0, False, 1)]
    assert run_clocks(ops, 0.0) == pytest.approx(2.1)
    assert run_clocks([(1.1, 1.1, False)], 0.0) == pytest.approx(1.1)


def test_the_moe_layer_op_by_op_sums_to_the_layer():
    """compute/issue.py: megatron-core's MoE forward (the alltoall dispatcher's
    read-back of the token counts before the all-to-all) op by op: the host seconds of
    the steps sum to the layer's forward host time, those after the read-back to its
    post-sync host time; one step synchronises; the device seconds are the ops'
    compute. The backward the same, with its recompute, and no read-back."""
    lc = _moe()
    steps = lc.fwd_issue
    assert steps and sum(1 for *_, sync in steps if sync) == 1
    at = next(i for i, (*_, sync) in enumerate(steps) if sync)
    assert sum(h for h, *_ in steps) == pytest.approx(lc.fwd_host_s)
    assert sum(h for h, *_ in steps[at + 1:]) == pytest.approx(lc.fwd_post_sync_host_s)
    assert sum(d for _, d, *_ in steps) == pytest.approx(lc.fwd_s)
    back = lc.bwd_issue
    assert back and not any(sync for *_, sync in back)
    assert sum(h for h, *_ in back) == pytest.approx(lc.bwd_host_s)
    assert sum(d for _, d, *_ in back) == pytest.approx(
        lc.bwd_input_s + lc.bwd_weight_s + lc.recompute_s)


def test_grouped_linear_host_time_follows_megatron_cores_num_gemms():
    """TEGroupedMLP builds linear_fc1 and linear_fc2 with ``num_local_experts`` GEMMs each
    (megatron-core moe/experts.py); TE's GroupedLinear pays host time per GEMM (TE issue
    1499), one per expert in the forward and two (dgrad, wgrad) in the backward."""
    import inspect
    import re

    from megatron.core.transformer.moe import experts

    from primus_ext.compute.host import layer_parts
    src = inspect.getsource(experts.TEGroupedMLP.__init__)
    for fc in ("linear_fc1", "linear_fc2"):
        assert re.search(rf"self\.{fc} = build_module\(\s*submodules\.{fc},\s*"
                         r"self\.num_local_experts", src), fc
    spec = parse_launch_args(MOE).spec
    local = spec.model.num_moe_experts // spec.parallel.ep
    f, b = layer_parts(spec, moe=True)["mlp"]
    assert (f.expert_gemms, b.expert_gemms) == (2 * local, 4 * local)
    hw = spec.cluster.hardware
    assert f.seconds(hw, te=True) - f.seconds(hw, te=False) == pytest.approx(
        f.te_calls * hw.te_module_host_s + 2 * local * hw.te_grouped_gemm_host_s)
    # without a grouped GEMM each expert is a TE module of its own (te_calls), not a GEMM
    # of a GroupedLinear call.
    seq = parse_launch_args([a for a in MOE if a != "--moe-grouped-gemm"]).spec
    assert layer_parts(seq, moe=True)["mlp"][0].expert_gemms == 0
