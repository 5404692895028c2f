"""Per-rank bytes of parameters, gradients and optimizer state of one pipeline stage.

- DDP (megatron-core ``DistributedDataParallel``): gradients live in the contiguous
  grad buffer (``grad_buffer.py``): fp32 ``main_grad`` when ``grad_reduce_in_fp32``
  (Megatron-LM's default for bf16), else the param dtype; padding included.
- Distributed optimizer: parameters live in the buffer's ``param_data`` (padding
  included); fp32 master weights and the two Adam moments exist only for the real
  elements of this rank's shard of every bucket (dense buckets over dp x cp, expert
  buckets over expert-dp). NeMo 1's Apex DistributedFusedAdam shards the same way with
  its own bytes per element (``apex_adam.py``). Without the distributed optimizer
  (``Float16OptimizerWithFloat16Params``) every rank keeps master weights and moments of
  all its parameters: 6 + 12 bytes per bf16 param (Megatron-LM's
  theoretical_memory_usage.py: 18 vs 6 + 12/dp).
- FSDP (megatron FSDP / torch FSDP2): parameters, gradients and optimizer state sharded
  over the data-parallel group, plus the unsharded parameters and gradients of the
  modules being computed (two layers: the current one and the prefetched next).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from primus_ext.memory.apex_adam import apex_adam_bytes_per_element
from primus_ext.memory.grad_buffer import chunk_buffers
from primus_ext.memory.muon import MUON_OPTIMIZERS, muon_optimizer_bytes, muon_shard
from primus_ext.memory.options import MemoryOptions
from primus_ext.memory.params import layer_groups
from primus_ext.memory.rank_params import stage_params
from primus_ext.memory.te_states import (fp8_weight_bytes_per_element,
                                         precision_aware_optimizer_bytes,
                                         stage_fp8_weight_elements)
from primus_ext.spec.model import ModelSpec
from primus_ext.spec.parallel import ParallelSpec
from primus_ext.spec.train import TrainSpec


@dataclass(frozen=True, kw_only=True, slots=True)
class StageStates:
    num_params: int
    num_expert_params: int
    param_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    optimizer_elements: int  # parameter elements this rank keeps optimizer state for


def optimizer_bytes_per_element(train: TrainSpec) -> int:
    """fp32 master weights (mixed precision only) plus the optimizer's fp32 state; TE's
    FusedAdam figures with the precision-aware optimizer (``te_states.py``), Apex's with
    NeMo 1's distributed Adam (``apex_adam.py``)."""
    if train.optimizer_impl != "megatron":
        return apex_adam_bytes_per_element(train)
    if train.use_precision_aware_optimizer and train.optimizer == "adam":
        return precision_aware_optimizer_bytes(train)
    if not train.master_weights:
        # Moments in the parameters' dtype, no master copy (train.master_weights).
        return (2 if train.optimizer == "adam" else 1) * train.param_bytes
    # Adam: exp_avg, exp_avg_sq; SGD and Muon: momentum (Muon's non-matrix parameters
    # take Adam: stage_states counts them apart, memory/muon.py).
    state = 8 if train.optimizer == "adam" else 4
    master = 0 if train.precision == "fp32" else 4
    return state + master


def is_local_spec(train: TrainSpec) -> bool:
    """megatron-core's local layer spec (``train.te`` False once resolved); an unresolved
    ``te`` reads the unfused attention as the local spec's."""
    if train.te is None:
        return train.attention_backend == "unfused"
    return not train.te


def grad_bytes_per_element(train: TrainSpec, options: MemoryOptions,
                           par: ParallelSpec | None = None) -> int:
    fp32 = options.grad_reduce_in_fp32
    if fp32 is None:
        fp32 = par.grad_reduce_in_fp32 if par is not None else True
    if train.precision == "fp32" or (fp32 and train.main_grads_dtype == "fp32"):
        return 4
    return train.param_bytes


def chunk_grad_bytes(model: ModelSpec, par: ParallelSpec, train: TrainSpec, stage: int,
                     dp: int, expert_dp: int, options: MemoryOptions) -> tuple[int, ...]:
    """Unsharded gradient bytes of each model chunk of a stage (its DDP buffers' size),
    for gradients allocated at a chunk's first backward (``grad_buffer='on_backward'``)."""
    local_spec = is_local_spec(train)
    gbytes = grad_bytes_per_element(train, options, par)
    out = []
    for chunk in range(par.vpp):
        bufs = chunk_buffers(model, par, stage, chunk, dp, expert_dp,
                             options.ddp_bucket_size, options.pad_buckets_for_high_nccl_busbw,
                             local_spec)
        out.append((bufs.dense.numel + bufs.expert.numel) * gbytes)
    return tuple(out)


def distopt_shard_elements(model: ModelSpec, par: ParallelSpec, stage: int, dp: int,
                           expert_dp: int, dp_rank: int, expert_dp_rank: int,
                           options: MemoryOptions, local_spec: bool = False) -> int:
    """Optimizer-state elements of one rank (given its dense and expert DP ranks)."""
    total = 0
    for chunk in range(par.vpp):
        bufs = chunk_buffers(model, par, stage, chunk, dp, expert_dp,
                             options.ddp_bucket_size, options.pad_buckets_for_high_nccl_busbw,
                             local_spec)
        total += bufs.dense.shard_real_elements(dp, dp_rank)
        total += bufs.expert.shard_real_elements(expert_dp, expert_dp_rank)
    return total


