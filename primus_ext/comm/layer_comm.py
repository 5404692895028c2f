"""The collectives inside one layer, per microbatch, with the overlap rule applied.

Overlap rules (``exposed_s`` in comm/overlap.py: hidden up to the window, the rest
exposed, hidden time charged ``comm_overlap_penalty``):

- **TP with SP** (megatron-core / TE, column-parallel QKV/fc1, row-parallel proj/fc2).
  Forward: all-gather of the input before the column GEMM, reduce-scatter after the row
  GEMM; exposed unless ``tp_comm_overlap``, which pipelines each with its GEMM (TE
  userbuffers) so it hides up to that GEMM's time. Backward: the mirror all-gather of the
  row layer's output gradient (hidden behind its dgrad only with ``tp_comm_overlap``);
  the re-gather of the column layer's input for its wgrad overlaps its dgrad and the
  reduce-scatter of its input gradient overlaps its wgrad -- always, as megatron-core
  issues both asynchronously. In an FP8 run the gathers carry the quantized GEMM inputs
  (``gemm_input_gather_bytes``), the reduce-scatters the 16-bit GEMM outputs.
- **TP without SP**: an all-reduce after the row GEMM in forward (exposed) and one of the
  column layer's input gradient in backward, overlapped with its wgrad (megatron's async
  grad all-reduce). TE's TP overlap needs SP, so ``tp_comm_overlap`` changes nothing here.
- **CP p2p** (ring attention): ``cp - 1`` K/V exchanges per forward (K/V plus dK/dV in
  backward), each overlapped with the attention step on the previous chunk.
  **CP a2a** (Ulysses): Q, K, V in and O out per forward, the mirror in backward; exposed.
  **CP allgather**: one all-gather of the sequence's K/V per forward and another in
  backward. PyTorch context_parallel (rotate_method=allgather, torchtitan;
  ``torch_ring_comms``) issues each gather asynchronously behind the first (local)
  attention step and rotates dK/dV in fp32 step by step, all hidden in eager mode and
  all exposed under torch.compile (the traced ring waits at once). Transformer Engine's
  ``AttnFuncWithCPAndKVAllGather``
  (megatron-core cp_comm_type=all_gather, ``uses_te``) gathers K/V synchronously before
  any attention call (``gather_along_first_dim`` without async_op, forward and
  backward) and reduce-scatters dK/dV after the last: all three exposed.
- **EP**: token dispatch and combine (forward) and their mirrors (backward), by the
  dispatcher and overlap rules of comm/moe_comm.py (``moe_token_dispatcher_type``,
  ``overlap_moe_expert_parallel_comm``, ``moe_shared_expert_overlap``). Expert TP adds
  an all-gather of the received rows and a reduce-scatter of the expert outputs.
- **FSDP** (built by the backend, which knows the layer's compute): per layer and
  microbatch an all-gather of the parameters in forward and in backward and a
  reduce-scatter of the gradients in backward, prefetched / issued while the layer
  computes, so they hide behind that layer's compute of the same phase (the backward's
  including its recompute), sharing it in proportion to their times.

Each CommOp is paired with the megatron module it belongs to, so a recomputed module
re-issues its forward collectives (see project/simulate_backend.py).
"""
from __future__ import annotations

from primus_ext.comm.collectives import all_gather_s, collective_s, p2p_s
from primus_ext.comm.groups import group_span
from primus_ext.comm.moe_comm import ep_comm_ops
from primus_ext.comm.overlap import exposed_s
from primus_ext.comm.step_comm import grad_bytes_per_param
from primus_ext.compute.ops import OpCost, Shapes
from primus_ext.compute.layer_ops import routed_fraction, routing_spread_factor
from primus_ext.compute.costs import CommOp
from primus_ext.spec.run import RunSpec, uses_te

Tagged = tuple[CommOp, str]  # (collective, module)


