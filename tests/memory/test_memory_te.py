"""The Transformer Engine stack's memory (memory/te_layer.py, te_states.py) against byte
counts derived by hand from TE's and megatron-core's source, tensor by tensor.

TE cannot run on a CPU, so these figures are source-derived: each term below names the
function that allocates or saves it (NVIDIA/TransformerEngine, transformer_engine/pytorch/;
NVIDIA/Megatron-LM, megatron/core/). The fused-attention save set itself is also
measured on real tensors in tests/measure/test_fused_attention_saved.py.
"""
from __future__ import annotations

from dataclasses import replace

import pytest

from memory_specs import LLAMA, run

from primus_ext.memory.activations import layer_bytes, layer_items
from primus_ext.memory.options import MemoryOptions
from primus_ext.memory.report import memory_report
from primus_ext.memory.states import grad_bytes_per_element, optimizer_bytes_per_element
from primus_ext.memory.te_states import (fp8_weight_bytes_per_element, is_te_linear_weight,
                                         precision_aware_optimizer_bytes)
from primus_ext.presets import hardware_preset

OPT = MemoryOptions()
# LLAMA: h 1024, 16 heads, 4 KV groups, head dim 64, SwiGLU ffn 2816, RMSNorm, RoPE, no
# bias, no dropout; one microbatch of 2048 tokens, TP 1.
N, H, A, G, HD, F = 2048, 1024, 16, 4, 64, 2816


def _te(precision: str = "bf16", recipe: str = "tensorwise", **kw):
    spec = run(LLAMA, backend="flash", precision=precision, **kw)
    return replace(spec.train, te=True, fp8_recipe=recipe), spec


def _hand_layer(fp8: bool, delayed: bool) -> int:
    gemm_in = 1 if fp8 else 2  # bytes of a saved GEMM input
    total = 0
    # layernorm_linear.py _LayerNormLinear.forward (QKV with the input RMSNorm fused):
    # inputmat (the residual stream, bf16), rsigma (fp32 per token), ln_out (FP8
    # column-wise only after ln_out.update_usage(rowwise_usage=False)).
    total += N * H * 2 + N * 4 + N * H * gemm_in
    # RoPE (TE fused rope) rebuilds q and k; dot_product_attention/utils.py
    # get_qkv_layout copies the strided V view contiguous; backends.py
    # FusedAttnFunc.forward saves q, k, v, out and the fp32 softmax stats [b, h, s, 1].
    total += N * A * HD * 2 + 2 * N * G * HD * 2 + N * A * HD * 2 + A * N * 4
    # linear.py _linear_forward (proj): the attention output. megatron-core's
    # set_save_original_input (TE >= 2.6, every recipe but delayed) keeps the bf16
    # tensor FusedAttnFunc saved; delayed scaling adds a 1-byte column-wise copy.
    if fp8 and delayed:
        total += N * A * HD * 1
    # pre-MLP norm fused in fc1 (LayerNormLinear again): residual, rsigma, ln_out.
    total += N * H * 2 + N * 4 + N * H * gemm_in
    # megatron-core bias_swiglu_impl saves its input, the fc1 output (bf16, 2F wide);
    # fc2 (linear.py) saves the SwiGLU output: FP8 in FP8 runs, bf16 otherwise.
    total += N * 2 * F * 2 + N * F * gemm_in
    return total


@pytest.mark.parametrize("precision,recipe", [("bf16", "tensorwise"), ("fp8", "tensorwise"),
                                              ("fp8", "delayed")])
def test_te_layer_matches_te_source_by_hand(precision, recipe):
    train, spec = _te(precision, recipe)
    ours = layer_bytes(LLAMA, spec.parallel, train, False, OPT)
    assert ours == _hand_layer(precision == "fp8", recipe == "delayed")


def test_te_stack_saves_less_than_local_spec_flash():
    """Local spec (flash stand-in) keeps the whole QKV output through the V view; TE
    copies V out, so the QKV storage is freed: the difference is exactly Q + K."""
    train, spec = _te()
    local = dict(layer_items(LLAMA, spec.parallel, spec.train, False, OPT))
    te = dict(layer_items(LLAMA, spec.parallel, train, False, OPT))
    assert sum(local.values()) - sum(te.values()) == N * (A + G) * HD * 2
    assert te["softmax_lse"] == local["softmax_lse"] == A * N * 4