def _largest_layer_params(model: ModelSpec, par: ParallelSpec) -> int:
    best = 0
    for moe in {model.is_moe_layer(i) for i in range(model.num_layers)}:
        layer = next(i for i in range(model.num_layers) if model.is_moe_layer(i) == moe)
        n = 0
        for g in layer_groups(model, layer):
            if g.shard == "tp":
                n += g.num_params // par.tp
            elif g.shard == "expert":
                n += g.num_params // (par.ep * par.expert_tp)
            elif g.shard == "expert_replicated":
                n += g.num_params // par.ep
            else:
                n += g.num_params
        best = max(best, n)
    return best


@lru_cache(maxsize=4096)
def stage_states(model: ModelSpec, par: ParallelSpec, train: TrainSpec, stage: int,
                 dp: int, expert_dp: int, options: MemoryOptions,
                 fp8_non_tn_gemm: bool = False) -> StageStates:
    """Parameter, gradient and optimizer bytes of one rank of pipeline stage ``stage``.

    ``dp`` is the dense gradient group (data x context parallel), ``expert_dp`` the expert
    one. With the distributed optimizer the largest shard over the DP ranks is taken.
    With ``train.te`` and FP8, TE's FP8 weight copies (``te_states.py``) are added."""
    local_spec = is_local_spec(train)
    sp = stage_params(model, par, stage, local_spec)
    pbytes = train.param_bytes
    gbytes = grad_bytes_per_element(train, options, par)
    obytes = optimizer_bytes_per_element(train)
    if par.fsdp:
        # Megatron-FSDP / torch FSDP2 (ZeRO-3). TE keeps no cached FP8 weight workspace
        # under FSDP2 (linear.py: "FSDP2: Don't save FP8 workspace"), so no FP8 copies
        # are added here; FP8 parameter sharding is not modelled (bf16 shards).
        dense = sp.num_params - sp.num_expert_params
        shard = -(-dense // dp) + -(-sp.num_expert_params // max(expert_dp, 1))
        working = 2 * _largest_layer_params(model, par)
        # Without resharding after forward (ZeRO-2, FSDP1 SHARD_GRAD_OP) every layer's
        # gathered parameters are held from its forward to its backward: at the
        # backward's start the whole stage is unsharded.
        gathered = working if par.fsdp_reshard_after_forward else max(sp.num_params,
                                                                         working)
        return StageStates(num_params=sp.num_params, num_expert_params=sp.num_expert_params,
                           param_bytes=(shard + gathered) * pbytes,
                           grad_bytes=(shard + working) * gbytes,
                           optimizer_bytes=shard * obytes, optimizer_elements=shard)
    buf_numel = 0
    opt_elems = 0
    for chunk in range(par.vpp):
        bufs = chunk_buffers(model, par, stage, chunk, dp, expert_dp,
                             options.ddp_bucket_size, options.pad_buckets_for_high_nccl_busbw,
                             local_spec)
        buf_numel += bufs.dense.numel + bufs.expert.numel
        if par.use_distributed_optimizer:
            opt_elems += bufs.dense.max_shard_real_elements(dp)
            opt_elems += bufs.expert.max_shard_real_elements(expert_dp)
    if par.use_distributed_optimizer:
        param_bytes = buf_numel * pbytes
    else:
        opt_elems = sp.num_params
        param_bytes = sp.num_params * pbytes
    if train.optimizer in MUON_OPTIMIZERS:
        master = 0 if train.precision == "fp32" or not train.master_weights else 4
        obytes_total = muon_optimizer_bytes(muon_shard(model, par, stage, local_spec),
                                            train.optimizer, master, dp, expert_dp,
                                            model, par, stage, local_spec)
        if train.optimizer == "dist_muon":
            opt_elems = -(-(sp.num_params - sp.num_expert_params) // dp) + \
                -(-sp.num_expert_params // max(expert_dp, 1))
    else:
        obytes_total = opt_elems * obytes
    if not train.master_weights and par.use_distributed_optimizer:
        # Without master weights a sharded optimizer (torch FSDP2's sharded parameters,
        # read as the distributed optimizer) keeps its shard's own parameter and
        # gradient in the parameters' dtype beside the full ones.
        obytes_total += opt_elems * 2 * pbytes
    if train.te and train.precision == "fp8":
        fp8_elems = stage_fp8_weight_elements(model, par, stage)
        param_bytes += fp8_elems * (fp8_weight_bytes_per_element(train, fp8_non_tn_gemm)
                                    - pbytes)
    return StageStates(num_params=sp.num_params, num_expert_params=sp.num_expert_params,
                       param_bytes=param_bytes, grad_bytes=buf_numel * gbytes,
                       optimizer_bytes=obytes_total, optimizer_elements=opt_elems)

