"""Activation bytes one decoder layer saves on the GPU stack production runs use:
megatron-core's Transformer Engine spec (``get_gpt_layer_with_transformer_engine_spec``)
with fused attention. Source-derived (TE cannot run on a CPU); the local-spec items of
``act_layer.py`` are the starting point and only what TE saves differently changes.

What TE keeps for backward (NVIDIA/TransformerEngine, transformer_engine/pytorch/):

- ``module/layernorm_linear.py`` ``_LayerNormLinear.forward`` (QKV, fc1, MLA q-up with
  the norm fused in): saves ``inputmat`` (the norm input, the residual stream, compute
  dtype), ``ln_out`` and ``mu``/``rsigma``. In FP8 ``ln_out`` is the quantized GEMM
  input: the row-wise copy is dropped (``ln_out.update_usage(rowwise_usage=False)``) and
  the column-wise one kept for wgrad, one byte per element.
- ``module/linear.py`` ``_linear_forward`` (proj, fc2, MLA down projections): saves
  ``saved_inputmat``; in FP8 the quantized input with ``update_usage(rowwise_usage=False,
  columnwise_usage=True)``, one byte per element; in bf16 the input itself (the same
  storage the previous op saved, so it is counted once).
- ``module/grouped_linear.py`` ``_GroupedLinear.forward`` (experts): the same per expert.
- ``module/layernorm_mlp.py`` ``_LayerNormMLP.forward`` saves the same set (inputmat,
  ln_out, fc1_out before the activation, the FP8 activation output, rsigma), so the
  fused MLP and megatron-core's LayerNormColumnParallelLinear + bias_swiglu + Linear
  have the same bytes.
- ``attention/dot_product_attention/backends.py`` ``FusedAttnFunc.forward``: saves
  ``q, k, v, out`` (bf16; FP8 DPA is off unless ``--fp8-dot-product-attention``) and the
  aux tensors: the softmax statistics ``[b, h, s, 1]`` fp32 and the RNG state; no s x s
  tensor. ``utils.get_qkv_layout`` copies q, k, v contiguous when their strides match
  no supported layout: after megatron-core's ``get_query_key_value_tensors`` splits the
  fused QKV output into views and RoPE (or q/k norms) rebuild q and k, V is the one
  strided view left, so TE saves a contiguous copy of V and the QKV output is freed.
  Without RoPE and q/k norms, q, k, v stay views of the QKV output (sbh3d / sbh2d
  layouts) and keep all of it alive.
- In FP8 with delayed scaling the attention output is saved twice: bf16 by
  FusedAttnFunc, FP8 by the output projection's Linear (other recipes: once, below).
- ``--attention-backend unfused``: ``UnfusedDotProductAttention`` (``_te_unfused_qkv``
  and ``attn_unfused.py``).

Megatron-core's own ops keep their local-spec bytes: ``bias_swiglu_impl`` saves the fc1
output (compute dtype: ``activation_func_fp8_input_store`` is off by default), the
router, permutation, dropout and the loss.

FP8 byte width of a saved GEMM input: one byte per element plus the recipe's scales
(tensorwise / delayed: one fp32 per tensor; mxfp8: one E8M0 byte per 32 elements;
blockwise 1x128: one fp32 per 128 elements).
"""
from __future__ import annotations

from primus_ext.memory.act_layer import Dims, Items
from primus_ext.spec.model import ModelSpec
from primus_ext.spec.train import TrainSpec

# Saved GEMM inputs, by item name: what TE's linear modules keep (FP8 in FP8 runs).
_GEMM_INPUTS = ("qkv.input", "proj.input", "fc1.input", "mlp.act_output",
                "experts.input", "experts.act_output", "shared.act_output",
                "down_proj.input", "q_up.input", "kv_up.input")