def _comm(spec: RunSpec, name: str, axis: str, coll: str, nbytes: float, phase: str,
          window: float | None, module: str, times: int = 1) -> Tagged:
    span = group_span(spec, axis)
    hw = spec.cluster.hardware
    one = collective_s(hw, span, coll, nbytes)
    secs = one * times
    exp = times * exposed_s(hw, one, None if window is None else window / times)
    return (CommOp(name=name, axis=axis, collective=coll, num_bytes=int(nbytes * times),
                   group_size=span.size, phase=phase, seconds=secs, exposed_s=exp,
                   calls=times), module)


# Block-scale bytes per FP8 value: MXFP8 one E8M0 byte per 32, blockwise one fp32 per 128.
_FP8_SCALE_BYTES = {"mxfp8": 1 / 32, "blockwise": 4 / 128}


def gemm_input_gather_bytes(spec: RunSpec, nbytes: float) -> float:
    """Bytes of a TP all-gather of a GEMM input held as ``nbytes`` of 16-bit values. An
    FP8 run quantizes the input before the gather: Transformer Engine's column-parallel
    forward (``layernorm_linear.py`` / ``linear.py``: ``gather_along_first_dim(...,
    quantizer=input_quantizer)``), the backward's gather of the row-parallel output
    gradient (``base.py grad_output_preprocess`` with the grad-output quantizer) and the
    wgrad re-gather of the input; torchao's ``Float8ColwiseParallel`` /
    ``Float8RowwiseParallel`` (torchtitan's tensorwise float8 TP) likewise cast before
    the forward gather and the backward gradient gather. One byte a value, plus the
    recipe's block scales (``_FP8_SCALE_BYTES``)."""
    t = spec.train
    if t.precision != "fp8":
        return nbytes
    return nbytes / 2 * (1.0 + _FP8_SCALE_BYTES.get(t.fp8_recipe, 0.0))


def tp_pair(spec: RunSpec, sh: Shapes, ops: dict[str, OpCost], col: list[str], row: str,
            col_module: str, row_module: str, prefix: str,
            in_bytes: float | None = None) -> list[Tagged]:
    """TP collectives around a column-parallel op group ``col`` and a row-parallel ``row``.
    Reductions carry 16-bit GEMM outputs; gathers carry GEMM inputs
    (``gemm_input_gather_bytes``)."""
    if sh.tp == 1:
        return []
    par = spec.parallel
    nbytes = sh.tokens * sh.hidden * sh.act_bytes
    in_bytes = nbytes if in_bytes is None else in_bytes
    ov = par.tp_comm_overlap
    c_f = sum(ops[c].fwd_s for c in col)
    c_d = sum(ops[c].dgrad_s for c in col)
    c_w = sum(ops[c].wgrad_s for c in col)
    r = ops[row]
    if not par.sequence_parallel:
        return [_comm(spec, f"{prefix}.tp_all_reduce", "tp", "all_reduce", nbytes, "fwd",
                      None, row_module),
                _comm(spec, f"{prefix}.tp_all_reduce_dgrad", "tp", "all_reduce", in_bytes,
                      "bwd", c_w, col_module)]
    g_in, g_out = gemm_input_gather_bytes(spec, in_bytes), gemm_input_gather_bytes(spec, nbytes)
    out = []
    if col:
        out.append(_comm(spec, f"{prefix}.tp_all_gather", "tp", "all_gather", g_in,
                         "fwd", c_f if ov else None, col_module))
    out.append(_comm(spec, f"{prefix}.tp_reduce_scatter", "tp", "reduce_scatter", nbytes,
                     "fwd", r.fwd_s if ov else None, row_module))
    out.append(_comm(spec, f"{prefix}.tp_all_gather_dgrad", "tp", "all_gather", g_out,
                     "bwd", r.dgrad_s if ov else None, row_module))
    if col:
        out.append(_comm(spec, f"{prefix}.tp_all_gather_wgrad_input", "tp", "all_gather",
                         g_in, "bwd", c_d, col_module))
        out.append(_comm(spec, f"{prefix}.tp_reduce_scatter_dgrad", "tp", "reduce_scatter",
                         in_bytes, "bwd", c_w, col_module))
    return out