def test_te_without_rope_keeps_qkv_views():
    """No RoPE, no q/k norm, MHA: q, k, v are views of the QKV output (TE's sbh3d layout),
    so TE saves the whole QKV output and nothing is copied."""
    mha = replace(LLAMA, num_query_groups=None, position_embedding_type="learned_absolute")
    spec = run(mha, backend="flash")
    items = dict(layer_items(mha, spec.parallel, replace(spec.train, te=True), False, OPT))
    assert items["qkv.output"] == N * 3 * A * HD * 2
    assert "v.contiguous" not in items and "q.rotated" not in items


def test_selective_core_attn_on_te_drops_the_attention_saves():
    """megatron-core checkpoints core attention on q, k and the V view: TE's V copy and
    softmax stats go, the QKV output (alive through the V view) and q, k stay."""
    train, spec = _te("fp8", "delayed", recompute_granularity="selective")
    items = dict(layer_items(LLAMA, spec.parallel, train, False, OPT))
    assert "v.contiguous" not in items and "core_attn.out" not in items
    assert "softmax_lse" not in items
    assert items["qkv.output"] == N * (A + 2 * G) * HD * 2
    assert items["proj.input"] == N * A * HD  # the projection's FP8 copy stays


def test_fp8_weight_bytes_from_te_source():
    """te_states.py: per TE linear weight element, the bytes one rank holds."""
    t = run(LLAMA, precision="fp8").train
    gather = replace(t, fp8_param_gather=True)
    # Hopper (no non-TN FP8 GEMM): FP8 weight + transpose (post_all_gather_processing).
    assert fp8_weight_bytes_per_element(gather, non_tn_fp8_gemm=False) == 2
    # Blackwell, tensorwise: the row-wise FP8 weight serves both GEMMs.
    assert fp8_weight_bytes_per_element(gather, non_tn_fp8_gemm=True) == 1
    # Without --fp8-param-gather: bf16 weight + TE's cached FP8 workspace (both ways).
    assert fp8_weight_bytes_per_element(t, non_tn_fp8_gemm=False) == 4
    assert fp8_weight_bytes_per_element(replace(t, fp8_recipe="mxfp8"), True) == 4
    assert is_te_linear_weight("decoder.layers.3.self_attention.linear_qkv.weight")
    assert is_te_linear_weight("decoder.layers.0.mlp.experts.local_experts.1.linear_fc2.weight")
    assert not is_te_linear_weight("embedding.word_embeddings.weight")
    assert not is_te_linear_weight("output_layer.weight")
    assert not is_te_linear_weight("decoder.layers.0.mlp.router.weight")
    assert not is_te_linear_weight("decoder.layers.0.mlp.linear_fc1.bias")


def test_precision_aware_optimizer_bytes_from_fused_adam_source():
    """optimizers/fused_adam.py _initialize_state: each moment in its dtype (fp8 as a
    1-byte Float8Tensor), the master of a bf16 param as int16 remainders
    (store_param_remainders, megatron-core OptimizerConfig default True); FP8 params
    keep a 4-byte master."""
    t = run(LLAMA).train
    assert optimizer_bytes_per_element(t) == 12  # plain: fp32 master + two fp32 moments
    pa = replace(t, use_precision_aware_optimizer=True)
    assert optimizer_bytes_per_element(pa) == 4 + 4 + 2
    bf16 = replace(pa, exp_avg_dtype="bf16", exp_avg_sq_dtype="bf16")
    assert precision_aware_optimizer_bytes(bf16) == 2 + 2 + 2
    fp8 = replace(pa, exp_avg_dtype="fp8", exp_avg_sq_dtype="bf16")
    assert precision_aware_optimizer_bytes(fp8) == 1 + 2 + 2
    fp8_params = replace(bf16, precision="fp8", fp8_param_gather=True)
    assert precision_aware_optimizer_bytes(fp8_params) == 2 + 2 + 4
    # --main-grads-dtype bf16: the DDP buffer holds bf16 gradients.
    grads = replace(pa, main_grads_dtype="bf16")
    assert grad_bytes_per_element(grads, OPT, run(LLAMA).parallel) == 2
    assert grad_bytes_per_element(pa, OPT, run(LLAMA).parallel) == 4