def fp8_saved_bytes(elements: int, recipe: str) -> int:
    """Bytes of one FP8-quantized saved GEMM input of ``elements`` elements."""
    if recipe == "mxfp8":
        return elements + -(-elements // 32)
    if recipe == "blockwise":
        return elements + 4 * -(-elements // 128)
    return elements  # tensorwise / delayed: one scale per tensor (negligible)


def te_layer_items(model: ModelSpec, train: TrainSpec, d: Dims, items: Items) -> Items:
    """The TE stack's saved bytes of one layer, from its local-spec ``items``."""
    it = dict(items)
    if not model.multi_latent_attention:
        it = _te_attention(model, d, it) if d.flash else _te_unfused_qkv(model, d, it)
    if train.precision != "fp8":
        return it
    e = d.e
    # megatron-core (TE >= 2.6) sets ``save_original_input`` on the output projection
    # (transformer/attention.py ``Attention.__init__``, multi_latent_attention.py) and on
    # the shared experts' fc1 (moe/shared_experts.py) for every FP8 recipe but delayed
    # scaling: their input is already saved in bf16 by the fused attention / the router,
    # so no FP8 copy is kept. With delayed scaling both copies live.
    original = train.fp8_recipe != "delayed"
    for name in _GEMM_INPUTS:
        if name in it and not (original and name == "proj.input"):
            it[name] = fp8_saved_bytes(it[name] // e, train.fp8_recipe)
    if "proj.input" in it and d.flash and not original:
        # FusedAttnFunc keeps its bf16 output besides the projection's FP8 copy.
        heads = model.num_attention_heads // d.tp
        width = model.v_head_dim if model.multi_latent_attention else model.head_dim
        it["core_attn.out"] = d.n * heads * width * e
    if "shared.fc1_output" in it and not original:
        # The shared experts' fc1 quantizes the router input (kept in bf16 by the router)
        # into its own FP8 copy.
        it["shared.fc1_input"] = fp8_saved_bytes(d.n_sp * model.hidden_size,
                                                 train.fp8_recipe)
    return it


def _te_attention(model: ModelSpec, d: Dims, it: Items) -> Items:
    hd, e, n = model.head_dim, d.e, d.n
    a, g = model.num_attention_heads // d.tp, model.num_groups // d.tp
    rope = model.position_embedding_type == "rope"
    for k in ("qkv.output", "q.rotated", "k.rotated"):
        it.pop(k, None)
    if rope or model.qk_layernorm:
        it["q.rotated"] = n * a * hd * e
        it["k.rotated"] = n * g * hd * e
        it["v.contiguous"] = n * g * hd * e
        if model.qk_layernorm:
            # TE's q/k norms save their inputs: views of the QKV output.
            it["qkv.output"] = n * (a + 2 * g) * hd * e
    else:
        it["qkv.output"] = n * (a + 2 * g) * hd * e
        if a != g:
            # megatron-core reshapes the query heads out of the grouped view: a copy.
            it["q.saved"] = n * a * hd * e
    return it


def _te_unfused_qkv(model: ModelSpec, d: Dims, it: Items) -> Items:
    """Q, K, V as TE's ``UnfusedDotProductAttention`` saves them (the s x s terms come
    from ``attn_unfused.py`` via the local items): ``DotProductAttention.forward`` runs
    ``get_qkv_layout`` for every backend, so q, k, v arrive as for the fused one
    (``_te_attention``); ``baddbmm`` then saves q and k, ``bmm`` saves v, and under GQA
    K and V are ``repeat_interleave``'d to all heads first (backends.py ``_forward``), the
    expanded copies being what is saved."""
    hd, e, n = model.head_dim, d.e, d.n
    a, g = model.num_attention_heads // d.tp, model.num_groups // d.tp
    for k in ("qkv.output", "q.saved", "k.saved", "k.repeated", "v.repeated", "q.rotated",
              "k.rotated"):
        it.pop(k, None)
    gqa = a != g
    if model.position_embedding_type == "rope" or model.qk_layernorm:
        it["q.rotated"] = n * a * hd * e
        if model.qk_layernorm:
            it["qkv.output"] = n * (a + 2 * g) * hd * e  # the q/k norms' saved inputs
        if gqa:
            it["k.repeated"] = it["v.repeated"] = n * a * hd * e
        else:
            it["k.rotated"] = n * g * hd * e
            it["v.contiguous"] = n * g * hd * e
    elif gqa:
        it["q.saved"] = n * a * hd * e  # megatron-core's reshape of the grouped query
        it["k.repeated"] = it["v.repeated"] = n * a * hd * e
    else:
        it["qkv.output"] = n * (a + 2 * g) * hd * e  # q, k, v views keep it alive
    return it


def te_cp_working_bytes(model: ModelSpec, cp: int, cp_comm_type: str, d: Dims) -> int:
    """Transient buffers of one layer's context-parallel attention backward (TE
    ``attention/dot_product_attention/context_parallel.py``), on top of the saved bytes
    (which equal the non-CP ones at s/cp: the p2p forward saves q, the concatenated
    local K/V, out and the softmax statistics).

    - p2p (``AttnFuncWithCPAndKVP2P.backward``, bf16): two ``(2, *kv.shape)`` ring
      buffers (K/V in flight, dK/dV in flight) and a dQ buffer: 4 K/V + 1 Q;
    - allgather (``AttnFuncWithCPAndKVAllGather``): K/V of the whole sequence gathered
      and their gradients before the reduce-scatter: 2 x cp K/V;
    - a2a (``AttnFuncWithCPAndQKVOA2A``): q, k, v, out re-laid to all tokens and heads/cp
      (the same bytes) and their gradients: 2 x (Q + K/V + O).
    """
    if cp <= 1:
        return 0
    e = d.e
    if model.multi_latent_attention:
        heads = model.num_attention_heads // d.tp
        q = d.n * heads * (model.qk_head_dim + model.qk_pos_emb_head_dim) * e
        kv = q + d.n * heads * model.v_head_dim * e
        o = d.n * heads * model.v_head_dim * e
    else:
        a, g = model.num_attention_heads // d.tp, model.num_groups // d.tp
        q = o = d.n * a * model.head_dim * e
        kv = 2 * d.n * g * model.head_dim * e
    if cp_comm_type == "p2p":
        return 4 * kv + q
    if cp_comm_type == "allgather":
        return 2 * cp * kv
    return 2 * (q + kv + o)