def attention_comms(spec: RunSpec, sh: Shapes, ops: dict[str, OpCost]) -> list[Tagged]:
    m = spec.model
    out: list[Tagged] = []
    if m.multi_latent_attention:
        if m.q_lora_rank is not None and spec.parallel.sequence_parallel and sh.tp > 1:
            # Down projections ran on the local shard; gather the latents, not x.
            lat = sh.tokens * (m.q_lora_rank + m.kv_lora_rank + m.qk_pos_emb_head_dim)
            lat *= sh.act_bytes
            out.append(_comm(spec, "attn.tp_all_gather_latent", "tp", "all_gather", lat,
                             "fwd", None, "qkv"))
            out.append(_comm(spec, "attn.tp_reduce_scatter_latent_dgrad", "tp",
                             "reduce_scatter", lat, "bwd", None, "qkv"))
            out += tp_pair(spec, sh, ops, [], "proj", "qkv", "proj", "attn")
        else:
            col = ["q_proj" if m.q_lora_rank is None else "q_down", "kv_down"]
            out += tp_pair(spec, sh, ops, col, "proj", "qkv", "proj", "attn")
    else:
        out += tp_pair(spec, sh, ops, ["qkv"], "proj", "qkv", "proj", "attn")
    out += cp_comms(spec, sh, ops["core_attn"])
    return out


def cp_comms(spec: RunSpec, sh: Shapes, attn: OpCost) -> list[Tagged]:
    cp = sh.cp
    if cp == 1:
        return []
    m = spec.model
    if m.multi_latent_attention:
        kv_heads, d_k, d_v = sh.heads, m.qk_head_dim + m.qk_pos_emb_head_dim, m.v_head_dim
    else:
        kv_heads, d_k, d_v = sh.groups, sh.head_dim, sh.head_dim
    ab, toks = sh.act_bytes, sh.tokens
    kv = toks * kv_heads * (d_k + d_v) * ab
    if spec.parallel.cp_comm_type == "a2a":
        qo = toks * sh.heads * (d_k + d_v) * ab
        return [_comm(spec, "attn.cp_all_to_all", "cp", "all_to_all", qo + kv, "fwd", None,
                      "core_attn"),
                _comm(spec, "attn.cp_all_to_all_bwd", "cp", "all_to_all", qo + kv, "bwd",
                      None, "core_attn")]
    if spec.parallel.cp_comm_type == "allgather":
        if uses_te(spec):
            # Transformer Engine's variant is synchronous (module docstring): no window.
            full = kv * cp
            return [_comm(spec, "attn.cp_all_gather", "cp", "all_gather", full, "fwd", None,
                          "core_attn"),
                    _comm(spec, "attn.cp_all_gather_bwd", "cp", "all_gather", full, "bwd",
                          None, "core_attn"),
                    _comm(spec, "attn.cp_reduce_scatter_dkv", "cp", "reduce_scatter", full,
                          "bwd", None, "core_attn")]
        return torch_ring_comms(spec, sh, attn)
    span = group_span(spec, "cp")
    hw = spec.cluster.hardware
    out = []
    for phase, nbytes, compute in (("fwd", kv, attn.fwd_s), ("bwd", 2 * kv, attn.dgrad_s)):
        step = p2p_s(hw, nbytes, cross_domain=not span.intra_domain,
                     domain_size=span.domain_size)
        exp = (cp - 1) * exposed_s(hw, step, compute / cp)
        out.append((CommOp(name=f"attn.cp_ring_p2p_{phase}", axis="cp", collective="p2p",
                           num_bytes=int(nbytes * (cp - 1)), group_size=cp, phase=phase,
                           seconds=(cp - 1) * step, exposed_s=exp), "core_attn"))
    return out


