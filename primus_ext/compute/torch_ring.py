"""PyTorch ``context_parallel`` ring attention: the work around the attention kernels.

torchtitan's context parallelism is PyTorch's experimental ``context_parallel``
(``torch/distributed/tensor/experimental/_attention.py``, torch 2.5-2.6, the benchmark
build of Dec 2024): ``F.scaled_dot_product_attention`` on DTensors sharded on the
sequence, dispatched to ``_templated_ring_attention`` with the flash op. With the default
options (``_ContextParallelOptions``: ``convert_to_f32=True``, ``enable_load_balance=True``,
``rotate_method=ALL_GATHER``) every rank holds two round-robin chunks, runs ``cp`` flash
calls of equal work (the local causal block, then half the queries or half the keys of
each other rank's chunks) and between the calls:

- forward: ``key.contiguous()``, ``value.contiguous()`` and ``torch.cat`` of both into the
  buffer the all-gather sends; ``_SDPAMerger.step`` casts each partial output and LSE to
  fp32 and folds it into the running output (``out - sigmoid(lse_i - lse) * (out -
  out_i)``), ``_partial_update`` re-concatenating the half it touched; the merged output
  is cast back to bf16 at the end (``results``);
- backward (``_templated_ring_attention_backward``): fp32 accumulators for dQ, dK, dV
  (``accum_dtype = float32``), every step's flash gradients added into them, dK/dV
  concatenated and rotated to the next rank in fp32 (``dkv_rotater`` is ALL_TO_ALL, one
  ``permute_tensor`` per step, the last one waited after the loop), cast back at the end.

torchtitan's Llama attention repeats the K/V heads before SDPA (``repeat_kv`` in
``torchtitan/models/llama/model.py`` ``Attention.forward``), so the ring's K/V and dK/dV
have ``heads`` heads, not ``kv_heads``.

Bytes per element of a rank's ``s/cp`` local rows: compiled (``train.fused_elementwise``,
torch.compile traces the DTensor ring into the block's graph and inductor fuses each
step's elementwise chain): a step's merge reads the bf16 partial output and reads and
writes the fp32 running output (10 B per output element); a backward step reads the bf16
gradients and reads and writes the fp32 accumulators (10 B per Q, K and V element).
Eager: the merge is six kernels (cast 6 B, ``out - out_i`` 12 B, ``sigmoid * diff`` 8 B,
``out - ...`` 12 B per element) and the unused K/V ``cat`` of each step (the all-gather
rotater ignores it) is paid; the backward also zero-fills its accumulators (in the
inputs' transposed layout, so the first ``flatten`` for the send copies dK/dV), re-copies
the whole dK/dV accumulator in ``_partial_update`` (8 B) and concatenates dK/dV for the
send (8 B). The busiest rank is costed: the last one, whose later steps all take the
full queries and half the keys (no partial merge of the output).
"""
from __future__ import annotations

from primus_ext.compute.ops import OpCost, Shapes, memory_op


def is_torch_ring(sh: Shapes) -> bool:
    """CP by PyTorch's ``context_parallel`` (all-gather rotation, no Transformer Engine):
    the form torchtitan's view takes (project/torchtitan.py); megatron-core's CP always
    runs through Transformer Engine's attention."""
    return (sh.cp > 1 and sh.par.cp_comm_type == "allgather" and not sh.te
            and sh.train.attention_backend != "unfused")


def ring_elements(sh: Shapes, d_qk: int, d_v: int) -> tuple[float, float, float]:
    """(Q, K+V, O) elements of the rank's local rows, K/V at the repeated ``heads``."""
    rows = sh.batch * sh.seq / sh.cp
    q = rows * sh.heads * d_qk
    return q, rows * sh.heads * (d_qk + d_v), rows * sh.heads * d_v


def ring_merge_op(sh: Shapes, d_qk: int, d_v: int) -> OpCost:
    """The ring's memory-bound work of one layer (module ``core_attn``: full recompute
    and selective core-attention recompute re-run it with the attention)."""
    cp = sh.cp
    q, kv, o = ring_elements(sh, d_qk, d_v)
    gather_in = 4 * kv  # contiguous K/V written once into the all-gather's send buffer
    if sh.train.fused_elementwise:
        fwd = gather_in + 6 * o + 10 * o * (cp - 1) + 6 * o
        bwd = gather_in + 10 * (q + kv) * cp + 6 * q + 6 * kv
        k_f, k_b = 2 + (cp - 1), 2 + 2 * cp
    else:
        fwd = (2 * gather_in + 6 * o + 38 * o * (cp - 1) + 4 * kv * max(cp - 2, 0)
               + 6 * o)
        bwd = (2 * gather_in + 4 * (q + kv) + 8 * kv + 10 * q * cp + 10 * kv
               + 13 * kv * (cp - 1) + 8 * kv * cp + 4 * kv * max(cp - 2, 0) + 6 * q + 6 * kv)
        k_f, k_b = 3 + 7 * (cp - 1), 6 + 6 * cp
    return memory_op(sh, "cp_ring_merge", "core_attn", fwd, bwd, fwd_kernels=k_f,
                     bwd_kernels=k_b)
