"""FLOPs of every op against hand formulas (Korthikanti et al. 2022; Megatron-LM)."""
from __future__ import annotations

import pytest
from sim_specs import dsv3, gpt_mha, llama70b, mixtral, run

from primus_ext.compute.layer_ops import decoder_layer_ops, moe_rows
from primus_ext.compute.model_flops import attention_flops_per_token, mlp_flops_per_token
from primus_ext.compute.ops import Shapes

LINEAR = {"qkv", "proj", "fc1", "fc2", "q_proj", "q_down", "q_up", "kv_down", "kv_up",
          "router", "experts_fc1", "experts_fc2", "shared_fc1", "shared_fc2"}


def _ops(spec, moe=False, window=None):
    return {o.name: o for o in decoder_layer_ops(Shapes(spec), moe=moe, window=window)}


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_gpt_forward_flops_equal_24bsh2_plus_4bs2h(tp):
    """Korthikanti et al. 2022 (Appendix): forward GEMM FLOPs of a GPT layer (MHA, GELU
    4h MLP) are 24 b s h^2 + 4 b s^2 h; the unfused path computes the full score matrix."""
    b, s, h = 2, 2048, 2048
    spec = run(gpt_mha(), tp=tp, sequence_parallel=tp > 1, nodes=1,
               train=dict(seq_length=s, micro_batch_size=b, global_batch_size=64,
                          attention_backend="unfused"))
    ops = _ops(spec)
    total = sum(o.fwd_flops for o in ops.values()) * tp
    assert total == pytest.approx(24 * b * s * h * h + 4 * b * s * s * h, rel=1e-12)
    # Flash with a causal mask counts the attention once (halved).
    spec = run(gpt_mha(), tp=tp, sequence_parallel=tp > 1,
               train=dict(seq_length=s, micro_batch_size=b, global_batch_size=64))
    ops = _ops(spec)
    assert ops["core_attn"].fwd_flops * tp == pytest.approx(2 * b * s * s * h)


def test_gemm_backward_is_twice_forward():
    ops = _ops(run(llama70b(), tp=8, sequence_parallel=True, train=dict(seq_length=8192)))
    for name, o in ops.items():
        if name in LINEAR:
            assert o.dgrad_flops == o.fwd_flops and o.wgrad_flops == o.fwd_flops
            assert o.fwd_flops + o.bwd_flops == pytest.approx(3 * o.fwd_flops)
        else:
            assert o.wgrad_flops == 0


@pytest.mark.parametrize("tp,cp", [(1, 1), (2, 2), (8, 1), (4, 2)])
def test_llama_matches_megatron_formula(tp, cp):
    """Per-rank GEMM FLOPs x (tp * cp) equal Megatron-LM's per-token count x tokens; the
    core attention forward equals its (causal-halved) attention term / 3."""
    s = 8192
    spec = run(llama70b(), tp=tp, cp=cp, sequence_parallel=tp > 1, nodes=1,
               train=dict(seq_length=s, global_batch_size=64))
    ops = _ops(spec)
    model = spec.model
    lin = sum(o.fwd_flops + o.bwd_flops for n, o in ops.items() if n in LINEAR) * tp * cp / s
    q = model.num_attention_heads * model.head_dim
    core = 6 * q * s
    expected = attention_flops_per_token(model, s) - core + mlp_flops_per_token(model, 0)
    assert lin == pytest.approx(expected, rel=1e-12)
    assert ops["core_attn"].fwd_flops * tp * cp / s == pytest.approx(core / 3)
    assert ops["core_attn"].bwd_flops == pytest.approx(2.5 * ops["core_attn"].fwd_flops)


