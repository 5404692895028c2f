"""The host clock (compute/host.py, project/stages.py, project/host_step.py): each
mechanism against the megatron-core / Megatron-LM source line it follows."""
import dataclasses

import pytest

from primus_ext.frameworks.megatron.args import parse_launch_args
from primus_ext.project.estimate import project
from primus_ext.project.host_step import p2p_host_s
from primus_ext.project.simulate_backend import simulate_layer_costs
from primus_ext.project.stages import two_clocks

SMALL = ["--num-layers", "12", "--hidden-size", "512", "--num-attention-heads", "8",
         "--seq-length", "1024", "--max-position-embeddings", "1024", "--micro-batch-size",
         "4", "--global-batch-size", "32", "--bf16", "--vocab-size", "50257",
         "--target-hardware", "h100", "--target-nodes", "1", "--target-gpus-per-node", "8"]


def _spec(*extra):
    return parse_launch_args(SMALL + list(extra)).spec


def _no_host(spec):
    hw = dataclasses.replace(spec.cluster.hardware, host_clock=False)
    return dataclasses.replace(spec, cluster=dataclasses.replace(spec.cluster, hardware=hw))


def test_two_clocks_take_the_slower_and_drain_at_syncs():
    assert two_clocks(1.0, 0.5, 0, 1e-5) == 1.0
    assert two_clocks(0.5, 1.0, 0, 1e-5) == 1.0
    assert two_clocks(1.0, 0.5, 3, 1e-5) == pytest.approx(1.0 + 3e-5)


def test_a_small_model_is_host_bound_and_a_large_one_is_not():
    """Megatron-LM's functional-test model (12 x 512) spends most of its step issuing
    work; Llama 3 70B at 8k tokens per microbatch hides the host behind its GEMMs."""
    small = _spec("--tensor-model-parallel-size", "2")
    est = project(small, calibration=None)
    dev = project(_no_host(small), calibration=None)
    assert est.step_time_s > 2 * dev.step_time_s
    assert est.breakdown["host_s"] > 0.5 * est.step_time_s
    assert sum(est.breakdown.values()) == pytest.approx(est.step_time_s, rel=1e-9)
    big = parse_launch_args(
        ["--num-layers", "80", "--hidden-size", "8192", "--num-attention-heads", "64",
         "--group-query-attention", "--num-query-groups", "8", "--ffn-hidden-size",
         "28672", "--swiglu", "--seq-length", "8192", "--max-position-embeddings", "8192",
         "--micro-batch-size", "1",
         "--global-batch-size", "64", "--bf16", "--vocab-size", "128256",
         "--tensor-model-parallel-size", "8", "--pipeline-model-parallel-size", "4",
         "--target-hardware", "h100", "--target-nodes", "4",
         "--target-gpus-per-node", "8"]).spec
    e = project(big, calibration=None)
    assert e.breakdown["host_s"] < 0.03 * e.step_time_s
    # per layer kind, in the JSON: the small model's layers are host-bound, the big not
    assert est.to_dict()["layer_clocks"]["dense"]["host_bound_share"] > 0.5
    assert e.to_dict()["layer_clocks"]["dense"]["host_bound_share"] == 0.0


def test_cuda_graphs_replace_the_captured_parts_host_work():
    """--cuda-graph-impl transformer_engine --cuda-graph-scope attn: the attention block
    replays one graph; without a scope the whole layer does (megatron-core
    CudaGraphModule); the step gets faster where the host sets it."""
    plain = simulate_layer_costs(_spec()).kinds["dense"]
    attn = simulate_layer_costs(_spec("--cuda-graph-impl", "transformer_engine",
                                      "--cuda-graph-scope", "attn")).kinds["dense"]
    layer = simulate_layer_costs(_spec("--external-cuda-graph")).kinds["dense"]
    assert layer.fwd_host_s < attn.fwd_host_s < plain.fwd_host_s
    assert layer.fwd_s == plain.fwd_s  # the device runs the same kernels
    assert project(_spec("--external-cuda-graph"), calibration=None).step_time_s < \
        project(_spec(), calibration=None).step_time_s


def test_dropless_moe_stays_outside_a_layer_graph():
    """A dropless MoE layer's routed part syncs with the host (the token counts), so a
    whole-layer graph captures only its attention; padded to capacity it is static."""
    moe = ["--num-experts", "8", "--moe-router-topk", "2", "--moe-grouped-gemm",
           "--moe-token-dispatcher-type", "alltoall", "--external-cuda-graph"]
    dropless = simulate_layer_costs(_spec(*moe)).kinds["moe"]
    padded = simulate_layer_costs(_spec(*moe, "--moe-expert-capacity-factor", "1.0",
                                        "--moe-pad-expert-input-to-capacity")).kinds["moe"]
    assert dropless.fwd_syncs == 1 and padded.fwd_syncs == 0
    assert padded.fwd_host_s < dropless.fwd_host_s


def test_sinkhorn_reads_back_every_iteration():
    """megatron-core moe_utils.sinkhorn: ``while error > tol`` on the host."""
    moe = ["--num-experts", "8", "--moe-router-topk", "1", "--moe-grouped-gemm"]
    aux = simulate_layer_costs(_spec(*moe)).kinds["moe"]
    sk = simulate_layer_costs(_spec(*moe, "--moe-router-load-balancing-type",
                                    "sinkhorn")).kinds["moe"]
    assert sk.fwd_syncs > aux.fwd_syncs and sk.fwd_host_s > aux.fwd_host_s


def test_deterministic_mode_fills_allocations():
    det = simulate_layer_costs(_spec("--deterministic-mode")).kinds["dense"]
    plain = simulate_layer_costs(_spec()).kinds["dense"]
    assert det.fwd_host_s > plain.fwd_host_s


def test_p2p_synchronises_only_without_interleaving():
    """p2p_communication.py: torch.cuda.synchronize() after a batched p2p, and
    Megatron-LM batches p2p only without --overlap-p2p-communication (interleaved)."""
    pp = _spec("--pipeline-model-parallel-size", "4")
    vp = _spec("--pipeline-model-parallel-size", "4",
               "--num-layers-per-virtual-pipeline-stage", "1")
    hw = pp.cluster.hardware
    assert p2p_host_s(pp) == pytest.approx(hw.collective_host_s + hw.sync_s)
    assert p2p_host_s(vp) == pytest.approx(hw.collective_host_s)
    assert p2p_host_s(_spec()) == 0.0


def test_logging_read_backs_cost_host_time():
    """--log-params-norm and --log-num-zeros-in-grad read back every iteration."""
    base = project(_spec(), calibration=None).step_time_s
    logged = project(_spec("--log-params-norm", "--log-num-zeros-in-grad"),
                     calibration=None).step_time_s
    assert logged > base


def test_the_cpu_target_has_no_second_clock():
    spec = parse_launch_args(SMALL[:-6] + ["--target-hardware", "cpu", "--target-nodes",
                                           "1", "--target-gpus-per-node", "2"]).spec
    k = simulate_layer_costs(spec).kinds["dense"]
    assert k.fwd_host_s == 0.0 and k.bwd_host_s == 0.0
