"""PyTorch's async TP: the reduction its fused matmul-reduce-scatter leaves on the
compute stream.

torchtitan's async TP (``--parallelism.enable_async_tensor_parallel`` with
``torch.compile``) is inductor's micro-pipeline TP pass: a row-parallel matmul followed by
its sequence-parallel reduce-scatter becomes ``symm_mem.fused_matmul_reduce_scatter``
(``fused_scaled_matmul_reduce_scatter`` for float8). Its implementation
(``torch/distributed/_symmetric_memory/__init__.py _fused_matmul_reduce_scatter_impl``,
torch 2.5 to 2.13) computes the output in ``tp`` row chunks, sends each chunk's partial
to the rank that owns those rows over symmetric memory (copy engine), and then sums the
``tp`` partials it received with ``torch.sum`` over a ``[tp, rows / tp, N]`` stack: a
memory-bound kernel on the compute stream that reads the whole ``rows x N`` partial
output and writes the rank's ``rows / tp`` share. NCCL's reduce-scatter, and Transformer
Engine's userbuffers overlap, reduce inside the collective instead; there the reduction
hides behind the GEMMs with the transfer.

Which reduce-scatters are fused: the forward's row-parallel outputs (attention's output
projection, the MLP's down projection), and again in a recomputed forward. The
backward's column-parallel input gradients are sums of several matmuls (torchtitan's
separate ``wq``, ``wk``, ``wv`` and ``w1``, ``w3``), which the pass's ``mm ->
reduce_scatter`` pattern does not match.

megatron-core's TP overlap is Transformer Engine's (its local layers have none), so a
TP-overlapped costed spec without TE is the form torchtitan's view takes
(``project/torchtitan.py``), as ``torch_ring.is_torch_ring`` reads CP.
"""
from __future__ import annotations

from primus_ext.compute.ops import OpCost, Shapes, memory_op


def is_torch_async_tp(sh: Shapes) -> bool:
    p = sh.par
    return sh.tp > 1 and p.tp_comm_overlap and p.sequence_parallel and not sh.te


def partials_sum_op(sh: Shapes, name: str, module: str) -> OpCost:
    """The ``torch.sum`` over the received partials after a row-parallel GEMM of
    ``sh.tokens`` rows and ``hidden`` outputs: read them all, write the local rows
    (the GEMM's output dtype, bf16 for float8 too)."""
    moved = (sh.tokens + sh.sp_tokens) * sh.hidden * sh.act_bytes
    return memory_op(sh, name, module, moved, 0.0)