def test_mla_projections_match_megatron_formula():
    s = 4096
    spec = run(dsv3(), tp=4, sequence_parallel=True, ep=8, pp=1, nodes=4,
               train=dict(seq_length=s, global_batch_size=64))
    ops = _ops(spec, moe=True)
    m = spec.model
    lin = sum(ops[n].fwd_flops * 3 for n in ("q_down", "q_up", "kv_down", "kv_up", "proj"))
    per_token = lin * 4 / s
    qk = m.qk_head_dim + m.qk_pos_emb_head_dim
    core = 6 * m.num_attention_heads * (qk + m.v_head_dim) * s / 2
    # Megatron's formula adds one FLOP per latent element (the +1 terms): negligible.
    assert per_token == pytest.approx(attention_flops_per_token(m, s) - core, rel=1e-3)


@pytest.mark.parametrize("tp,ep,etp", [(1, 8, 1), (2, 4, 1), (2, 2, 2), (4, 8, 4)])
def test_expert_flops_per_token_are_topk_experts(tp, ep, etp):
    """Balanced routing: each token costs topk expert MLPs; summed over the ranks sharing
    the tokens (tp), a rank's expert FLOPs per token are 3 * 2 * topk * h * ffn (SwiGLU)."""
    s = 4096
    spec = run(mixtral(), tp=tp, ep=ep, etp=etp, sequence_parallel=tp > 1, nodes=4,
               train=dict(seq_length=s, global_batch_size=256))
    ops = _ops(spec, moe=True)
    m = spec.model
    per_token = (ops["experts_fc1"].fwd_flops + ops["experts_fc2"].fwd_flops) * tp / s
    assert per_token == pytest.approx(2 * 3 * m.moe_router_topk * m.hidden_size
                                      * m.expert_ffn_size)
    local, rows_e, rows = moe_rows(Shapes(spec))
    assert local == m.num_moe_experts // ep
    # tokens per expert = tokens * topk / experts over the expert-parallel group
    assert rows_e == pytest.approx(ep * etp * (s / tp) * m.moe_router_topk / m.num_moe_experts)


def test_shared_experts_and_router_present():
    ops = _ops(run(dsv3(), tp=1, ep=8, nodes=1, train=dict(global_batch_size=64)), moe=True)
    for name in ("router", "router_topk", "permute", "sort_chunks", "experts_fc1",
                 "experts_act", "experts_fc2", "unpermute", "shared_fc1", "shared_fc2"):
        assert ops[name].fwd_s > 0, name
    m = dsv3()
    assert ops["router"].fwd_flops == 2 * 4096 * m.hidden_size * m.num_moe_experts


def test_sliding_window_cuts_attention_only():
    model = llama70b(window_size=128, window_full_attention_every=2)
    spec = run(model, tp=8, sequence_parallel=True, train=dict(seq_length=8192))
    full, win = _ops(spec), _ops(spec, window=128)
    assert win["core_attn"].fwd_flops < full["core_attn"].fwd_flops / 30
    assert win["core_attn"].fwd_s < full["core_attn"].fwd_s / 5
    assert win["qkv"] == full["qkv"]


def test_fp8_gemms_faster_and_attention_unchanged():
    bf = _ops(run(llama70b(), tp=8, sequence_parallel=True, train=dict(seq_length=8192)))
    f8 = _ops(run(llama70b(), tp=8, sequence_parallel=True,
                  train=dict(seq_length=8192, precision="fp8")))
    assert f8["fc1"].fwd_s < 0.8 * bf["fc1"].fwd_s
    assert f8["core_attn"] == bf["core_attn"]
    assert f8["fc1"].fwd_bytes > bf["fc1"].fwd_bytes / 2  # casts are counted


def test_fp8_current_scaling_reads_each_operand_for_its_amax():
    """Transformer Engine's Float8CurrentScalingQuantizer::quantize (csrc/quantizer.cpp)
    runs nvte_compute_amax over the BF16 operand, nvte_compute_scale_from_amax, then
    nvte_quantize_v2: one more read of the operand (2 B an element) and two more kernels
    than a cast with a known scale (delayed scaling)."""
    def fc1(recipe):
        spec = run(llama70b(), tp=8, sequence_parallel=True,
                   train=dict(seq_length=8192, precision="fp8", fp8_recipe=recipe))
        return _ops(spec)["fc1"], spec
    cur, spec = fc1("tensorwise")
    dly, _ = fc1("delayed")
    sh = Shapes(spec)
    assert cur.fwd_bytes - dly.fwd_bytes == pytest.approx(2.0 * sh.tokens * sh.hidden)
    assert cur.fwd_kernels - dly.fwd_kernels == 2 and cur.fwd_s > dly.fwd_s


