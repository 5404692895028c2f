"""The bytes and kernels the projection charges for megatron-core's unfused RoPE and for
the clamps of ``--activation-func-clamp-value``, against aten's own count of
megatron-core's code run on this CPU: every non-view op the dispatcher sees is one
kernel, moving the bytes of its tensor inputs and outputs."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from sim_specs import llama70b, run

from primus_ext.compute.layer_ops import decoder_layer_ops
from primus_ext.compute.ops import Shapes, clamp_passes
from tests.project.dispatch_count import forward_backward_traffic


def _count(forward, grad_leaf):
    fwd, bwd = forward_backward_traffic(forward)
    grad_leaf.grad = None
    return fwd, bwd


def _ops(spec):
    return {o.name: o for o in decoder_layer_ops(Shapes(spec), moe=False, window=None)}


def test_unfused_rope_matches_megatron_core():
    rope_utils = pytest.importorskip("megatron.core.models.common.embeddings.rope_utils")
    from megatron.core.transformer.transformer_config import TransformerConfig

    s, b, heads, d = 128, 4, 32, 64
    cfg = TransformerConfig(num_layers=1, hidden_size=heads * d, num_attention_heads=heads,
                            apply_rope_fusion=False)
    t = torch.randn(s, b, heads, d, dtype=torch.bfloat16, requires_grad=True)
    freqs = torch.randn(s, 1, 1, d)
    # mscale != 1 (YaRN): megatron-core's fused path would fall back to this one too.
    fwd, bwd = _count(lambda: rope_utils.apply_rotary_pos_emb(
        t, freqs, cfg, mscale=1.35, cp_group=object()), t)
    big = t.numel() * t.element_size()
    passes_f = sum(c for _, c in fwd) / big
    passes_b = sum(c for _, c in bwd) / big

    spec = run(llama70b(num_layers=1, hidden_size=heads * d, num_attention_heads=heads,
                        num_query_groups=heads),
               train=dict(seq_length=s, micro_batch_size=b, apply_rope_fusion=False))
    sh = Shapes(spec)
    rope = _ops(spec)["rope"]
    e = sh.tokens * (sh.heads + sh.groups) * sh.head_dim * sh.act_bytes  # q and k
    # The small cos / sin kernels on the frequencies are counted as kernels, not bytes.
    assert rope.fwd_bytes / e == pytest.approx(passes_f, rel=0.05)
    assert rope.bwd_bytes / e == pytest.approx(passes_b, rel=0.05)
    assert rope.fwd_kernels == 2 * len(fwd)  # q and k: one call each
    assert rope.bwd_kernels == 2 * len(bwd)
    fused = _ops(dataclasses.replace(
        spec, train=dataclasses.replace(spec.train, apply_rope_fusion=True)))["rope"]
    assert rope.fwd_bytes > 5 * fused.fwd_bytes


def test_clamp_passes_match_megatron_core():
    geglu = pytest.importorskip("megatron.core.fusions.fused_bias_geglu")
    rows, w = 256, 512
    x = torch.randn(rows, 2 * w, dtype=torch.bfloat16, requires_grad=True)
    probs = torch.rand(rows, 1)

    def counted(clamp):
        return _count(lambda: geglu.weighted_bias_quick_geglu_impl(
            x, None, probs, False, 1.0, clamp), x)

    (f0, b0), (f1, b1) = counted(None), counted(7.0)
    half = rows * w * x.element_size()
    spec = run(llama70b(activation="quick_geglu", activation_func_clamp_value=7.0))
    cf, cb, kf, kb = clamp_passes(Shapes(spec))
    # What the clamp adds to the same fused call: the ops before the jit-fused function
    # and the gradients of those ops.
    assert (sum(c for _, c in f1) - sum(c for _, c in f0)) / half == pytest.approx(cf, rel=0.02)
    assert (sum(c for _, c in b1) - sum(c for _, c in b0)) / half == pytest.approx(cb, rel=0.02)
    assert len(f1) - len(f0) == kf
    # aten's scalar_tensor (a host-side constant, no device pass) is not a kernel here.
    assert len([o for o in b1 if o[0] != "scalar_tensor"]) - len(b0) == kb


def test_clamp_costs_only_where_megatron_core_runs_it():
    """The fused SwiGLU takes no clamp value (megatron-core runs it unclamped); no clamp,
    no cost; eager units clamp without the cat."""
    clamped = Shapes(run(llama70b(activation="quick_geglu", activation_func_clamp_value=7.0)))
    assert clamp_passes(clamped) == (8, 15, 3, 7)
    assert clamp_passes(Shapes(run(llama70b(activation_func_clamp_value=7.0)))) == (0, 0, 0, 0)
    assert clamp_passes(Shapes(run(llama70b(activation="quick_geglu")))) == (0, 0, 0, 0)
    eager = Shapes(run(llama70b(activation_func_clamp_value=7.0),
                       train=dict(fused_elementwise=False)))
    assert clamp_passes(eager) == (4, 11, 2, 6)
    with pytest.raises(ValueError, match="activation_func_clamp_value"):
        llama70b(activation_func_clamp_value=0.0)
