"""The ops of one decoder layer on one rank: attention (MHA/GQA or MLA), dense MLP, MoE.

Per-rank shapes follow megatron-core: column-parallel QKV / fc1 split their outputs over
TP, row-parallel proj / fc2 their inputs; norms, residuals and the router run on the
sequence-parallel shard (``sp_tokens``); core attention holds ``heads / tp`` heads and
``s / cp`` queries; routed experts hold ``E / ep`` experts of width ``ffn / etp`` and, under
balanced routing, ``ep * etp * sp_tokens * topk / E`` rows each (= tokens * topk / E per
expert over the expert-parallel group). With token dropping (``moe_expert_capacity_factor``)
every rank sends an expert at most its capacity, exactly the capacity when padded
(``routed_fraction``).
"""
from __future__ import annotations

from dataclasses import replace
from math import ceil

from primus_ext.compute.gemm import GROUPED_STREAMS
from primus_ext.compute.attention import flash_attention, mean_keys_per_query, \
    unfused_attention
from primus_ext.compute.ops import OpCost, Shapes, bias_dropout_add, gated_activation, \
    linear, memory_op, norm
from primus_ext.compute.routing import expected_max_normal  # noqa: F401
from primus_ext.compute.routing import ranks_hit, routing_spread_factor
from primus_ext.compute.te_ring import is_te_p2p_ring, te_ring_correction_op
from primus_ext.compute.torch_async_tp import is_torch_async_tp, partials_sum_op
from primus_ext.compute.torch_ring import is_torch_ring, ring_merge_op


