"""Memory a GPU rank uses that is not a parameter, gradient, optimizer state or saved
activation: named terms, each configurable through MemoryOptions.

- ``cuda_context``: CUDA context, loaded kernels, library handles.
- ``workspaces``: cuBLAS / TE GEMM workspaces.
- ``nccl``: buffers of every NCCL communicator the rank uses (one per parallel group of
  size > 1 that carries traffic: tp, cp, ep, expert-tp, dp x cp, expert-dp, pp, and the
  embedding group that ties first and last stage).
- ``global_memory_buffer``: megatron-core's ``GlobalMemoryBuffer`` ("mpu" tensors kept
  for reuse): the sequence-parallel all-gather of a linear layer's input (full
  sequence x hidden) and, for the unfused attention, the baddbmm score buffer
  (b x heads/tp x s x s). One buffer per dtype, sized to the largest request.
- ``fragmentation``: caching-allocator blocks reserved but not in use, a fraction of the
  activation bytes (allocated and freed every microbatch, unlike the static buffers).
"""
from __future__ import annotations

from primus_ext.memory.act_layer import Dims
from primus_ext.memory.options import MemoryOptions
from primus_ext.spec.model import ModelSpec
from primus_ext.spec.parallel import ParallelSpec
from primus_ext.spec.train import TrainSpec


def num_communicators(model: ModelSpec, par: ParallelSpec, dp: int, expert_dp: int) -> int:
    groups = [par.tp, par.cp, dp * par.cp, par.pp]
    if model.is_moe:
        groups += [par.ep, par.expert_tp if par.expert_tp != par.tp else 1, expert_dp]
    n = sum(1 for g in groups if g > 1)
    tied = not model.untie_embeddings_and_output_weights or model.mtp_num_layers > 0
    if par.pp > 1 and tied:
        n += 1  # embedding group (first and last stage)
    return n


def global_buffer_bytes(model: ModelSpec, par: ParallelSpec, train: TrainSpec) -> int:
    d = Dims.of(par, train)
    need = 0
    if par.sequence_parallel:
        need = d.n * model.hidden_size * d.e
    if not d.flash:
        heads = model.num_attention_heads // par.tp
        need = max(need, d.b * heads * d.s * d.s * d.e)
    return need


def other_items(model: ModelSpec, par: ParallelSpec, train: TrainSpec, dp: int,
                expert_dp: int, activation_bytes: int,
                options: MemoryOptions) -> dict[str, int]:
    return {
        "cuda_context": options.cuda_context_bytes,
        "workspaces": options.workspace_bytes,
        "nccl": options.nccl_bytes_per_communicator * num_communicators(model, par, dp,
                                                                        expert_dp),
        "global_memory_buffer": global_buffer_bytes(model, par, train),
        "fragmentation": int(options.fragmentation_fraction * activation_bytes),
    }
