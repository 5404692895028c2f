"""Memory a GPU rank uses that is not a parameter, gradient, optimizer state or saved
activation: named terms, in two kinds.

Inside PyTorch's caching allocator (counted by ``torch.cuda.max_memory_allocated``, what
Megatron-LM logs as ``mem-max-allocated-bytes``; ``ALLOCATED_TERMS``):

- ``cublas_workspaces``: PyTorch's cuBLAS workspace, one per (handle, stream) pair
  (aten/src/ATen/cuda/CublasHandlePool.cpp ``setWorkspaceForHandle``, allocated through
  the caching allocator by ``getNewWorkspace``). Handles are per thread, and the backward
  runs on autograd's device thread: the forward's torch GEMMs (megatron-core's output
  layer, ``tensor_parallel/layers.py _linear_forward``, and every GEMM of the local spec)
  and the backward's each hold one, ``hardware.cublas_workspace_bytes`` each;
- ``te_workspaces``: Transformer Engine's GEMM workspace (transformer_engine/pytorch/
  cpp_extensions/gemm.py ``get_cublas_workspace``, cached per device): one for its
  GEMMs, four more for a grouped GEMM (``tex.get_num_cublas_streams()``, one per stream:
  megatron-core's TEGroupedMLP, ``parallel.moe_grouped_gemm``) and three for the
  userbuffers GEMMs of ``--tp-comm-overlap`` (``_NUM_MAX_UB_STREAMS``);
- ``dummy_wgrads``: with ``gradient_accumulation_fusion`` (Megatron-LM's default) the
  weight gradient is accumulated into ``main_grad`` by the GEMM and autograd gets a
  dummy tensor that Transformer Engine caches once per (shape, dtype)
  (transformer_engine/pytorch/module/base.py ``get_dummy_wgrad``, called by TE's
  Linear / LayerNormLinear / GroupedLinear backward and by megatron-core's
  ``LinearWithGradAccumulationAndAsyncCommunication.backward`` for the output layer and
  the local spec's linears when TE is installed): one weight-sized tensor per distinct
  linear weight shape of the stage. TE hands autograd that dummy only for a weight
  carrying megatron-core DDP's ``grad_added_to_main_grad`` attribute, else ``None``
  (TE v1.8 ``module/linear.py`` lines 591-608; the same test in TE 2.18's):
  NeMo 1's Apex DistributedFusedAdam (``train.optimizer_impl``) does not wrap the model
  in megatron-core's DDP, so no dummy exists there;
- ``global_memory_buffer``: megatron-core's ``GlobalMemoryBuffer`` ("mpu" tensors kept
  for reuse, one per dtype, sized to the largest request): the sequence-parallel
  all-gather of a column-parallel linear's input (the output layer's on the TE stack,
  every linear's on the local spec: full sequence x hidden) and the local
  ``DotProductAttention``'s baddbmm input (b x heads/tp x s x s).

Outside it (``DEVICE_TERMS``; the device peak adds them to the allocated one):

- ``cuda_context``: CUDA context, loaded kernels, library handles;
- ``nccl``: buffers of every NCCL communicator the rank uses (NCCL allocates them
  itself): one per parallel group of size > 1 that carries traffic (tp, cp, ep,
  expert-tp, dp x cp, expert-dp, pp, and the embedding group that ties first and last
  stage);
- ``fragmentation``: caching-allocator blocks reserved but not in use, a fraction of the
  activation bytes (allocated and freed every microbatch, unlike the static buffers).
"""
from __future__ import annotations

import re

from primus_ext.memory.dims import Dims
from primus_ext.memory.options import MemoryOptions
from primus_ext.memory.rank_params import chunk_param_tensors
from primus_ext.spec.hardware import HardwareSpec
from primus_ext.spec.model import ModelSpec
from primus_ext.spec.parallel import ParallelSpec
from primus_ext.spec.train import TrainSpec