def core_attention(sh: Shapes, *, window: int | None, d_qk: int, d_v: int,
                   kv_heads: int) -> OpCost:
    """Causal core attention of this rank's ``s/cp`` queries (flash or unfused).

    With CP, load-balanced causal chunks give every rank ``1/cp`` of the work; the p2p ring
    (and the all-gather variant, which loops over the gathered chunks) runs it as ``cp``
    kernel calls over ``s/cp`` keys each, the all-to-all variant as one call over the full
    sequence with ``heads / cp`` heads.
    """
    m, tr, cp = sh.model, sh.train, sh.cp
    s = sh.seq
    keys = mean_keys_per_query(s, window)
    if tr.attention_backend == "unfused":
        t = unfused_attention(sh.hw, batch=sh.batch, heads=sh.heads, s_q=s / cp, s_k=s,
                              d_qk=d_qk, d_v=d_v, dropout=m.attention_dropout > 0,
                              softmax_fp32=tr.attention_softmax_in_fp32)
    elif cp > 1 and sh.par.cp_comm_type == "a2a":
        t = flash_attention(sh.hw, batch=sh.batch, heads=max(sh.heads // cp, 1),
                            kv_heads=max(kv_heads // cp, 1), s_q=s, s_kv=s, keys=keys,
                            call_keys=keys, d_qk=d_qk, d_v=d_v, impl=tr.flash_attn_impl)
    else:
        call_keys = keys if cp == 1 else min(keys, s / cp)
        t = flash_attention(sh.hw, batch=sh.batch, heads=sh.heads, kv_heads=kv_heads,
                            s_q=s / cp, s_kv=s, keys=keys, call_keys=call_keys, d_qk=d_qk,
                            d_v=d_v, num_calls=cp, impl=tr.flash_attn_impl)
    t_f, t_b, f_f, f_b, b_f, b_b = t
    # Kernels: a fused (flash) call is one forward kernel and two backward (the dO.O
    # preprocess and the main kernel; cuDNN and FlashAttention-2/3 alike), per CP ring
    # step; megatron-core's unfused path is baddbmm, the fused scale-mask-softmax, dropout
    # and bmm forward, and their gradients backward.
    calls = cp if cp > 1 and sh.par.cp_comm_type != "a2a" else 1
    k_f, k_b = (4, 5) if tr.attention_backend == "unfused" else (calls, 2 * calls)
    return OpCost("core_attn", "core_attn", t_f, t_b, 0.0, f_f, f_b, 0.0, b_f, b_b, k_f,
                  k_b)


def _rope(sh: Shapes, tokens: float, width: float, module: str = "rope") -> OpCost:
    """Rotary embedding of q and k: read and write once (fused). Eager complex-valued
    RoPE (``train.fused_elementwise=False``): x.float() (read 2, write 4 B per element),
    complex multiply (read 4, write 4), type_as (read 4, write 2): 20 B in 3 kernels, the
    same backward. Megatron's RoPE unfused (``train.apply_rope_fusion=False``):
    ``rope_utils._apply_rotary_pos_emb_bshd`` per tensor, in passes over it: t * cos (2),
    the rotate-half's neg (1) and cat (2), * sin (2), the add (3) and the final cat with
    the unrotated part (2): 12 in 6 kernels, after 6 small ones that build cos and sin
    from the frequencies; backward: the two products' and the neg's gradients (2, 2, 1),
    the rotate-half's cat (2), the sum of the two paths (3), the slice's gradient (1) and
    its add (3): 14 in 7 kernels. aten's own counts of megatron-core's code
    (tests/compute/test_elementwise_bytes.py); q and k are two calls."""
    if not sh.train.fused_elementwise:
        n = tokens * width
        return memory_op(sh, "rope", module, 20 * n, 20 * n, fwd_kernels=3, bwd_kernels=3)
    e = tokens * width * sh.act_bytes
    if not sh.train.apply_rope_fusion:
        return memory_op(sh, "rope", module, 12 * e, 14 * e, fwd_kernels=2 * 12,
                         bwd_kernels=2 * 7)
    return memory_op(sh, "rope", module, 2 * e, 2 * e)


def attention_ops(sh: Shapes, window: int | None) -> list[OpCost]:
    """input norm, QKV, (qk norm), RoPE, core attention, output projection, residual."""
    m = sh.model
    if m.multi_latent_attention:
        return mla_ops(sh, window)
    h, d, t = sh.hidden, sh.head_dim, sh.tokens
    q, kv = sh.heads * d, sh.groups * d
    ops = [norm(sh, "input_layernorm", sh.sp_tokens, h),
           linear(sh, "qkv", "qkv", t, h, q + 2 * kv)]
    if m.qk_layernorm:
        ops.append(norm(sh, "qk_layernorm", t, q + kv))
    if m.position_embedding_type == "rope":
        ops.append(_rope(sh, t, q + kv))
    ops.append(core_attention(sh, window=window, d_qk=d, d_v=d, kv_heads=sh.groups))
    if is_torch_ring(sh):
        ops.append(ring_merge_op(sh, d, d))
    elif is_te_p2p_ring(sh):
        ops.append(te_ring_correction_op(sh, d, d, sh.groups))
    ops.append(linear(sh, "proj", "proj", t, q, h))
    if is_torch_async_tp(sh):
        ops.append(partials_sum_op(sh, "proj_partials_sum", "proj"))
    ops.append(bias_dropout_add(sh, "attn_bda", sh.sp_tokens))
    return ops


def mla_down_tokens(sh: Shapes) -> float:
    """Tokens the MLA down projections see: with a q LoRA and SP they run on the local
    shard and the small latents are all-gathered (megatron-core MLASelfAttention)."""
    if sh.model.q_lora_rank is not None and sh.par.sequence_parallel:
        return sh.sp_tokens
    return sh.tokens


def mla_ops(sh: Shapes, window: int | None) -> list[OpCost]:
    """Multi-latent attention (DeepSeek-V2 Sec. 2.1): down projections replicated over TP,
    up projections column-parallel, heads of ``qk + rope`` (QK) and ``v`` (V) dims."""
    m = sh.model
    h, t, heads = sh.hidden, sh.tokens, sh.heads
    qk = m.qk_head_dim + m.qk_pos_emb_head_dim
    t_down = mla_down_tokens(sh)
    ops = [norm(sh, "input_layernorm", sh.sp_tokens, h)]
    if m.q_lora_rank is None:
        ops.append(linear(sh, "q_proj", "qkv", t, h, heads * qk))
    else:
        ops.append(linear(sh, "q_down", "qkv", t_down, h, m.q_lora_rank))
        ops.append(norm(sh, "q_layernorm", t, m.q_lora_rank))
        ops.append(linear(sh, "q_up", "mla_up_proj", t, m.q_lora_rank, heads * qk))
    ops.append(linear(sh, "kv_down", "qkv", t_down, h, m.kv_lora_rank + m.qk_pos_emb_head_dim))
    ops.append(norm(sh, "kv_layernorm", t, m.kv_lora_rank))
    ops.append(linear(sh, "kv_up", "mla_up_proj", t, m.kv_lora_rank,
                      heads * (m.qk_head_dim + m.v_head_dim)))
    ops.append(_rope(sh, t, (heads + 1) * m.qk_pos_emb_head_dim, "mla_up_proj"))
    ops.append(core_attention(sh, window=window, d_qk=qk, d_v=m.v_head_dim, kv_heads=heads))
    if is_torch_ring(sh):
        ops.append(ring_merge_op(sh, qk, m.v_head_dim))
    elif is_te_p2p_ring(sh):
        ops.append(te_ring_correction_op(sh, qk, m.v_head_dim, heads))
    ops.append(linear(sh, "proj", "proj", t, heads * m.v_head_dim, h))
    ops.append(bias_dropout_add(sh, "attn_bda", sh.sp_tokens))
    return ops


def dense_mlp_ops(sh: Shapes, width: int | None = None, prefix: str = "",
                  module: str = "mlp") -> list[OpCost]:
    """fc1 (x2 when gated), activation, fc2 over all ``tokens`` (gathered under SP)."""
    m = sh.model
    f = (width or m.dense_ffn_size) // sh.tp
    fc1_out = 2 * f if m.gated else f
    t = sh.tokens
    return [linear(sh, f"{prefix}fc1", module, t, sh.hidden, fc1_out),
            gated_activation(sh, f"{prefix}act", module, t, f),
            linear(sh, f"{prefix}fc2", module, t, f, sh.hidden)]


def routed_fraction(sh: Shapes) -> float:
    """Rows a rank dispatches over ``sp_tokens * topk`` under balanced routing. Dropless:
    1. With a capacity factor each expert takes at most ``capacity = ceil(T k / E * cf)``
    of the rank's ``T`` tokens (megatron-core ``moe_utils.get_capacity`` on the router's
    tokens x topk; ``apply_router_token_dropping``): ``min(T k / E, capacity)`` of its
    balanced ``T k / E``; padded (``moe_pad_expert_input_to_capacity``), exactly the
    capacity (``MoEAlltoAllTokenDispatcher.preprocess``: ``capacity * tp * ep`` rows per
    local expert), so ``cf`` above 1 sends and computes padding."""
    m = sh.model
    cf = m.moe_expert_capacity_factor
    if cf is None:
        return 1.0
    per = sh.sp_tokens * m.moe_router_topk / m.num_moe_experts
    if per <= 0:
        return 1.0
    cap = ceil(per * cf)
    kept = cap if m.moe_pad_expert_input_to_capacity else min(per, cap)
    return kept / per


def _slowed(op: OpCost, factor: float) -> OpCost:
    if factor == 1.0:
        return op
    return replace(op, fwd_s=op.fwd_s * factor, dgrad_s=op.dgrad_s * factor,
                   wgrad_s=op.wgrad_s * factor)


def moe_rows(sh: Shapes) -> tuple[int, float, float]:
    """(local experts, rows per local expert, rows on this rank) under balanced routing
    and the recipe's token dropping."""
    m = sh.model
    local = m.num_moe_experts // sh.ep
    # after the expert-TP gather
    rows_rank = sh.etp * sh.sp_tokens * m.moe_router_topk * routed_fraction(sh)
    return local, rows_rank / local, rows_rank


def _router_dtype(sh: Shapes) -> str:
    """The gating GEMM's dtype: --moe-router-dtype fp32 when set, else the model's (bf16
    under FP8: megatron-core keeps the router out of FP8)."""
    if sh.train.moe_router_dtype:
        return sh.train.moe_router_dtype
    return "bf16" if sh.gemm_dtype == "fp8" else sh.gemm_dtype


def moe_ops(sh: Shapes) -> list[OpCost]:
    """Router, permute, grouped expert GEMMs, unpermute, shared experts.

    Permutes are gathers/scatters at ``gather_hbm_efficiency``. The alltoall dispatcher
    (megatron-core ``MoEAlltoAllTokenDispatcher``) copies each token ``topk`` times into
    dispatch order before the all-to-all and, with several local experts and EP,
    regroups the received rows by expert after it (``sort_chunks_by_idxs``); unpermute
    and unsort mirror them. The flex dispatcher sends the tokens unpermuted
    (``_DeepepManager.dispatch`` takes the token indices): DeepEP permutes the received
    tokens into expert order once (``get_permuted_hidden_states_by_experts``, read the
    ``ranks_hit`` copies a rank receives, write its routed rows) and unpermutes before the
    combine; HybridEP permutes inside its dispatch and combine kernels
    (``_HybridEPManager``: "dispatch ... and permute tokens for experts in single
    step"), so no permute kernel runs.
    """
    m = sh.model
    h, ts, k, e = sh.hidden, sh.sp_tokens, m.moe_router_topk, m.num_moe_experts
    ab = sh.act_bytes
    local, rows_e, rows = moe_rows(sh)
    routed = ts * k * routed_fraction(sh)  # rows this rank dispatches
    f = m.expert_ffn_size // sh.etp
    fc1_out = 2 * f if m.gated else f
    logits = ts * e * 4.0  # router scores in fp32: softmax/sigmoid, top-k, aux loss
    ops = [norm(sh, "pre_mlp_layernorm", ts, h),
           linear(sh, "router", "moe", ts, h, e, dtype=_router_dtype(sh)),
           memory_op(sh, "router_topk", "moe", 4 * logits, 3 * logits, fwd_kernels=4,
                     bwd_kernels=3)]
    flex = sh.par.moe_token_dispatcher_type == "flex" and sh.ep > 1
    backend = sh.par.moe_flex_dispatcher_backend
    # ops on the received rows run as long as the busiest rank's (routing_spread_factor)
    spread = routing_spread_factor(sh)
    expert_ops = []
    if flex:
        if backend == "deepep":
            hit = ranks_hit(m, sh.ep, sh.train.moe_router_exact_balance)
            recv = ts * hit * routed_fraction(sh)
            moved = (recv + rows) * h * ab
            expert_ops.append(memory_op(sh, "permute", "moe", moved, moved, gather=True))
    else:
        ops.append(memory_op(sh, "permute", "moe", ts * h * ab + routed * h * ab,
                             ts * h * ab + routed * h * ab, gather=True))
        if local > 1 and sh.ep > 1:
            expert_ops.append(memory_op(sh, "sort_chunks", "moe", 2 * rows * h * ab,
                                        2 * rows * h * ab, gather=True))
    expert_ops += expert_mlp_ops(sh, rows_e, rows, local, f, fc1_out)
    if flex:
        if backend == "deepep":
            moved = (recv + rows) * h * ab + rows * 4
            expert_ops.append(memory_op(sh, "unpermute", "moe", moved, moved, gather=True))
    else:
        if local > 1 and sh.ep > 1:
            expert_ops.append(memory_op(sh, "unsort_chunks", "moe", 2 * rows * h * ab,
                                        2 * rows * h * ab, gather=True))
    ops += [_slowed(o, spread) for o in expert_ops]
    if not flex:
        ops.append(memory_op(sh, "unpermute", "moe",
                             routed * h * ab + ts * h * ab + routed * 4,
                             routed * h * ab + ts * h * ab + routed * 4, gather=True))
    if m.moe_shared_expert_intermediate_size:
        ops += dense_mlp_ops(sh, m.moe_shared_expert_intermediate_size, "shared_",
                             "shared_experts")
    ops.append(bias_dropout_add(sh, "mlp_bda", ts))
    return ops


def expert_mlp_ops(sh: Shapes, rows_e: float, rows: float, local: int, f: int,
                   fc1_out: int) -> list[OpCost]:
    """The local experts' fc1, activation and fc2, by how megatron-core runs them:

    - ``moe_grouped_gemm`` (TEGroupedMLP): Transformer Engine's GroupedLinear, one cuBLAS
      GEMM per expert on four streams (compute/gemm.py GROUPED_STREAMS);
    - without it, SequentialMLP (megatron-core moe/experts.py): ``for expert in
      self.local_experts`` each expert's own MLP in turn, one GEMM at a time on the
      current stream (``streams=1``);
    - ``moe_fused_grouped_mlp`` (``use_transformer_engine_op_fuser`` with TE's CuTe DSL
      fused grouped MLP, TE PR 2622 "a fused operation for a grouped MLP block ... an MXFP8
      grouped GEMM and SwiGLU"): fc1 and fc2 each one grouped kernel over all local
      experts, the SwiGLU with the routing probabilities and the quantisation of fc2's
      input in fc1's epilogue, their gradients in fc2's dgrad epilogue (megatron-core
      experts.py TEGroupedMLP._is_fused_impl_supported: gated SwiGLU / quick-GEGLU
      only): no activation kernel and no cast of fc2's input or fc1's output gradient.
    """
    par = sh.par
    fused = par.moe_fused_grouped_mlp and sh.model.gated and sh.etp == 1
    if fused:
        ops = [linear(sh, "experts_fc1", "moe", rows_e, sh.hidden, fc1_out, groups=local,
                      one_kernel=True, cast_grad=False),
               linear(sh, "experts_fc2", "moe", rows_e, f, sh.hidden, groups=local,
                      one_kernel=True, cast_input=False)]
    else:
        streams = grouped_streams(sh) if par.moe_grouped_gemm else 1
        ops = [linear(sh, "experts_fc1", "moe", rows_e, sh.hidden, fc1_out, groups=local,
                      streams=streams),
               gated_activation(sh, "experts_act", "moe_act", rows, f),
               linear(sh, "experts_fc2", "moe", rows_e, f, sh.hidden, groups=local,
                      streams=streams)]
        if sh.model.add_bias_linear and par.moe_grouped_gemm:
            ops.append(_expert_fc2_bias(sh, rows, local))
    return _fp8_padding(sh, ops, rows)


def grouped_streams(sh: Shapes) -> int:
    """Per-expert GEMMs of a grouped GEMM that run at once: its streams
    (``GROUPED_STREAMS``), at most the hardware queues the runtime gives the process
    (``train.device_hw_queues``): streams beyond them share a queue round-robin (HIP
    ``GPU_MAX_HW_QUEUES``), and kernels of one queue run in turn."""
    queues = sh.train.device_hw_queues
    return GROUPED_STREAMS if queues is None else min(GROUPED_STREAMS, queues)


def _expert_fc2_bias(sh: Shapes, rows: float, local: int) -> OpCost:
    """The experts' fc2 bias (``add_bias_linear``, e.g. gpt-oss) in TEGroupedMLP.

    fc2 returns its bias apart (``skip_bias_add=True``) and megatron-core adds it scaled by
    each row's routing probability in eager PyTorch, one expert at a time
    (``TEGroupedMLP._apply_bias``, moe/experts.py, core 0.16 through Aug 2026 outside the
    fused op-fuser path): ``torch.cat([t + b * p for each expert]).to(dtype)``. Forward,
    per expert ``b * p`` (write) and ``t + b * p`` (read two, write one), then the cat
    (read, write): six element passes in ``2 * local + 1`` kernels. Backward (autograd):
    the bias gradient ``sum_rows(dy * p)`` and the probabilities' ``sum_h(dy * b)`` per
    expert, each a product written and read back by a reduction: six passes in
    ``4 * local`` kernels; ``dy`` itself passes through."""
    e = rows * sh.hidden * sh.act_bytes
    return memory_op(sh, "experts_fc2_bias", "moe", 6 * e, 6 * e,
                     fwd_kernels=2 * local + 1, bwd_kernels=4 * local)


def _fp8_padding(sh: Shapes, ops: list[OpCost], rows: float) -> list[OpCost]:
    """FP8 grouped GEMMs need every expert's rows padded to the quantisation block
    (megatron-core experts.py TEGroupedMLP.forward: ``quantization_padding`` /
    ``quantization_unpadding``, Transformer Engine fp8_padding.py ``Fp8Padding``: 16 rows,
    32 for MXFP8): a dropless routing's counts are not multiples of it, so the input is
    copied into a padded buffer (``fused_multi_row_padding``) and the output back out, and
    the backward mirrors both. None with token dropping padded to capacity or with the
    router padding the routing map itself (``--moe-router-padding-for-fp8 /
    -quantization``: parallel.moe_router_terms 'padding')."""
    m = sh.model
    if (sh.gemm_dtype != "fp8" or m.moe_expert_capacity_factor is not None
            or "padding" in sh.par.moe_router_terms):
        return ops
    moved = 2 * rows * sh.hidden * sh.act_bytes  # read and write the rows
    return ([memory_op(sh, "fp8_padding", "moe", moved, moved)] + ops
            + [memory_op(sh, "fp8_unpadding", "moe", moved, moved)])


def mlp_block_ops(sh: Shapes, moe: bool) -> list[OpCost]:
    if moe:
        return moe_ops(sh)
    fc2_sum = [partials_sum_op(sh, "fc2_partials_sum", "mlp")] if is_torch_async_tp(sh) \
        else []
    return ([norm(sh, "pre_mlp_layernorm", sh.sp_tokens, sh.hidden)] + dense_mlp_ops(sh)
            + fc2_sum + [bias_dropout_add(sh, "mlp_bda", sh.sp_tokens)])


def decoder_layer_ops(sh: Shapes, *, moe: bool, window: int | None) -> list[OpCost]:
    return attention_ops(sh, window) + mlp_block_ops(sh, moe)
