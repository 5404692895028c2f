"""Activation bytes one decoder layer saves for backward, per microbatch, per rank.

The starting point is Korthikanti et al. 2022 (arXiv 2205.05198), Sec. 4, eq. (1)-(6):
``sbh(34 + 5as/h)`` bytes per layer without parallelism. That count assumes MHA, GeLU
with a 4h FFN, LayerNorm and dropout everywhere; here every term is itemised per tensor
as megatron-core 0.16 saves it, so GQA, RoPE, SwiGLU, RMSNorm, biases, MoE, MLA, TP, SP
and CP each change the terms they touch. Dtypes are GPU dtypes: activations in the
compute dtype (2 bytes for bf16/fp16/fp8 runs, whose FP8 GEMMs keep bf16 inputs here),
norm statistics in fp32, dropout masks as bool (1 byte), index tensors int64.

``attention_backend``:

- ``unfused``: megatron-core's local ``DotProductAttention`` (TE's
  ``UnfusedDotProductAttention`` on the TE stack, ``te_layer.py``): baddbmm scores,
  scale-mask-softmax, dropout, bmm; the s x s tensors it saves (fused softmax kernel on a
  GPU, torch softmax on a CPU) are ``attn_unfused.py``'s; K and V are expanded to all
  heads with ``repeat_interleave`` under GQA;
- ``flash``: fused attention as on GPUs (TE / cuDNN / flash-attn): Q, K, V, the output
  and the softmax log-sum-exp (fp32, one per query and head) are saved; no s^2 terms,
  no mask, dropout regenerated from the RNG state.

Token counts: ``n = b * s / cp`` tokens on a rank, ``n_sp = n / tp`` under sequence
parallelism (norms, dropout and residual tensors are split over TP), ``n`` elsewhere.
"""
from __future__ import annotations

from primus_ext.memory.attn_unfused import score_items
from primus_ext.memory.dims import Dims, Items
from primus_ext.memory.options import MemoryOptions
from primus_ext.spec.model import ModelSpec
from primus_ext.spec.parallel import ParallelSpec
from primus_ext.spec.train import TrainSpec


def norm_items(model: ModelSpec, d: Dims, name: str, rows: int, width: int) -> Items:
    """A norm saves its input and fp32 statistics (LayerNorm mean + rstd, RMSNorm rstd)."""
    stats = 8 if model.normalization == "LayerNorm" else 4
    return {f"{name}.input": rows * width * d.e, f"{name}.stats": rows * stats}


def _dropout_mask(rows: int, width: int, p: float) -> int:
    return rows * width if p > 0 else 0


# ---- attention --------------------------------------------------------------------
def attention_items(model: ModelSpec, train: TrainSpec, d: Dims) -> Items:
    """Self-attention block: input norm through the output-projection dropout."""
    if model.multi_latent_attention:
        return mla_items(model, train, d)
    h, hd = model.hidden_size, model.head_dim
    a, g = model.num_attention_heads // d.tp, model.num_groups // d.tp
    n, e = d.n, d.e
    rope = model.position_embedding_type == "rope"
    gqa = a != g
    it = norm_items(model, d, "input_norm", d.n_sp, h)
    it["qkv.input"] = d.n_sp * h * e  # the norm output (local shard under SP)
    qkv = n * (a + 2 * g) * hd * e  # the fused QKV output; q, k, v are views of it
    if model.qk_layernorm:
        # q/k norms act per head on views of the QKV output and keep it alive.
        it |= _qk_norm_items(model, d, a, g, hd)
    if d.flash:
        # Q/K after RoPE are new tensors; V stays a view, so the QKV storage lives on.
        it["qkv.output"] = qkv
        if rope or model.qk_layernorm:
            it["q.rotated"] = n * a * hd * e
            it["k.rotated"] = n * g * hd * e
        it["softmax_lse"] = d.b * a * d.s * 4
    else:
        it |= _unfused_core(model, train, d, a, g, hd, qkv, rope, gqa)
    if rope and not d.flash and not d.te:
        # mcore's unfused RoPE saves cos and sin of the positions for q and for k, over
        # the rotated dims (rope_utils._apply_rotary_pos_emb_bshd: freqs' last dim).
        it["rope.cos_sin"] = 4 * d.s * int(model.head_dim * model.rotary_percent) * e
    it["proj.input"] = n * a * hd * e
    it["proj.dropout_mask"] = _dropout_mask(d.n_sp, h, model.hidden_dropout)
    return it


