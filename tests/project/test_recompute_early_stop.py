"""Full recompute under torch's non-reentrant checkpoint (llm-foundry / Composer:
checkpoint_wrapper(CheckpointImpl.NO_REENTRANT) around each MPTBlock) stops at the
block's last saved tensor: the MLP's second GEMM and the residual add after it are not
re-run. Checked against torch.utils.checkpoint itself on a block with the op order of
llm-foundry v0.3.0 llmfoundry/models/layers/blocks.py MPTBlock.forward."""
from __future__ import annotations

from dataclasses import replace

import pytest

from primus_ext.compute.layer_ops import attention_ops, mlp_block_ops
from primus_ext.compute.ops import Shapes
from primus_ext.project.simulate_backend import early_stop_ops, simulate_layer_costs
from primus_ext import published
from primus_ext.published import read_runs
from tests.project.dispatch_count import forward_backward_ops


def _torch_recomputed_ops(dropout: float) -> tuple[int, int, int]:
    """(forward addmm, addmm re-run in backward, adds re-run in backward) of one MPT
    block under torch.utils.checkpoint(use_reentrant=False), counted by dispatch."""
    torch = pytest.importorskip("torch")
    from torch import nn
    from torch.nn import functional as F
    from torch.utils.checkpoint import checkpoint

    class MPTBlock(nn.Module):
        # norm_1, Wqkv, attention, out_proj, residual; norm_2, up_proj, GELU, down_proj,
        # residual (resid_pdrop: the dropout before each residual add).
        def __init__(self, d: int = 32, heads: int = 4):
            super().__init__()
            self.heads = heads
            self.norm_1, self.norm_2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.Wqkv, self.out_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.up_proj, self.down_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
            self.drop = nn.Dropout(dropout)

        def forward(self, x):
            b, t, d = x.shape
            q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2)
                       for z in self.Wqkv(self.norm_1(x)).chunk(3, -1))
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.drop(self.out_proj(a.transpose(1, 2).reshape(b, t, d)))
            return x + self.drop(self.down_proj(F.gelu(self.up_proj(self.norm_2(x)))))

    torch.manual_seed(0)
    block, x = MPTBlock(), torch.randn(2, 8, 32, requires_grad=True)
    counts = []
    for ckpt in (False, True):
        fwd, bwd = forward_backward_ops(
            lambda: checkpoint(block, x, use_reentrant=False) if ckpt else block(x))
        counts.append((fwd.count("addmm"), bwd.count("addmm"), bwd.count("add")))
    (f0, b0, a0), (f1, b1, a1) = counts
    assert f0 == f1 and b0 == 0  # without checkpointing the backward runs no addmm
    return f1, b1, a1 - a0


def _dense_ops():
    run = next(r for r in read_runs() if r.run_id == "P075")  # MPT-70B, checkpointed
    sh = Shapes(run.spec)
    return attention_ops(sh, None) + mlp_block_ops(sh, False)


def test_early_stop_skips_the_last_gemm_and_residual_as_torch_does():
    fwd_gemms, rerun_gemms, rerun_adds = _torch_recomputed_ops(dropout=0.0)
    assert (fwd_gemms, rerun_gemms, rerun_adds) == (4, 3, 1)
    ops = _dense_ops()
    kept = early_stop_ops(ops, hidden_dropout=0.0)
    gemms = [o.name for o in ops if o.wgrad_flops > 0]
    kept_gemms = [o.name for o in kept if o.wgrad_flops > 0]
    assert len(gemms) == fwd_gemms and len(kept_gemms) == rerun_gemms
    assert [o.name for o in ops if o not in kept] == ["fc2", "mlp_bda"]
    bdas = [o.name for o in kept if o.name.endswith("_bda")]
    assert len(bdas) == rerun_adds  # the attention residual add is re-run, the MLP's not


def test_with_dropout_after_the_gemm_torch_reruns_it():
    # The dropout mask is saved after the GEMM ran, so the recompute runs it again.
    fwd_gemms, rerun_gemms, _ = _torch_recomputed_ops(dropout=0.1)
    assert rerun_gemms == fwd_gemms == 4
    ops = _dense_ops()
    assert early_stop_ops(ops, hidden_dropout=0.1) == ops


def test_llm_foundry_recompute_charges_the_early_stopped_forward():
    run = next(r for r in read_runs() if r.run_id == "P075")
    spec = run.spec
    assert spec.train.recompute_early_stop is True
    assert any("NO_REENTRANT" in n for n in run.notes)
    ops = _dense_ops()
    with_stop = simulate_layer_costs(spec).kinds["dense_recompute"]
    whole = simulate_layer_costs(replace(spec, train=replace(
        spec.train, recompute_early_stop=False))).kinds["dense_recompute"]
    skipped = sum(o.fwd_s for o in ops if o.name in ("fc2", "mlp_bda"))
    assert whole.recompute_s == pytest.approx(with_stop.fwd_s)
    assert with_stop.recompute_s == pytest.approx(whole.recompute_s - skipped)
    assert with_stop.fwd_s == whole.fwd_s  # the forward itself is unchanged


def _torch_flex_block_calls() -> dict[str, int]:
    """Forward calls of a dispatch and a combine autograd Function that, like DeepEP's
    (megatron-core fused_a2a.py FusedDispatch / FusedCombine, copied in NeMo AutoModel
    components/moe/megatron/fused_a2a.py), keep their state on ``ctx`` and save no
    tensor, in a block ending combine -> residual add, under torch's non-reentrant
    checkpoint (NeMo AutoModel moe/parallelizer.py apply_ac: checkpoint_wrapper)."""
    torch = pytest.importorskip("torch")
    from torch import nn
    from torch.utils.checkpoint import checkpoint
    calls = {"dispatch": 0, "combine": 0}

    def fn(name):
        class F(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                calls[name] += 1
                ctx.handle = (x.shape,)  # state on ctx, as DeepEP's handle
                return x * 1.0

            @staticmethod
            def backward(ctx, g):
                return g
        return F

    dispatch, combine = fn("dispatch"), fn("combine")

    class Block(nn.Module):
        def __init__(self, d: int = 16):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)

        def forward(self, x):
            y = dispatch.apply(x)
            y = self.fc2(torch.relu(self.fc1(y)))  # the experts (save their inputs)
            y = y.index_select(0, torch.arange(y.shape[0]))  # unpermute (saves index)
            return x + combine.apply(y)

    blk = Block()
    x = torch.randn(8, 16, requires_grad=True)
    checkpoint(blk, x, use_reentrant=False).sum().backward()
    return calls


def test_early_stop_does_not_reissue_the_flex_combine():
    calls = _torch_flex_block_calls()
    assert calls == {"dispatch": 2, "combine": 1}  # torch re-runs the dispatch only
    run = {r.run_id: r for r in _published()}["P111"]  # NeMo AutoModel, full AC
    spec = run.spec
    assert spec.train.recompute_early_stop
    assert spec.parallel.moe_token_dispatcher_type == "flex"
    names = {c.name for c in simulate_layer_costs(spec).kinds["moe_recompute"].comms}
    assert "moe.ep_dispatch.recompute" in names
    assert "moe.ep_combine.recompute" not in names


def _published() -> list:
    """The published runs of the public set (the MoE rows among them)."""
    return read_runs(published.DEFAULT_PATH)
