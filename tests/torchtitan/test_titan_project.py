"""Projecting torchtitan runs: the costed layout, GPipe's order, and the published
torchtitan benchmark rows (pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md)
read with torchtitan's semantics."""
import pytest

import primus_ext
from primus_ext.modes.validate import validate
from primus_ext.project.schedule import ScheduleInput, simulate
from primus_ext.project.torchtitan import SAC_MODULES, simulated_view
from primus_ext.project.validate import percentile
from primus_ext.published import DEFAULT_PATH
from tests.project.dispatch_count import forward_backward_ops

BASE = ["framework=torchtitan", "model=llama3_8b", "cluster.hardware=h100",
        "cluster.num_nodes=4", "train.global_batch_size=64"]


def test_costed_layout_follows_torchtitan():
    spec = primus_ext.compose(BASE + ["parallel.tp=2", "train.compile=true",
                                      "train.activation_checkpoint=selective"])
    view = simulated_view(spec)
    assert view.parallel.fsdp and not view.parallel.use_distributed_optimizer
    assert view.train.fused_elementwise and view.train.flash_attn_impl == "fa2"
    assert view.train.recompute_modules == SAC_MODULES
    pp = simulated_view(primus_ext.compose(BASE + ["parallel.pp=4"]))
    # Under PP FSDP2 gathers once and reduce-scatters once per step.
    assert pp.parallel.use_distributed_optimizer and not pp.parallel.fsdp
    assert pp.layout.layers_per_virtual_stage == (8, 9, 8, 7)
    gp = simulated_view(primus_ext.compose(BASE + ["parallel.pp=4", "parallel.schedule=GPipe"]))
    assert gp.parallel.resolved_schedule == "fill_drain"


def test_compile_and_checkpointing_move_the_step_the_right_way():
    def tok(*extra):
        return primus_ext.project(primus_ext.compose(BASE + list(extra))).tokens_per_s_per_gpu
    assert tok("train.compile=true") > tok()
    assert tok("train.activation_checkpoint=full") < tok("train.activation_checkpoint=selective") < tok()


@pytest.mark.parametrize("p,m", [(2, 2), (4, 8), (8, 32)])
def test_fill_drain_step_is_gpipe(p, m):
    # GPipe (Huang et al. 2019): (m + p - 1) forward slots, then as many backward slots.
    f, b = 1.0, 2.0
    inp = ScheduleInput(num_stages=p, num_chunks=1, num_microbatches=m,
                        fwd_s=((f,),) * p, bwd_input_s=((b * 0.6,),) * p,
                        bwd_weight_s=((b * 0.4,),) * p, p2p_s=0.0, schedule="fill_drain")
    assert simulate(inp).step_s == pytest.approx((m + p - 1) * (f + b), rel=1e-9)


@pytest.fixture(scope="module")
def titan_rows():
    rows = [r for r in validate(DEFAULT_PATH, "default") if "torchtitan" in r.source]
    assert len(rows) == 18
    return rows


def test_published_torchtitan_rows(titan_rows):
    for r in titan_rows:
        assert r.estimate is not None, r.error
    errs = [abs(r.rel_error) for r in titan_rows]
    # The project's acceptance median; no row off by more than 30 %. The farthest are
    # the 8B long-context CP 4-8 rows (about +21 and +26 % calibrated): their measured
    # attention rate drops by a third from CP 2 to CP 4 at the same tokens per rank,
    # which no modelled cost explains (docs/accuracy.md, Known gaps).
    assert percentile(errs, 50) <= 0.10
    assert max(errs) <= 0.30


def test_sac_recomputes_what_torchtitan_s_policy_does_not_save():
    """SelectiveAC saves mm / SDPA outputs except every second mm: per block the norms,
    RoPE, residual adds, the SwiGLU activation, wo and w3 (half of the fused fc1 here)
    run again in backward; nothing of attention or of wqkv / w1 / w2 does."""
    from primus_ext.compute.layer_ops import decoder_layer_ops
    from primus_ext.compute.ops import Shapes
    from primus_ext.project.simulate_backend import simulate_layer_costs
    spec = simulated_view(primus_ext.compose(BASE + ["train.activation_checkpoint=selective"]))
    ops = {o.name: o for o in decoder_layer_ops(Shapes(spec), moe=False, window=None)}
    expect = sum(o.fwd_s for o in ops.values()
                 if o.module in ("layernorm", "rope", "bda", "proj") or o.name == "act")
    expect += ops["fc1"].fwd_s / 2
    dense = simulate_layer_costs(spec).kinds["dense"]
    assert dense.recompute_s == pytest.approx(expect, rel=1e-12)
    assert ops["core_attn"].fwd_s > 0 and expect < 0.5 * dense.fwd_s