@pytest.mark.parametrize("cf,pad", [(None, False), (0.5, False), (1.25, False),
                                    (0.5, True), (1.25, True)])
def test_token_dropping_rows_match_megatron_core(cf, pad):
    """Rows per expert under token dropping, against megatron-core's own router code on
    CPU: apply_router_token_dropping on a perfectly balanced routing map of this rank's
    tokens (each expert picked by T k / E of them) keeps min(T k / E, capacity) per
    expert, or exactly the capacity when padded; dropless keeps every pair."""
    import torch
    from megatron.core.transformer.moe.moe_utils import apply_router_token_dropping

    experts, topk, seq = 8, 2, 256
    spec = run(mixtral(num_layers=2, num_moe_experts=experts, moe_router_topk=topk,
                       moe_expert_capacity_factor=cf, moe_pad_expert_input_to_capacity=pad),
               ep=1, nodes=1, gpn=1, train=dict(seq_length=seq, global_batch_size=8))
    local, rows_e, rows = moe_rows(Shapes(spec))
    tokens = seq
    # token t picks experts (t, t + 1) mod E: every expert is picked 2 T / E times
    routing = torch.zeros(tokens, experts, dtype=torch.bool)
    for t in range(tokens):
        for j in range(topk):
            routing[t, (t + j) % experts] = True
    g = torch.Generator().manual_seed(0)
    probs = torch.rand(tokens, experts, generator=g) * routing
    if cf is None:
        kept = routing.sum(dim=0)
    else:
        _, mask = apply_router_token_dropping(probs, routing, topk, cf, pad_to_capacity=pad)
        kept = mask.sum(dim=0)
    assert local == experts
    assert all(int(v) == pytest.approx(rows_e) for v in kept)
    assert rows == pytest.approx(float(kept.sum()))