def torch_ring_comms(spec: RunSpec, sh: Shapes, attn: OpCost) -> list[Tagged]:
    """PyTorch ``context_parallel`` (torchtitan; compute/torch_ring.py): K/V, repeated to
    ``heads`` by torchtitan's ``repeat_kv``, all-gathered once per forward and again in
    backward; dK/dV rotated in fp32 by one ``permute_tensor`` per backward step
    (``dkv_rotater`` is ALL_TO_ALL), the last waited after the loop.

    Eager, the functional collectives return ``AsyncCollectiveTensor``: the gather hides
    behind the first (local) flash call and each rotation behind the next step's flash
    backward. Compiled (``train.fused_elementwise``: the torchtitan view's
    ``train.compile``, per-block ``torch.compile`` tracing the ring into the block's
    graph), every collective is exposed: while tracing, ``_functional_collectives.
    _maybe_wrap_tensor`` emits ``wait_tensor`` right after the collective (the ring's
    ``_maybe_wait`` notes the traced tensor is no ``AsyncCollectiveTensor``), and
    Inductor keeps it there in a training graph -- ``post_grad_passes`` runs
    ``reorder_for_locality`` (which sinks waits to their first use) only
    ``if is_inference``, and ``config.reorder_for_compute_comm_overlap`` is off by
    default. The compiled code waits on the K/V gather before the first flash call and
    on each dK/dV rotation before the next flash backward
    (tests/slow/test_torch_ring_compiled.py reads it from Inductor's output)."""
    cp = sh.cp
    m = spec.model
    d_k = m.qk_head_dim + m.qk_pos_emb_head_dim if m.multi_latent_attention else sh.head_dim
    d_v = m.v_head_dim if m.multi_latent_attention else sh.head_dim
    kv = sh.tokens * sh.heads * (d_k + d_v) * sh.act_bytes
    compiled = spec.train.fused_elementwise
    step_f = None if compiled else attn.fwd_s / cp
    step_b = None if compiled else attn.dgrad_s / cp
    out = [_comm(spec, "attn.cp_all_gather", "cp", "all_gather", kv * cp, "fwd", step_f,
                 "core_attn"),
           _comm(spec, "attn.cp_all_gather_bwd", "cp", "all_gather", kv * cp, "bwd", step_b,
                 "core_attn")]
    span = group_span(spec, "cp")
    hw = spec.cluster.hardware
    dkv = kv * 4 / sh.act_bytes  # fp32 accumulators
    one = p2p_s(hw, dkv, cross_domain=not span.intra_domain, domain_size=span.domain_size)
    exp = (cp - 1) * exposed_s(hw, one, step_b) + one
    out.append((CommOp(name="attn.cp_dkv_rotate", axis="cp", collective="p2p",
                       num_bytes=int(dkv * cp), group_size=cp, phase="bwd", seconds=cp * one,
                       exposed_s=exp), "core_attn"))
    return out


