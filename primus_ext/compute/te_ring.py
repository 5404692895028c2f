"""Transformer Engine's p2p context-parallel ring: the work around the attention kernels.

megatron-core's ``cp_comm_type='p2p'`` runs core attention through Transformer Engine's
``AttnFuncWithCPAndKVP2P`` (``transformer_engine/pytorch/attention/dot_product_attention/
context_parallel.py``; read at NVIDIA/TransformerEngine@d0067d0da; v1.13's
``attention.py`` runs the same corrections, its ``out`` starting as zeros). With the
causal mask and load-balanced chunks each rank runs ``cp`` flash calls (the local causal
block, then half the keys or half the queries of the other ranks' chunks), and between
and after them, in the activations' dtype (the bf16 path; FP8 attention adds
dequantisation, not counted):

- forward: K and V concatenated into the first p2p send buffer (``torch.cat``); one
  softmax-LSE correction per step (``flash_attn_fwd_softmax_lse_correction``, on the
  small fp32 LSE); after the last step the output corrections, one fused kernel per step:
  the first writes ``out`` from step 0's partial output
  (``flash_attn_fwd_out_correction_init``: read, write), each later one reads the step's
  partial output and reads and writes ``out`` (``flash_attn_fwd_out_correction``, or
  ``..._second_half_...`` over half the queries where the step saw half of them);
- backward: K/V copied into the ring buffer (``p2p_comm_buffers[0][0].copy_(kv)``);
  per step the step's dQ copied (step 0) or added into the accumulator, and dK and dV
  (two kernels) copied or added into the dK/dV buffer that travels to the next rank.

The busiest rank is costed: the last one, whose later steps all take the full queries
and half the keys (every output correction and every dQ addition over all its queries;
its dK/dV additions over half the keys until the last step, which adds the full dK/dV).
The kernels run on the compute stream between the flash calls, so they add to the
layer's time; the p2p transfers themselves are costed in comm/layer_comm.py.
"""
from __future__ import annotations

from primus_ext.compute.ops import OpCost, Shapes, memory_op


def is_te_p2p_ring(sh: Shapes) -> bool:
    """CP through Transformer Engine's p2p ring (megatron-core's default ``cp_comm_type``;
    megatron-core's CP always runs through Transformer Engine's attention)."""
    return (sh.cp > 1 and sh.par.cp_comm_type == "p2p" and sh.te
            and sh.train.attention_backend != "unfused")


def te_ring_correction_op(sh: Shapes, d_qk: int, d_v: int, kv_heads: int) -> OpCost:
    """The ring's memory-bound work of one layer (module ``core_attn``: a recomputed core
    attention re-runs it). ``kv_heads`` are the heads K/V carry on this rank (TE sends
    the grouped K/V, not repeated to the query heads)."""
    cp, ab = sh.cp, sh.act_bytes
    rows = sh.batch * sh.seq / cp
    q = rows * sh.heads * d_qk
    o = rows * sh.heads * d_v
    kv = rows * kv_heads * (d_qk + d_v)
    fwd = 2 * ab * kv + ab * o * (2 + 3 * (cp - 1))
    # dQ: copy at step 0, add at every later step; dK/dV: copy of the first half at step
    # 0, additions into the first half until the last step, a full addition at the last.
    dq = ab * q * (2 + 3 * (cp - 1))
    dkv = ab * kv * (1 + 1.5 * max(cp - 2, 0) + 3)
    bwd = 2 * ab * kv + dq + dkv
    return memory_op(sh, "cp_ring_correction", "core_attn", fwd, bwd,
                     fwd_kernels=1 + 2 * cp, bwd_kernels=1 + 3 * cp)