def _qk_norm_items(model: ModelSpec, d: Dims, a: int, g: int, hd: int) -> Items:
    stats = 8 if model.normalization == "LayerNorm" else 4
    return {"q_layernorm.stats": d.n * a * stats, "k_layernorm.stats": d.n * g * stats}


def _unfused_core(model: ModelSpec, train: TrainSpec, d: Dims, a: int, g: int, hd: int,
                  qkv: int, rope: bool, gqa: bool) -> Items:
    """Local DotProductAttention: what baddbmm, softmax, dropout and bmm keep."""
    n, e, b, s = d.n, d.e, d.b, d.s
    it: Items = {}
    head = n * a * hd * e  # one all-heads tensor
    new_q = rope or gqa or model.qk_layernorm  # RoPE/norm output, or a GQA reshape copy
    new_k = rope or gqa or model.qk_layernorm
    if gqa:
        # K and V are repeat_interleave'd to all heads: fresh tensors; nothing keeps the
        # QKV storage alive (unless q/k norms saved views of it).
        it["q.saved"] = head
        it["k.repeated"] = head
        it["v.repeated"] = head
        if model.qk_layernorm:
            it["qkv.output"] = qkv
    else:
        it["qkv.output"] = qkv  # V (and unrotated Q/K) are views of it
        if new_q:
            it["q.saved"] = head
        if new_k:
            it["k.saved"] = head
    it |= score_items(model, train, d, a)
    return it


def mla_items(model: ModelSpec, train: TrainSpec, d: Dims) -> Items:
    """Multi-latent attention (DeepSeek-V2 Sec. 2.1; mcore MLASelfAttention)."""
    h, heads = model.hidden_size, model.num_attention_heads // d.tp
    qk, pe, v = model.qk_head_dim, model.qk_pos_emb_head_dim, model.v_head_dim
    n, e = d.n, d.e
    it = norm_items(model, d, "input_norm", d.n_sp, h)
    it["down_proj.input"] = d.n_sp * h * e
    if model.q_lora_rank is not None:
        it |= norm_items(model, d, "q_norm", d.n_sp, model.q_lora_rank)
        it["q_up.input"] = d.n_sp * model.q_lora_rank * e
    it |= norm_items(model, d, "kv_norm", d.n_sp, model.kv_lora_rank)
    it["kv_up.input"] = d.n_sp * model.kv_lora_rank * e
    it["q"] = n * heads * (qk + pe) * e  # cat(q_nope, rotated q_pe)
    it["k"] = n * heads * (qk + pe) * e  # cat(k_nope, rotated k_pe expanded to heads)
    it["v"] = n * heads * v * e  # contiguous copy of the value half of kv_up
    if d.flash:
        it["softmax_lse"] = d.b * heads * d.s * 4
    else:
        it |= score_items(model, train, d, heads)
        if not d.te:
            it["rope.cos_sin"] = 4 * d.s * pe * e  # mcore's unfused RoPE: cos, sin
    it["proj.input"] = n * heads * v * e
    it["proj.dropout_mask"] = _dropout_mask(d.n_sp, h, model.hidden_dropout)
    return it


# ---- MLP --------------------------------------------------------------------------
# Saved tensors of a gated unit beyond fc1's output and the unit's own output: inside
# the activation, so dropped by its recompute and offloaded with it.
GLU_EXTRAS = ("clamped_input", "glu_offset", "sigmoid_output", "clamped_glu_half")