def test_report_resolves_the_stack_from_the_hardware():
    """train.te=None: TE on a GPU preset, the local spec on `cpu`; train.te overrides."""
    spec = run(LLAMA, backend="flash", precision="fp8")
    gpu = memory_report(spec)
    local = memory_report(replace(spec, train=replace(spec.train, te=False)))
    assert gpu.stages[0].activation_bytes < local.stages[0].activation_bytes
    assert gpu.stages[0].param_bytes > local.stages[0].param_bytes  # FP8 weight copies
    assert "Transformer Engine" in gpu.notes[0] and "local spec" in local.notes[0]
    cpu = replace(spec, cluster=replace(spec.cluster, hardware=hardware_preset("cpu")))
    assert "local spec" in memory_report(cpu).notes[0]


def test_cp_ring_buffers_on_te():
    """TE's p2p CP backward (AttnFuncWithCPAndKVP2P.backward): two (2, *kv) ring buffers
    and a dQ buffer for the layer in backward, on top of the saved bytes at s/cp. They
    are the backward's working set of a stage without the loss (on the last stage the
    loss transient, at another moment, is the larger of the two)."""
    from primus_ext.memory.activations import chunk_activations
    base = run(LLAMA, backend="flash", cp=2, pp=2, seq=4096)
    te = replace(base.train, te=True)
    local = replace(base.train, te=False)
    n = 4096 // 2
    kv, q = 2 * n * G * HD * 2, n * A * HD * 2
    first_te = chunk_activations(LLAMA, base.parallel, te, 0, 0, OPT)
    first_local = chunk_activations(LLAMA, base.parallel, local, 0, 0, OPT)
    assert first_te.working_bytes - first_local.working_bytes == 4 * kv + q
    # 4 layers on the stage: the QKV storage TE frees beside the V copy it keeps.
    assert first_local.bytes_per_microbatch - first_te.bytes_per_microbatch \
        == 4 * (n * (A + G) * HD * 2)


def test_torchtitan_op_sac_keeps_every_other_mm():
    """torchtitan's op-level SAC (pytorch/torchtitan@9dec370 parallelize_llama.py
    _save_list and the mm counter): mms wq, wk, wv, wo, w1, w3, w2 in that order, the
    odd ones kept; SDPA output and log-sum-exp kept; the block input kept."""
    spec = run(LLAMA, backend="flash", recompute_granularity="selective",
               recompute_modules=("op",))
    train = replace(spec.train, te=False)
    ours = layer_bytes(LLAMA, spec.parallel, train, False, OPT)
    hand = (N * H * 2  # block input (checkpoint argument)
            + N * A * HD * 2  # wq output (mm 1)
            + N * G * HD * 2  # wv output (mm 3)
            + N * A * HD * 2 + A * N * 4  # SDPA output and log-sum-exp
            + N * F * 2  # w1 output (mm 5)
            + N * H * 2)  # w2 output (mm 7)
    assert ours == hand
    # The backward recomputes one block at a time: one full layer is the working set.
    full = layer_bytes(LLAMA, spec.parallel, train, False, OPT, full=False)
    rep = memory_report(replace(spec, train=train)).stages[0]
    none = memory_report(replace(spec, train=replace(train, recompute_granularity=None)))
    assert rep.activation_bytes < none.stages[0].activation_bytes
    assert full > ours


def test_fine_grained_offloading_moves_the_modules_inputs_to_host():
    """offload.py: core_attn + attn_proj move what core attention and the projection
    save of every layer to the host but about two layers' (in flight, prefetched): q and
    the attention output; K and V (N x G x HD = 512 Ki elements each) stay, below
    megatron-core's min_offloaded_tensor_size of 1024 * 1024 elements
    (fine_grained_activation_offload.py tensor_need_offloading_checker)."""
    spec = run(LLAMA, backend="flash")
    train = replace(spec.train, te=True)
    off = replace(train, offload_modules=("core_attn", "attn_proj"))
    assert N * G * HD < 1024 * 1024 <= N * A * HD
    moved = N * A * HD * 2 + N * A * HD * 2  # q (rotated), out
    on = memory_report(replace(spec, train=train)).stages[0]
    host = memory_report(replace(spec, train=off)).stages[0]
    assert on.activation_bytes_per_microbatch - host.activation_bytes_per_microbatch \
        == 8 * moved  # 8 layers
    # The peak keeps two layers' worth on the device (one microbatch in flight here).
    assert on.activation_bytes - host.activation_bytes == 8 * moved - 2 * moved
    with pytest.raises(ValueError, match="attn_proj without core_attn"):
        replace(train, offload_modules=("attn_proj",))
    with pytest.raises(ValueError, match="offload_modules"):
        replace(train, offload_modules=("fc1",))