ALLOCATED_TERMS = ("cublas_workspaces", "te_workspaces", "workspaces", "dummy_wgrads",
                   "global_memory_buffer")
DEVICE_TERMS = ("cuda_context", "nccl", "fragmentation")
# Torch cuBLAS handles with a workspace: the main thread's (forward) and autograd's
# device thread's (backward).
TORCH_GEMM_THREADS = 2
TE_GROUPED_GEMM_STREAMS = 4  # transformer_engine/common/util/multi_stream.cpp
TE_UB_STREAMS = 3  # transformer_engine/pytorch/cpp_extensions/gemm.py _NUM_MAX_UB_STREAMS


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
    if not d.flash and not d.te:
        heads = model.num_attention_heads // par.tp
        need = max(need, d.b * heads * d.s * d.s * d.e)
    return need


def workspace_items(model: ModelSpec, par: ParallelSpec, train: TrainSpec,
                    hw: HardwareSpec, options: MemoryOptions) -> dict[str, int]:
    """GEMM workspaces in the caching allocator (module docstring)."""
    if options.workspace_bytes is not None:
        return {"workspaces": options.workspace_bytes}
    te = 0
    if train.te:
        te = 1 + TE_GROUPED_GEMM_STREAMS * (model.is_moe and par.moe_grouped_gemm) \
            + TE_UB_STREAMS * par.tp_comm_overlap
    return {"cublas_workspaces": TORCH_GEMM_THREADS * hw.cublas_workspace_bytes,
            "te_workspaces": te * hw.te_workspace_bytes}


def dummy_wgrad_bytes(model: ModelSpec, par: ParallelSpec, train: TrainSpec,
                      stage: int, gpu: bool = True) -> int:
    """TE's cached dummy weight gradients on one rank of ``stage`` (module docstring):
    the linear weights of its chunks, one per distinct (module, size), in the
    parameter dtype. None without gradient accumulation fusion or off a GPU (no TE),
    none under FSDP (megatron-core's FSDP writes the GEMM into its own buffers) and none
    without megatron-core's DDP (Apex's distributed Adam)."""
    if not train.gradient_accumulation_fusion or par.fsdp or not gpu \
            or train.optimizer_impl != "megatron":
        return 0
    seen: set[tuple[str, int]] = set()
    for chunk in range(par.vpp):
        for t in chunk_param_tensors(model, par, stage, chunk, not train.te):
            if not t.name.endswith(".weight") or "linear_" not in t.name and \
                    "output_layer" not in t.name and "eh_proj" not in t.name:
                continue
            if "layernorm" in t.name.rsplit(".", 2)[-2] or "router" in t.name:
                continue
            kind = re.sub(r"(layers|local_experts)\.\d+\.", "", t.name)
            seen.add((kind, t.numel))
    return sum(numel for _, numel in seen) * train.param_bytes


def other_items(model: ModelSpec, par: ParallelSpec, train: TrainSpec, dp: int,
                expert_dp: int, activation_bytes: int, options: MemoryOptions,
                hw: HardwareSpec, stage: int | None = None) -> dict[str, int]:
    """Every non-model term by name: ``ALLOCATED_TERMS`` first, then ``DEVICE_TERMS``."""
    out = workspace_items(model, par, train, hw, options)
    if stage is not None:
        out["dummy_wgrads"] = dummy_wgrad_bytes(model, par, train, stage,
                                                hw.name != "cpu")
    out["global_memory_buffer"] = global_buffer_bytes(model, par, train)
    out["cuda_context"] = options.cuda_context_bytes
    out["nccl"] = options.nccl_bytes_per_communicator * num_communicators(
        model, par, dp, expert_dp)
    out["fragmentation"] = int(options.fragmentation_fraction * activation_bytes)
    return out


def device_only_bytes(other: dict[str, int]) -> int:
    """The part of ``other`` outside PyTorch's caching allocator."""
    return sum(v for k, v in other.items() if k in DEVICE_TERMS)