def ffn_items(model: ModelSpec, d: Dims, name: str, tokens: int, ffn: int,
              options: MemoryOptions) -> Items:
    """fc1 output and activation tensors of one (sharded) FFN of width ``ffn``."""
    e = d.e
    if model.gated:  # swiglu, quick_geglu
        clamp = model.activation_func_clamp_value is not None
        quick = model.activation == "quick_geglu"
        # megatron-core fuses quick-GeGLU only with the routing weights (experts).
        if options.bias_activation_fusion and (not quick or name == "experts"):
            # The fused function saves its input; the output is fc2's input. Clamped
            # (weighted_bias_quick_geglu_impl): the clamps keep views of fc1's output
            # and the fused function saves their torch.cat, a second copy.
            it = {f"{name}.fc1_output": tokens * 2 * ffn * e,
                  f"{name}.act_output": tokens * ffn * e}
            if quick:  # WeightedQuickGeGLUFunction also saves its 0-dim offset
                it[f"{name}.glu_offset"] = e
            if clamp and quick:
                it[f"{name}.clamped_input"] = tokens * 2 * ffn * e
            return it
        # mcore 0.16 unfused glu: silu keeps a view of fc1's output, mul keeps silu(x1)
        # and (x2 + glu_linear_offset), fc2 keeps the product. quick_gelu (x * sigmoid(
        # 1.702 x)) also keeps the sigmoid; a clamp gives the activation a new input,
        # which it keeps (the clamps keep views of fc1's output).
        it = {f"{name}.fc1_output": tokens * 2 * ffn * e,
              f"{name}.silu_output": tokens * ffn * e,
              f"{name}.linear_half": tokens * ffn * e,
              f"{name}.act_output": tokens * ffn * e}
        if quick:
            it[f"{name}.sigmoid_output"] = tokens * ffn * e
        if clamp:
            it[f"{name}.clamped_glu_half"] = tokens * ffn * e
        return it
    if model.activation == "relu":
        # relu's backward uses its output, which is also fc2's input.
        return {f"{name}.act_output": tokens * ffn * e}
    # gelu (fused or not) keeps its input; squared relu keeps relu's output for pow.
    return {f"{name}.fc1_output": tokens * ffn * e, f"{name}.act_output": tokens * ffn * e}


def mlp_items(model: ModelSpec, d: Dims, options: MemoryOptions) -> Items:
    h = model.hidden_size
    it = norm_items(model, d, "mlp_norm", d.n_sp, h)
    it["fc1.input"] = d.n_sp * h * d.e
    it |= ffn_items(model, d, "mlp", d.n, model.dense_ffn_size // d.tp, options)
    it["fc2.dropout_mask"] = _dropout_mask(d.n_sp, h, model.hidden_dropout)
    return it


def moe_tokens_per_rank(d: Dims, model: ModelSpec, par: ParallelSpec) -> int:
    """Token-expert assignments one rank's experts process, with balanced routing: each
    rank routes ``n_sp * topk`` and receives as many over EP, times the expert-TP
    all-gather (megatron-core's alltoall dispatcher)."""
    return d.n_sp * model.moe_router_topk * par.expert_tp


def moe_items(model: ModelSpec, par: ParallelSpec, d: Dims, options: MemoryOptions) -> Items:
    """MoE MLP with the alltoall dispatcher, softmax top-k router, no token dropping."""
    h, e, k = model.hidden_size, d.e, model.moe_router_topk
    pe = d.router_e or e  # the routing probabilities' bytes (--moe-router-dtype)
    ne = model.num_moe_experts
    r = d.n_sp  # tokens this rank routes
    t_e = moe_tokens_per_rank(d, model, par)
    it = norm_items(model, d, "mlp_norm", r, h)
    it["router.input"] = r * h * e  # also the shared experts' fc1 input
    it["router.probs_t"] = r * ne * pe  # probs.T.contiguous() kept by masked_select
    it["router.routing_map_t"] = r * ne  # bool
    it["router.topk_softmax"] = r * k * 4
    it["router.topk_indices"] = r * k * 8
    it["permute.sorted_indices"] = r * k * 8
    it["experts.input"] = t_e * h * e  # dispatched (and expert-TP gathered) tokens
    it["experts.probs"] = t_e * pe  # per-assignment probs for the weighted activation
    ffn = model.expert_ffn_size // par.expert_tp
    it |= ffn_items(model, d, "experts", t_e, ffn, options)
    if not (options.bias_activation_fusion and model.gated):
        # Unfused, the routing probs multiply the activation output as a separate op,
        # whose output is fc2's input. Only the gated activations have a fused kernel
        # with the probs (weighted_bias_swiglu_impl / weighted_bias_quick_geglu_impl,
        # megatron/core/transformer/mlp.py MLP.forward and moe/experts.py bias_act_func);
        # GeLU / ReLU experts always run activation, multiply and cast as three ops.
        it["experts.scaled_output"] = t_e * ffn * e
    if model.moe_shared_expert_intermediate_size:
        it |= ffn_items(model, d, "shared", d.n,
                        model.moe_shared_expert_intermediate_size // d.tp, options)
    it["mlp.dropout_mask"] = _dropout_mask(d.n_sp, h, model.hidden_dropout)
    return it
