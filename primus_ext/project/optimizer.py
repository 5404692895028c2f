"""Optimizer step time: a memory-bound fused update (achievable-performance.md 5.2).

Fused Adam (apex/TE multi-tensor apply) per locally updated parameter reads the fp32
master weight, gradient, m and v (16 B), writes master, m and v (12 B) and the BF16 model
copy (2 B): 30 B; without master weights (``train.master_weights``) 7 accesses in the
parameters' dtype. The gradient-norm pass reads the local fp32 gradients (4 B) and zeroing
the gradient buffer writes every parameter's fp32 gradient (4 B). SGD with momentum reads
master, gradient, momentum and writes master, momentum and the copy: 22 B. NeMo 1's Apex
DistributedFusedAdam (``train.optimizer_impl``) moves its own state
(``memory/apex_adam.py``): 26 B with fp32 state over bf16 parameters, 14 B with bf16 state.

With the distributed optimizer (or FSDP) a rank updates ``1/dp_cp`` of its dense and
``1/expert_dp`` of its expert parameters; the gather of the updated parameters is
comm/step_comm.py's ``param_gather``. Multi-tensor apply keeps launches to a few dozen.
"""
from __future__ import annotations

from primus_ext.comm.groups import group_span
from primus_ext.memory.apex_adam import apex_adam_step_bytes
from primus_ext.memory.muon import MUON_OPTIMIZERS, muon_shard
from primus_ext.memory.options import DEFAULT_OPTIONS
from primus_ext.memory.states import grad_bytes_per_element, is_local_spec
from primus_ext.project.muon_step import muon_step
from primus_ext.spec.run import RunSpec

ADAM_BYTES_PER_PARAM = 30.0
SGD_BYTES_PER_PARAM = 22.0
GRAD_NORM_BYTES_PER_PARAM = 4.0
ZERO_GRAD_BYTES_PER_PARAM = 4.0
NUM_KERNELS = 24


def updated_params(spec: RunSpec, num_dense_params: float, num_expert_params: float = 0.0
                   ) -> float:
    """Parameters this rank's optimizer updates."""
    par = spec.parallel
    if par.use_distributed_optimizer or par.fsdp:
        return (num_dense_params / group_span(spec, "dp_cp").size
                + num_expert_params / group_span(spec, "edp").size)
    return num_dense_params + num_expert_params


def muon_step_s(spec: RunSpec, stage: int) -> float:
    """Muon / dist_muon (memory/muon.py): the momentum update is SGD's 22 B per Muon
    element, Adam's 30 B for the rest, plus the Muon weights' kernels and Newton-Schulz
    GEMMs (BF16 under ``--muon-fp32-matmul-prec medium``: project/muon_step.py) on the
    slowest rank. dist_muon runs 1/dp of the bytes and its rank's own weights; the
    bytes of its all-gather of the updated parameters are not timed."""
    hw = spec.cluster.hardware
    par = spec.parallel
    sh = muon_shard(spec.model, par, stage, is_local_spec(spec.train))
    nbytes = SGD_BYTES_PER_PARAM * (sh.muon_dense + sh.muon_expert) + \
        ADAM_BYTES_PER_PARAM * (sh.adam_dense + sh.adam_expert)
    if spec.train.optimizer == "dist_muon":
        nbytes /= group_span(spec, "dp_cp").size
    total = sh.muon_dense + sh.muon_expert + sh.adam_dense + sh.adam_expert
    nbytes += (GRAD_NORM_BYTES_PER_PARAM + ZERO_GRAD_BYTES_PER_PARAM) * total
    bw = hw.hbm_gbps * 1e9 * hw.hbm_efficiency
    return nbytes / bw + muon_step(spec, stage).device_s + NUM_KERNELS * hw.kernel_overhead_s


def optimizer_step_s(spec: RunSpec, num_params_on_rank,
                     num_expert_params_on_rank: float = 0.0, stage: int = 0) -> float:
    """Seconds of one optimizer step on a rank *holding* these dense and expert parameters
    (before optimizer sharding: e.g. ``stage_param_counts(spec, stage)``, which may be
    passed as the tuple itself); the distributed-optimizer / FSDP shard is taken here."""
    if spec.train.optimizer in MUON_OPTIMIZERS:
        return muon_step_s(spec, stage)
    if isinstance(num_params_on_rank, tuple):
        num_params_on_rank, num_expert_params_on_rank = num_params_on_rank
    hw = spec.cluster.hardware
    local = updated_params(spec, num_params_on_rank, num_expert_params_on_rank)
    held = num_params_on_rank + num_expert_params_on_rank
    per = ADAM_BYTES_PER_PARAM if spec.train.optimizer == "adam" else SGD_BYTES_PER_PARAM
    if not spec.train.master_weights:
        # No master copy (train.master_weights): Adam reads parameter, gradient, m, v
        # and writes parameter, m, v, all in the parameters' dtype (SGD: 5 of them).
        per = (7 if spec.train.optimizer == "adam" else 5) * spec.train.param_bytes
    if spec.train.optimizer_impl != "megatron":
        per = apex_adam_step_bytes(spec.train, grad_bytes_per_element(
            spec.train, DEFAULT_OPTIONS, spec.parallel))
    nbytes = (per + GRAD_NORM_BYTES_PER_PARAM) * local
    # FSDP holds only its shard of the gradient buffer; DDP zeroes the full local buffer.
    nbytes += ZERO_GRAD_BYTES_PER_PARAM * (local if spec.parallel.fsdp else held)
    bw = hw.hbm_gbps * 1e9 * hw.hbm_efficiency
    return nbytes / bw + NUM_KERNELS * hw.kernel_overhead_s