def test_sinkhorn_balancing_cancels_the_routers_skew_as_megatron_core_routes():
    """megatron-core's Sinkhorn routing (TopKRouter.sinkhorn_load_balancing: top-k of
    moe_utils.sinkhorn of each micro-batch's logits) on logits with a strong per-expert
    skew, as a learned router has: plain top-k piles the tokens onto a few ranks, Sinkhorn
    does not, and routing_spread_factor of a Sinkhorn run (uniform random routing's
    spread, an upper bound) holds the busiest rank it measures."""
    import torch
    from megatron.core.transformer.moe.moe_utils import sinkhorn

    from primus_ext.compute.layer_ops import routing_spread_factor
    experts, topk, ep, seq = 16, 2, 4, 64

    def spec(balancing):
        return run(mixtral(num_layers=2, num_moe_experts=experts, moe_router_topk=topk),
                   ep=ep, nodes=1, gpn=4, moe_router_load_balancing_type=balancing,
                   train=dict(seq_length=seq, global_batch_size=64))
    g = torch.Generator().manual_seed(0)
    draws, balanced, plain = 60, [], []
    for _ in range(draws):
        skew = torch.randn(experts, generator=g)  # popular and idle experts
        loads = torch.zeros(experts, dtype=torch.float64)
        naive = torch.zeros(experts, dtype=torch.float64)
        for _rank in range(ep):  # each EP rank routes its own micro-batch
            logits = torch.randn(seq, experts, generator=g) + skew
            _, idx = torch.topk(sinkhorn(logits.float()), k=topk, dim=1)
            loads += torch.bincount(idx.flatten(), minlength=experts).double()
            _, idx = torch.topk(logits, k=topk, dim=1)
            naive += torch.bincount(idx.flatten(), minlength=experts).double()
        for out, x in ((balanced, loads), (plain, naive)):
            ranks = x.view(ep, experts // ep).sum(dim=1)
            out.append(float(ranks.max() / ranks.mean()))
    measured, skewed = sum(balanced) / draws, sum(plain) / draws
    model = routing_spread_factor(Shapes(spec("sinkhorn")))
    assert skewed > 1.4  # the skew is real
    assert 1.0 < measured <= model < 1.15
    # a learned router's balancing loss leaves its skew: the spread is told apart
    assert routing_spread_factor(Shapes(spec("aux_loss"))) > model + 0.3


def test_expert_bias_takes_out_a_systematic_skew_as_megatron_core_updates_it():
    """megatron-core's aux-loss-free balancing on a router whose experts have a fixed
    popularity (a per-expert logit offset): its own top-k with the expert bias and its
    own bias update (get_updated_expert_bias, the default rate 1e-3) over 3000 steps, in
    a process of its own (expert_bias_routing.py). The first step's busiest EP rank
    carries the skew; once the bias has settled the busiest rank is uniform routing's,
    which routing_spread_factor gives a run with the bias."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from primus_ext.compute.layer_ops import routing_spread_factor
    experts, topk, ep, seq = 16, 2, 4, 64
    helper = Path(__file__).with_name("expert_bias_routing.py")
    out = subprocess.run([sys.executable, str(helper), str(experts), str(topk), str(ep),
                          str(seq), "3000", "1e-3", "0.5", "1"], capture_output=True,
                         text=True, check=True, timeout=600)
    got = json.loads(out.stdout.strip().splitlines()[-1])

    def spec(terms):
        return run(mixtral(num_layers=2, num_moe_experts=experts, moe_router_topk=topk),
                   ep=ep, nodes=1, gpn=4, moe_router_terms=terms,
                   train=dict(seq_length=seq, global_batch_size=64))
    model = routing_spread_factor(Shapes(spec(("sigmoid", "expert_bias"))))
    assert got["first"] > 1.5  # the skew is real
    assert got["settled"] == pytest.approx(model, abs=0.01)
    assert routing_spread_factor(Shapes(spec(("aux_loss",)))) > model + 0.3


def test_capacity_factor_rules():
    with pytest.raises(ValueError, match="moe_pad_expert_input_to_capacity"):
        mixtral(moe_pad_expert_input_to_capacity=True)
    with pytest.raises(ValueError, match="moe_expert_capacity_factor"):
        mixtral(moe_expert_capacity_factor=0.0)


def test_balanced_routing_spread_matches_megatron_core_random_routing():
    """Balanced routing is megatron-core's benchmark routing (moe_router_force_load_
    balancing: RandomSTE draws the logits from a standard normal) through its own
    topk_routing_with_score_function on CPU: the busiest of 4 EP ranks' routed rows over
    the mean, averaged over draws, against routing_spread_factor."""
    import torch
    from megatron.core.transformer.moe.moe_utils import topk_routing_with_score_function

    from primus_ext.compute.layer_ops import routing_spread_factor
    experts, topk, ep, seq = 16, 2, 4, 64
    spec = run(mixtral(num_layers=2, num_moe_experts=experts, moe_router_topk=topk),
               ep=ep, nodes=1, gpn=4, train=dict(seq_length=seq, global_batch_size=64,
                                                 moe_router_force_load_balancing=True))
    sh = Shapes(spec)
    assert sh.sp_tokens == seq
    g = torch.Generator().manual_seed(0)
    draws, ratios = 3000, []
    for _ in range(draws):
        logits = torch.randn(ep * seq, experts, generator=g)
        _, routing = topk_routing_with_score_function(logits, topk)
        ranks = routing.sum(dim=0).view(ep, experts // ep).sum(dim=1).double()
        ratios.append(float(ranks.max() / ranks.mean()))
    measured = sum(ratios) / draws
    model = routing_spread_factor(sh)
    assert model > 1.03  # a visible spread at 128 rows per rank
    assert model == pytest.approx(measured, abs=0.006)
    # dropless only; one EP rank has nothing to wait for
    assert routing_spread_factor(Shapes(run(mixtral(), ep=1, nodes=1))) == 1.0