def test_hsdp_costs_one_replica():
    job = ["framework=torchtitan", "model=llama3_70b", "cluster.hardware=h100",
           "cluster.num_nodes=4", "parallel.tp=2", "train.global_batch_size=64",
           "train.activation_checkpoint=full"]
    fsdp = primus_ext.compose(job)
    hsdp = primus_ext.compose(job + ["parallel.dp_replicate=4"])
    view = simulated_view(hsdp)
    # One replica: a node of 8 ranks, FSDP2 over its 4 dp_shard ranks, same microbatches.
    assert (view.world_size, view.dp, view.num_microbatches) == (8, 4, hsdp.num_microbatches)
    e_h, e_r = primus_ext.project(hsdp), primus_ext.project(view)
    # One replica's FSDP2 traffic stays inside the node: less than FSDP over 16 ranks.
    assert e_r.breakdown["dp_comm_s"] < primus_ext.project(fsdp).breakdown["dp_comm_s"]
    # The replicas' all-reduce (FSDP2 foreach_reduce on the 2-D mesh, every microbatch)
    # comes on top, all of it data-parallel communication.
    from primus_ext.project.torchtitan import replica_all_reduce_s
    secs, _ = replica_all_reduce_s(hsdp, (0.0,))
    # (The FSDP group's host pauses are a share of each step: compared without them.)
    def net(e):
        return e.step_time_s - e.breakdown["host_pause_s"]
    extra = net(e_h) - net(e_r)
    assert 0 < extra < secs[0]
    assert e_h.breakdown["dp_comm_s"] == pytest.approx(e_r.breakdown["dp_comm_s"] + extra)
    assert any(n.startswith("HSDP (dp_replicate=4): one replica") for n in e_h.notes)
    # Memory: parameters sharded over 4 ranks instead of 16.
    assert primus_ext.memory(hsdp).stages[0].optimizer_bytes > \
        3.9 * primus_ext.memory(fsdp).stages[0].optimizer_bytes


@pytest.mark.parametrize("sp", [True, False])
def test_sac_recompute_reissues_the_collectives_torchtitan_does_not_save(sp):
    """torchtitan's save list (``_get_default_save_ops``) keeps reduce-scatter outputs and
    no all-gather / all-reduce (checked against the source in test_titan_act_tensors.py):
    under SAC with SP the backward runs both SP all-gathers again (attention and FFN
    inputs) and no reduce-scatter; without SP both TP all-reduces run again."""
    from primus_ext.project.simulate_backend import simulate_layer_costs
    spec = simulated_view(primus_ext.compose(
        BASE + ["parallel.tp=2", f"parallel.sequence_parallel={str(sp).lower()}",
                "train.activation_checkpoint=selective"]))
    comms = simulate_layer_costs(spec).kinds["dense"].comms
    again = sorted((c.collective, c.name.split(".")[0]) for c in comms
                   if c.name.endswith(".recompute"))
    # FSDP2's own gathers run outside the checkpointed block (not re-issued).
    fwd = sorted((c.collective, c.name.split(".")[0]) for c in comms if c.phase == "fwd"
                 and c.axis == "tp" and c.collective != "reduce_scatter")
    assert again == fwd and len(again) == 2
    assert {c for c, _ in again} == ({"all_gather"} if sp else {"all_reduce"})
    for c in comms:
        if c.name.endswith(".recompute"):
            assert c.phase == "bwd"


def test_loss_parallel_all_reduces_per_loss_chunk():
    """torchtitan runs lm_head + vocab-parallel cross-entropy per sequence chunk
    (ChunkedLossWrapper, its llama3 configs' loss): 3 all-reduces per chunk, each over the
    chunk's tokens in fp32 (a measured TP 2 run issues 24 a microbatch of seq/8 x 4 B)."""
    loss = pytest.importorskip("torchtitan.components.loss")
    from primus_ext.project.simulate_backend import simulate_layer_costs
    chunks = loss.ChunkedLossWrapper.Config().num_chunks
    spec = primus_ext.compose(BASE + ["parallel.tp=2"])
    view = simulated_view(spec)
    assert view.train.loss_chunks == chunks
    ce = [op for op in simulate_layer_costs(view).kinds["output"].comms
          if op.name == "output.ce_tp_all_reduce"]
    assert len(ce) == 1 and ce[0].calls == 3 * chunks
    tokens = spec.train.micro_batch_size * spec.train.seq_length
    assert ce[0].num_bytes == pytest.approx(3 * tokens * 4, rel=1e-6)  # total unchanged
    meg = simulate_layer_costs(primus_ext.compose(
        [o for o in BASE if not o.startswith("framework=")] + ["parallel.tp=2"]))
    assert [op.calls for op in meg.kinds["output"].comms
            if op.name == "output.ce_tp_all_reduce"] == [3]  # megatron-core: one loss