def mlp_comms(spec: RunSpec, sh: Shapes, ops: dict[str, OpCost], moe: bool,
              layer_compute_s: float = 0.0) -> list[Tagged]:
    """TP collectives of the MLP; for an MoE block also the EP dispatch / combine
    (comm/moe_comm.py; ``layer_compute_s`` is the whole layer's forward + backward, the
    window of the merged-schedule EP overlap) and the expert-TP gather / scatter."""
    if not moe:
        return tp_pair(spec, sh, ops, ["fc1"], "fc2", "mlp", "mlp", "mlp")
    m = spec.model
    out: list[Tagged] = []
    shared_f = shared_b = 0.0
    if m.moe_shared_expert_intermediate_size:
        out += tp_pair(spec, sh, ops, ["shared_fc1"], "shared_fc2", "shared_experts",
                       "shared_experts", "shared_experts")
        shared = [o for o in ops.values() if o.module == "shared_experts"]
        shared_f = sum(o.fwd_s for o in shared)
        shared_b = sum(o.dgrad_s + o.wgrad_s for o in shared)
    # Dispatched rows follow the token dropping (padding is sent too); the allgather
    # dispatcher gathers every token whatever the capacity.
    routed = routed_fraction(sh)
    tokens = sh.sp_tokens * m.moe_router_topk * routed * sh.hidden * sh.act_bytes
    if sh.ep > 1:
        sent = (sh.sp_tokens if spec.parallel.moe_token_dispatcher_type == "allgather"
                else sh.sp_tokens * routed)
        out += [(c, "moe") for c in ep_comm_ops(
            spec, sent, sh.hidden * sh.act_bytes, layer_compute_s=layer_compute_s,
            shared_fwd_s=shared_f, shared_bwd_s=shared_b,
            busiest=routing_spread_factor(sh))]
    if sh.etp > 1:
        rows = tokens * sh.etp
        out.append(_comm(spec, "moe.etp_all_gather", "etp", "all_gather", rows, "fwd", None,
                         "moe"))
        out.append(_comm(spec, "moe.etp_reduce_scatter", "etp", "reduce_scatter", rows,
                         "fwd", None, "moe"))
        out.append(_comm(spec, "moe.etp_all_gather_dgrad", "etp", "all_gather", rows, "bwd",
                         None, "moe"))
        out.append(_comm(spec, "moe.etp_reduce_scatter_dgrad", "etp", "reduce_scatter",
                         rows, "bwd", None, "moe"))
    return out


def embedding_comms(spec: RunSpec, sh: Shapes) -> list[Tagged]:
    if sh.tp == 1:
        return []
    nbytes = sh.tokens * sh.hidden * sh.act_bytes
    if spec.parallel.sequence_parallel:
        return [_comm(spec, "embedding.tp_reduce_scatter", "tp", "reduce_scatter", nbytes,
                      "fwd", None, "embedding"),
                _comm(spec, "embedding.tp_all_gather_dgrad", "tp", "all_gather", nbytes,
                      "bwd", None, "embedding")]
    return [_comm(spec, "embedding.tp_all_reduce", "tp", "all_reduce", nbytes, "fwd", None,
                  "embedding")]


def output_comms(spec: RunSpec, sh: Shapes, ops: dict[str, OpCost]) -> list[Tagged]:
    """Gather of the hidden states before the logits GEMM (under SP), its mirrors, and
    the three small all-reduces of the vocab-parallel cross-entropy (max, target logit,
    sum of exponentials) in fp32 per token, per loss chunk."""
    if sh.tp == 1:
        return []
    par = spec.parallel
    nbytes = sh.tokens * sh.hidden * sh.act_bytes
    o = ops["output_layer"]
    out = []
    if par.sequence_parallel:
        out.append(_comm(spec, "output.tp_all_gather", "tp", "all_gather", nbytes, "fwd",
                         o.fwd_s if par.tp_comm_overlap else None, "output"))
        out.append(_comm(spec, "output.tp_all_gather_wgrad_input", "tp", "all_gather",
                         nbytes, "bwd", o.dgrad_s, "output"))
        out.append(_comm(spec, "output.tp_reduce_scatter_dgrad", "tp", "reduce_scatter",
                         nbytes, "bwd", o.wgrad_s, "output"))
    else:
        out.append(_comm(spec, "output.tp_all_reduce_dgrad", "tp", "all_reduce", nbytes,
                         "bwd", o.wgrad_s, "output"))
    # Per loss chunk (train.loss_chunks; torchtitan's ChunkedLossWrapper): each of the 3
    # all-reduces covers the chunk's tokens.
    k = spec.train.loss_chunks or 1
    out.append(_comm(spec, "output.ce_tp_all_reduce", "tp", "all_reduce",
                     sh.tokens * 4.0 / k, "fwd", None, "output", times=3 * k))
    return out


