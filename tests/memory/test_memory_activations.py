"""Activation model against Korthikanti et al. 2022 (arXiv 2205.05198) Sec. 4.

Their per-layer bytes assume exactly what the GPT spec here has (LayerNorm, 4h GeLU FFN,
biases, dropout, MHA) and ignore two small tensors megatron-core does save, which the
model counts and these tests name: the bool causal mask of the unfused attention (s^2
bytes, rebuilt per layer) and the LayerNorm statistics (fp32 mean and rstd per token
row: 8 bytes per row and norm).
"""
from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memory_specs import GPT, LLAMA, MOE, preset, run
from primus_ext.memory.activations import chunk_activations, layer_bytes, layer_items
from primus_ext.memory.options import MemoryOptions

OPT = MemoryOptions()


def _layer(spec, moe=False):
    return layer_bytes(spec.model, spec.parallel, spec.train, moe, OPT)


@pytest.mark.parametrize("tp,sp", [(1, False), (2, False), (4, False), (2, True), (8, True)])
def test_no_recompute_matches_eq1_eq2(tp, sp):
    spec = run(GPT, tp=tp, sequence_parallel=sp, seq=2048, mbs=2,
               attention_softmax_in_fp32=False)
    s, b, h, a = 2048, 2, GPT.hidden_size, GPT.num_attention_heads
    sbh = s * b * h
    if sp:  # eq. (5): sbh/t (34 + 5as/h)
        formula = sbh * (34 + 5 * a * s // h) // tp
    else:  # eq. (3): sbh (10 + 24/t + 5as/(ht))
        formula = sbh * 10 + sbh * 24 // tp + 5 * a * s * s * b // tp
    rows = s * b // tp if sp else s * b
    extras = s * s + 2 * 8 * rows  # causal mask + LN mean/rstd of the two norms
    assert _layer(spec) == formula + extras


@pytest.mark.parametrize("tp,sp", [(1, False), (2, False), (2, True)])
def test_selective_matches_eq6(tp, sp):
    spec = run(GPT, tp=tp, sequence_parallel=sp, recompute_granularity="selective")
    s, b, h = 2048, 1, GPT.hidden_size
    sbh = s * b * h
    formula = 34 * sbh // tp if sp else 10 * sbh + 24 * sbh // tp
    rows = s * b // tp if sp else s * b
    assert _layer(spec) == formula + 2 * 8 * rows + 4  # + int32 attn_mask_type


@pytest.mark.parametrize("tp,sp", [(1, False), (2, True)])
def test_full_recompute_keeps_2sbh_per_layer(tp, sp):
    spec = run(GPT, tp=tp, sequence_parallel=sp, recompute_granularity="full",
               recompute_method="uniform", recompute_num_layers=1)
    s, b, h = 2048, 1, GPT.hidden_size
    items = dict(chunk_activations(spec.model, spec.parallel, spec.train, 0, 0, OPT).items)
    assert items["recompute.inputs"] == GPT.num_layers * 2 * s * b * h // (tp if sp else 1)


def test_softmax_in_fp32_adds_2asb_per_layer():
    on = run(GPT, attention_softmax_in_fp32=True)
    off = run(GPT, attention_softmax_in_fp32=False)
    s, a = 2048, GPT.num_attention_heads
    assert _layer(on) - _layer(off) == 2 * a * s * s


def test_flash_has_no_s_squared_terms_and_saves_lse():
    items = dict(layer_items(LLAMA, run(LLAMA, backend="flash").parallel,
                             run(LLAMA, backend="flash").train, False, OPT))
    assert "softmax.output" not in items and "causal_mask" not in items
    assert items["softmax_lse"] == 1 * LLAMA.num_attention_heads * 2048 * 4
    flash = _layer(run(LLAMA, seq=8192, backend="flash"))
    assert flash * 2 == _layer(run(LLAMA, seq=16384, backend="flash"))  # linear in s


def test_gqa_unfused_keeps_expanded_k_v():
    gqa = dict(layer_items(LLAMA, run(LLAMA).parallel, run(LLAMA).train, False, OPT))
    n, hd, a = 2048, LLAMA.head_dim, LLAMA.num_attention_heads
    assert gqa["k.repeated"] == gqa["v.repeated"] == n * a * hd * 2
    assert "qkv.output" not in gqa  # nothing keeps the fused QKV output alive


def test_swiglu_fusion_saves_two_fewer_ffn_tensors():
    spec = run(LLAMA)
    fused = _layer(spec)
    unfused = layer_bytes(LLAMA, spec.parallel, spec.train, False,
                          MemoryOptions(bias_activation_fusion=False))
    assert unfused - fused == 2 * 2048 * LLAMA.dense_ffn_size * 2


def test_moe_layer_terms_scale_with_topk_and_expert_tp():
    spec = run(MOE, ep=4)
    items = dict(layer_items(MOE, spec.parallel, spec.train, True, OPT))
    n, h, k = 2048, MOE.hidden_size, MOE.moe_router_topk
    assert items["experts.input"] == n * k * h * 2
    assert items["experts.fc1_output"] == n * k * 2 * MOE.expert_ffn_size * 2
    sp = run(MOE, tp=2, sequence_parallel=True, ep=2, etp=2)
    items2 = dict(layer_items(MOE, sp.parallel, sp.train, True, OPT))
    # each rank routes n/2 tokens, the expert-TP all-gather brings the pair's 2 * n/2 * k
    assert items2["experts.input"] == n * k * h * 2
    assert items2["experts.fc1_output"] == n * k * MOE.expert_ffn_size * 2


def test_selective_moe_act_drops_expert_activation():
    base = run(MOE)
    sel = run(MOE, recompute_granularity="selective", recompute_modules=("moe_act",))
    items = dict(layer_items(MOE, base.parallel, base.train, True, OPT))
    assert _layer(base, True) - _layer(sel, True) == items["experts.act_output"]


def test_full_block_keeps_layers_after_the_first_k():
    m = replace(LLAMA, num_layers=6)
    spec = run(m, recompute_granularity="full", recompute_method="block",
               recompute_num_layers=2)
    items = dict(chunk_activations(m, spec.parallel, spec.train, 0, 0, OPT).items)
    assert items["layers"] == 4 * _layer(run(m))
    assert items["recompute.inputs"] == 2 * 2048 * m.hidden_size * 2


def test_deepseek_v3_mla_layer_is_itemised():
    ds = preset("deepseek_v3")
    spec = run(ds, nodes=128, pp=16, ep=64, gbs=8192, seq=4096, backend="flash")
    items = dict(layer_items(ds, spec.parallel, spec.train, True, OPT))
    n, heads = 4096, ds.num_attention_heads
    assert items["q"] == n * heads * (ds.qk_head_dim + ds.qk_pos_emb_head_dim) * 2
    assert items["v"] == n * heads * ds.v_head_dim * 2
    assert items["experts.input"] == n * ds.moe_router_topk * ds.hidden_size * 2


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([LLAMA, GPT, MOE]), st.sampled_from([1, 2, 4]),
       st.sampled_from([512, 1024, 2048]), st.sampled_from(["flash", "unfused"]))
def test_more_tokens_never_less_memory(model, mbs, seq, backend):
    small = run(model, mbs=mbs, seq=seq, backend=backend)
    big = run(model, mbs=mbs, seq=2 * seq, backend=backend)
    wide = run(model, mbs=2 * mbs, seq=seq, backend=backend, gbs=128)
    a = chunk_activations(model, small.parallel, small.train, 0, 0, OPT).bytes_per_microbatch
    for other in (big, wide):
        assert chunk_activations(model, other.parallel, other.train, 0, 0,
                                 OPT).bytes_per_microbatch > a


@settings(max_examples=30, deadline=None)
@given(st.sampled_from([LLAMA, GPT]), st.sampled_from([1, 2]))
def test_more_tensor_parallelism_never_more_activation_per_rank(model, tp):
    one = run(model, tp=tp, sequence_parallel=tp > 1)
    two = run(model, tp=2 * tp, sequence_parallel=True)  # LLAMA has 4 KV groups
    assert _layer(two) <= _layer(one)
