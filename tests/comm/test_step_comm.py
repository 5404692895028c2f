"""Pipeline p2p, data-parallel gradient sync, parameter gather, their overlap rule."""
from __future__ import annotations

from dataclasses import replace

import pytest

from primus_ext.comm.collectives import group_collective_s
from primus_ext.comm.overlap import exposed_s
from primus_ext.comm.step_comm import dp_grad_sync, exposed_dp_s, p2p_bytes, p2p_time_s, \
    param_gather, param_gather_s
from primus_ext.project.optimizer import optimizer_step_s, updated_params
from primus_ext.compute.rank_params import stage_param_counts
from primus_ext.presets import hardware_preset
from primus_ext.spec import ClusterSpec, ModelSpec, ParallelSpec, RunSpec, TrainSpec

LLAMA = ModelSpec(name="llama8b", num_layers=32, hidden_size=4096, num_attention_heads=32,
                  num_query_groups=8, ffn_hidden_size=14336, vocab_size=128256)
MOE = ModelSpec(name="moe", num_layers=16, hidden_size=4096, num_attention_heads=32,
                num_query_groups=8, num_moe_experts=64, moe_router_topk=4,
                moe_ffn_hidden_size=1408)


def spec(model=LLAMA, nodes=4, hw="h100", **par) -> RunSpec:
    return RunSpec(model=model, parallel=ParallelSpec(**par),
                   train=TrainSpec(seq_length=8192, global_batch_size=1024),
                   cluster=ClusterSpec(hardware=hardware_preset(hw), num_nodes=nodes))


def test_p2p_message_and_link():
    s = spec(tp=4, pp=4, sequence_parallel=True)
    assert p2p_bytes(s) == 8192 * 4096 * 2 / 4
    # tp*cp*dp = 8 per stage: every boundary leaves the node
    inside = spec(tp=2, pp=4, nodes=1, sequence_parallel=True)
    assert p2p_time_s(s) > p2p_time_s(inside)
    assert p2p_time_s(spec(tp=8, nodes=1)) == 0.0


def test_distributed_optimizer_reduce_scatters_and_gathers():
    ddp = spec(tp=8, use_distributed_optimizer=False)
    dist = spec(tp=8)
    n = 1e9
    ar = dp_grad_sync(ddp, n)
    rs = dp_grad_sync(dist, n)
    assert rs.total_s == pytest.approx(ar.total_s / 2, rel=0.1)
    assert rs.num_bytes == 4 * n  # fp32 gradients with --bf16
    assert param_gather(ddp, n).total_s == 0
    assert param_gather_s(dist, n) == pytest.approx(rs.total_s / 2, rel=0.1)  # bf16 params


@pytest.mark.parametrize("recipe, gathered", [("tensorwise", 1), ("delayed", 1),
                                              ("blockwise", 1), ("mxfp8", 2)])
def test_fp8_param_gather_gathers_the_fp8_storage(recipe, gathered):
    """megatron-core keeps a Float8Tensor parameter's buffer as torch.uint8 and gathers
    it (distributed_data_parallel.py); MXFP8 parameters are gathered in bf16 through the
    grad buffer (param_and_grad_buffer.py reuse_grad_buf_for_mxfp8_param_ag)."""
    def run(**train):
        s = spec(tp=8)
        return replace(s, train=replace(s.train, **train))
    n = 1e9
    bf16 = param_gather(run(), n)
    fp8 = param_gather(run(precision="fp8", fp8_recipe=recipe, fp8_param_gather=True), n)
    plain = param_gather(run(precision="fp8", fp8_recipe=recipe), n)
    assert bf16.num_bytes == plain.num_bytes == 2 * n
    assert fp8.num_bytes == gathered * n


def test_buckets_follow_overlap_grad_reduce():
    n = 1e9
    on = dp_grad_sync(spec(tp=8), n)
    off = dp_grad_sync(spec(tp=8, overlap_grad_reduce=False), n)
    assert on.num_buckets == 25 and off.num_buckets == 1
    assert on.first_bucket_s < on.total_s / 20


def test_expert_gradients_use_the_expert_dp_group():
    s = spec(MOE, tp=1, ep=8)
    dense_only = dp_grad_sync(s, 1e8)
    both = dp_grad_sync(s, 1e8, 1e9)
    assert both.total_s > dense_only.total_s
    assert group_collective_s(s, "edp", "reduce_scatter", 1e9) > 0


def test_exposure_rule():
    s = spec(tp=8)
    sync = dp_grad_sync(s, 1e9)
    assert exposed_dp_s(s, sync, 0.0) == pytest.approx(sync.total_s)
    long = exposed_dp_s(s, sync, 10.0)
    assert sync.first_bucket_s <= long < 0.2 * sync.total_s
    off = spec(tp=8, overlap_grad_reduce=False)
    assert exposed_dp_s(off, dp_grad_sync(off, 1e9), 10.0) == dp_grad_sync(off, 1e9).total_s
    hw = hardware_preset("h100")
    assert exposed_s(hw, 1.0, None) == 1.0
    assert exposed_s(hw, 1.0, 0.4) == pytest.approx(0.6 + hw.comm_overlap_penalty * 0.4)


def test_stage_params_and_optimizer():
    s = spec(tp=2, pp=4)
    dense, expert = stage_param_counts(s, 0)
    total = sum(stage_param_counts(s, i)[0] for i in range(4)) * 2
    assert total == pytest.approx(8.03e9, rel=0.02)
    assert expert == 0
    assert updated_params(s, dense) == pytest.approx(dense / s.dp)
    assert optimizer_step_s(s, dense) < optimizer_step_s(
        spec(tp=2, pp=4, use_distributed_optimizer=False), dense)


def test_fsdp_has_no_step_sync():
    s = spec(tp=1, fsdp=True)
    assert dp_grad_sync(s, 1e9).total_s == 0 and param_gather(s, 1e9).total_s == 0


def test_stage_counts_tuple_is_accepted():
    s = spec(MOE, tp=1, ep=8)
    counts = stage_param_counts(s, 0)
    assert counts[1] > 0
    assert dp_grad_sync(s, counts) == dp_grad_sync(s, *counts)
    assert optimizer_step_s(s, counts) == optimizer_step_s(s, *counts)