def test_full_checkpointing_stops_early_as_torchtitans_wrapper_does():
    """torchtitan's full AC wraps each block in torch's checkpoint_wrapper (default
    CheckpointImpl.NO_REENTRANT). On a block with torchtitan's Llama op order, torch
    re-runs every GEMM but w2 in backward; the projection recomputes the same."""
    torch = pytest.importorskip("torch")
    from torch import nn
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        checkpoint_wrapper)
    from torch.nn import functional as F

    class Block(nn.Module):  # torchtitan models/llama/model.py TransformerBlock order
        def __init__(self, d: int = 32, heads: int = 4):
            super().__init__()
            self.heads = heads
            self.attention_norm, self.ffn_norm = nn.RMSNorm(d), nn.RMSNorm(d)
            self.wq, self.wk, self.wv, self.wo = (nn.Linear(d, d, bias=False)
                                                  for _ in range(4))
            self.w1, self.w3 = nn.Linear(d, 4 * d, bias=False), nn.Linear(d, 4 * d, bias=False)
            self.w2 = nn.Linear(4 * d, d, bias=False)

        def forward(self, x):
            b, t, d = x.shape
            h = self.attention_norm(x)
            q, k, v = (w(h).view(b, t, self.heads, -1).transpose(1, 2)
                       for w in (self.wq, self.wk, self.wv))
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.wo(a.transpose(1, 2).reshape(b, t, d))
            h = self.ffn_norm(x)
            return x + self.w2(F.silu(self.w1(h)) * self.w3(h))

    torch.manual_seed(0)
    block, x = checkpoint_wrapper(Block()), torch.randn(2, 8, 32, requires_grad=True)
    fwd, bwd = forward_backward_ops(lambda: block(x))
    fwd_mm, rerun_mm = fwd.count("mm"), bwd.count("mm")
    # Backward itself runs two mm per linear (dgrad, wgrad): what is left was re-run.
    assert fwd_mm == 7 and rerun_mm - 2 * fwd_mm == 6
    view = simulated_view(primus_ext.compose(BASE + ["train.activation_checkpoint=full"]))
    assert view.train.recompute_granularity == "full" and view.train.recompute_early_stop


def test_async_tp_sums_the_partials_on_the_compute_stream():
    """torch's fused matmul-reduce-scatter (inductor's micro-pipeline TP, torchtitan's
    async TP) ends with a ``torch.sum`` over the ``tp`` partials it received: the
    installed torch still does, and the projection costs that read of the whole GEMM
    output and write of the local rows after each forward row-parallel GEMM (attention
    output, MLP down projection), not re-run after w2 under full AC's early stop."""
    pytest.importorskip("torch")
    import inspect

    from torch.distributed import _symmetric_memory as symm

    from primus_ext.compute.layer_ops import decoder_layer_ops
    from primus_ext.compute.ops import Shapes
    from primus_ext.project.simulate_backend import early_stop_ops
    src = inspect.getsource(symm._fused_matmul_reduce_scatter_impl)
    assert "partial(torch.sum, dim=0)" in src and "return reduce_fn(" in src
    assert "stacked_partials" in src
    tp = ["parallel.tp=8", "train.compile=true", "parallel.sequence_parallel=true"]
    plain = Shapes(simulated_view(primus_ext.compose(BASE + tp)))
    sh = Shapes(simulated_view(primus_ext.compose(BASE + tp + ["parallel.tp_comm_overlap=true"])))
    ops = decoder_layer_ops(sh, moe=False, window=None)
    base = decoder_layer_ops(plain, moe=False, window=None)
    extra = [o for o in ops if o.name not in {b.name for b in base}]
    assert [(o.name, o.module) for o in extra] == [("proj_partials_sum", "proj"),
                                                   ("fc2_partials_sum", "mlp")]
    want = (sh.tokens + sh.tokens // 8) * sh.hidden * 2
    assert all(o.fwd_bytes == want and o.bwd_bytes == 0 for o in extra)
    rerun = [o.name for o in early_stop_ops(ops, 0.0)]
    assert "proj_partials_sum" in rerun and "fc2" not in rerun
    assert "fc2_partials_sum" not in rerun