def mtp_glue_comms(spec: RunSpec, sh: Shapes) -> list[Tagged]:
    """eh_proj: gather its 2h input and its h/tp output in forward, the mirrors in
    backward (under SP); the embedding lookup's own reduction."""
    out = embedding_comms(spec, sh)
    if sh.tp == 1 or not spec.parallel.sequence_parallel:
        return out
    x2 = sh.tokens * 2 * sh.hidden * sh.act_bytes
    y = sh.tokens * sh.hidden * sh.act_bytes
    out.append(_comm(spec, "mtp.tp_all_gather", "tp", "all_gather", x2 + y, "fwd", None,
                     "mtp"))
    out.append(_comm(spec, "mtp.tp_reduce_scatter_dgrad", "tp", "reduce_scatter", x2 + y,
                     "bwd", None, "mtp"))
    return out


def fsdp_comms(spec: RunSpec, dense_params: float, expert_params: float,
               fwd_window: float, bwd_window: float, prefix: str) -> list[Tagged]:
    """Per-layer FSDP collectives (one microbatch): parameters gathered in forward and
    again in backward (resharded after forward), gradients reduce-scattered in fp32
    (16-bit for fp16 runs or ``grad_reduce_in_fp32=False``), hidden behind the layer's
    own compute of the phase where the device runs them on streams
    (``hardware.collective_streams``; on a CPU each blocks its rank: all exposed).
    Without ``parallel.fsdp_reshard_after_forward`` (ZeRO-2, FSDP1 SHARD_GRAD_OP) the
    parameters stay gathered from the forward to the backward: no backward all-gather.
    The backward's gather and reduce-scatter share its window in proportion to their
    times (both move over the same links while the backward runs: what they expose
    together is their sum less the window)."""
    if not spec.parallel.fsdp:
        return []
    hw = spec.cluster.hardware
    if not hw.collective_streams:
        fwd_window = bwd_window = None
    pb = spec.train.param_bytes
    gb = grad_bytes_per_param(spec)
    out: list[Tagged] = []
    groups = []
    for axis, n in (("dp_cp", dense_params), ("edp", expert_params)):
        span = group_span(spec, axis)
        if n <= 0 or span.size == 1:
            continue
        groups.append((axis, n, span, all_gather_s(hw, span, n * pb),
                       collective_s(hw, span, "reduce_scatter", n * gb)))
    # Each phase's window is shared by its collectives in proportion to their times.
    regather = spec.parallel.fsdp_reshard_after_forward
    fwd_total = sum(ag for *_, ag, _ in groups)
    bwd_total = sum((ag if regather else 0.0) + rs for *_, ag, rs in groups)
    for axis, n, span, ag, rs in groups:
        ax = "dp" if axis == "dp_cp" else "edp"
        ops = [("fsdp_all_gather", "all_gather", ag, n * pb, "fwd",
                _share(fwd_window, ag, fwd_total))]
        if regather:
            ops.append(("fsdp_all_gather_bwd", "all_gather", ag, n * pb, "bwd",
                        _share(bwd_window, ag, bwd_total)))
        ops.append(("fsdp_reduce_scatter", "reduce_scatter", rs, n * gb, "bwd",
                    _share(bwd_window, rs, bwd_total)))
        for name, coll, secs, nbytes, phase, win in ops:
            out.append((CommOp(name=f"{prefix}.{name}_{ax}", axis=ax, collective=coll,
                               num_bytes=int(nbytes), group_size=span.size, phase=phase,
                               seconds=secs, exposed_s=exposed_s(hw, secs, win)), "fsdp"))
    return out


def _share(window: float | None, secs: float, total: float) -> float | None:
    """A collective's share of a window its phase's collectives split by their times."""
    if window is None:
        return None
    return window * secs / total if total > 0 else window
