"""memory_report(spec) -> MemoryReport: per-rank memory of every pipeline stage.

A stage's total is its parameters, gradients and optimizer state (``states.py``), its
activations -- bytes saved per microbatch (``activations.py``) times the microbatches in
flight at its peak (``inflight.py``), plus the largest transient working set (the loss,
a layer's backward or unfused attention) and, on the last stage, deferred embedding
wgrad buffers -- and the non-model terms of ``overhead.py``. Two peaks per stage:
``allocated_peak_bytes`` (what ``torch.cuda.max_memory_allocated`` reports: everything
but the terms outside PyTorch's allocator) and ``total_bytes``, the device peak. Gradients made in the backward
(``parallel.grad_buffer='on_backward'``) are counted with the activations at the
schedule step where their sum peaks (``inflight.peak_with_gradients``). The report
never raises for a layout that does not fit: ``fits`` says so. All byte counts are
Python ints.

Fast by construction: every per-stage piece is an ``lru_cache`` on frozen (hashable)
specs, so a tuner that varies one field recomputes only what depends on it.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import lru_cache

from primus_ext.memory.activations import chunk_activations
from primus_ext.memory.head import deferred_wgrad_bytes
from primus_ext.memory.inflight import (inflight_1f1b, inflight_interleaved,
                                        peak_with_gradients)
from primus_ext.memory.options import TIGHT_FRACTION, DEFAULT_OPTIONS, MemoryOptions
from primus_ext.memory.overhead import device_only_bytes, other_items
from primus_ext.memory.states import chunk_grad_bytes, grad_bytes_per_element, stage_states
from primus_ext.spec.run import RunSpec, uses_te
from primus_ext.spec.train import TrainSpec

STAGE_KEYS = ("stage", "num_params", "param_bytes", "grad_bytes", "optimizer_bytes",
              "activation_bytes_per_microbatch", "num_inflight_microbatches",
              "activation_bytes", "other_bytes", "total_bytes", "allocated_peak_bytes",
              "other")


@dataclass(frozen=True, kw_only=True, slots=True)
class StageMemory:
    stage: int
    num_params: int  # parameter elements on one rank of this stage
    num_expert_params: int
    param_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    activation_bytes_per_microbatch: int  # all chunks of the stage, one microbatch each
    num_inflight_microbatches: int  # microbatches alive at the peak (chunk-mbs / vpp)
    activation_bytes: int  # in-flight saved activations plus one backward's working set
    other_bytes: int
    total_bytes: int  # the device peak: allocated peak + the DEVICE_TERMS of ``other``
    inflight_per_chunk: tuple[int, ...] = ()
    other: tuple[tuple[str, int], ...] = ()  # other_bytes by name (overhead.py)

    @property
    def allocated_peak_bytes(self) -> int:
        """What ``torch.cuda.max_memory_allocated`` reports on this rank (Megatron-LM's
        ``mem-max-allocated-bytes``): the device peak less the terms outside PyTorch's
        caching allocator (CUDA context, NCCL buffers, fragmentation)."""
        return self.total_bytes - device_only_bytes(dict(self.other))

    def to_dict(self) -> dict:
        out = {k: getattr(self, k) for k in STAGE_KEYS}
        out["other"] = dict(self.other)
        return out


@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryReport:
    stages: tuple[StageMemory, ...]
    peak_bytes: int
    worst_stage: int
    device_bytes: int
    fits: bool
    margin_fraction: float = 0.0
    notes: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict:
        return {"stages": [s.to_dict() for s in self.stages], "peak_bytes": self.peak_bytes,
                "device_bytes": self.device_bytes, "fits": self.fits}


def resolved_train(spec: RunSpec):
    """``spec.train`` with ``te`` (None -> ``uses_te``) and ``masked_softmax_fusion``
    (None -> on unless the hardware is the ``cpu`` preset, whose torch path has no fused
    kernel) resolved, so the cached pieces see which kernels they model."""
    t = spec.train
    te = uses_te(spec)
    fused = t.masked_softmax_fusion
    if fused is None:
        fused = spec.cluster.hardware.name != "cpu"
    if t.te is te and t.masked_softmax_fusion is fused:
        return t
    return dataclasses.replace(t, te=te, masked_softmax_fusion=fused)


def _stage(spec: RunSpec, stage: int, options: MemoryOptions,
           train: TrainSpec) -> StageMemory:
    model, par = spec.model, spec.parallel
    # The DDP buffers and optimizer shards span one distributed-optimizer instance
    # (distributed_data_parallel.py: intra_dp_cp_group / intra_expt_dp_group).
    inst = par.num_distributed_optimizer_instances
    dp = max(spec.dp * par.cp // inst, 1)
    expert_dp = max(spec.expert_dp // inst, 1)
    st = stage_states(model, par, train, stage, dp, expert_dp, options,
                      spec.cluster.hardware.fp8_non_tn_gemm)
    chunks = [chunk_activations(model, par, train, stage, c, options)
              for c in range(par.vpp)]
    per_mb = [c.bytes_per_microbatch for c in chunks]
    m = spec.num_microbatches
    # Interleaving with m % pp != 0 runs as one microbatch group (megatron-core rejects a
    # short last group; --microbatch-group-size-per-virtual-pipeline-stage m, as
    # project/estimate.py schedules it and flags.py writes it).
    group = m if par.vpp > 1 and m % par.pp else None
    grad_bytes = st.grad_bytes
    if par.grad_buffer == "on_backward":
        # Unsharded gradients exist from a chunk's first backward to its last: the peak
        # is stepped over the schedule with them; the reduce-scattered fp32 shard stays.
        per_chunk = chunk_grad_bytes(model, par, train, stage, dp, expert_dp, options)
        alive, lazy = peak_with_gradients(par.pp, par.vpp, stage, m, tuple(per_mb),
                                          per_chunk, group)
        grad_bytes = st.optimizer_elements * grad_bytes_per_element(train, options,
                                                                    par) + lazy
    elif par.vpp == 1:
        alive = (inflight_1f1b(par.pp, stage, m),)
    else:
        alive = inflight_interleaved(par.pp, par.vpp, stage, m, tuple(per_mb), group)
    act = sum(a * b for a, b in zip(alive, per_mb)) + max(c.working_bytes for c in chunks)
    if stage == par.pp - 1:
        act += deferred_wgrad_bytes(model, par, train, m)  # head.py
    other = other_items(model, par, train, dp, expert_dp, act, options,
                        spec.cluster.hardware, stage)
    other_bytes = sum(other.values())
    return StageMemory(
        stage=stage, num_params=st.num_params, num_expert_params=st.num_expert_params,
        param_bytes=st.param_bytes, grad_bytes=grad_bytes,
        optimizer_bytes=st.optimizer_bytes, activation_bytes_per_microbatch=sum(per_mb),
        num_inflight_microbatches=-(-sum(alive) // par.vpp), activation_bytes=act,
        other_bytes=other_bytes,
        total_bytes=st.param_bytes + grad_bytes + st.optimizer_bytes + act + other_bytes,
        inflight_per_chunk=tuple(alive), other=tuple(other.items()))


@lru_cache(maxsize=8192)
def _report(spec: RunSpec, options: MemoryOptions) -> MemoryReport:
    # States, activations and buffers are per microbatch: their caches are keyed on the
    # training spec without the global batch, so a new batch size (a new microbatch
    # count) recomputes only the in-flight counts.
    train = _per_microbatch(resolved_train(spec))
    stages = tuple(_stage(spec, s, options, train) for s in range(spec.parallel.pp))
    worst = max(range(len(stages)), key=lambda i: stages[i].total_bytes)
    peak = stages[worst].total_bytes
    device = spec.cluster.hardware.hbm_bytes
    notes = [_stack_note(spec)]
    if spec.parallel.cp > 1:
        notes.append("cp: activations of the local sequence s/cp" + (
            f"; the {spec.parallel.cp_comm_type} KV buffers of one layer's backward"
            if uses_te(spec) else ""))
    fits = peak * (1 + options.margin_fraction) <= device
    if fits and peak * (1 + TIGHT_FRACTION) > device:
        notes.append(f"tight: the peak leaves {(device - peak) / 2**30:.1f} GiB "
                     f"({1 - peak / device:.1%}) of the device free")
    return MemoryReport(stages=stages, peak_bytes=peak, worst_stage=worst,
                        device_bytes=device, fits=fits,
                        margin_fraction=options.margin_fraction, notes=tuple(notes))


def _stack_note(spec: RunSpec) -> str:
    if not uses_te(spec):
        return ("layers: megatron-core local spec (train.te=false), "
                f"{'unfused' if spec.train.attention_backend == 'unfused' else 'fused'} "
                "attention" + (
            "; fp8 weights and saved GEMM inputs counted in bf16"
            if spec.train.precision == "fp8" else ""))
    attention = "fused" if spec.train.attention_backend == "flash" else "unfused"
    note = f"layers: Transformer Engine spec (train.te=true), {attention} attention"
    if spec.train.precision == "fp8":
        note += ("; fp8 GEMM inputs saved at 1 byte, FP8 weight copies "
                 + ("(fp8_param_gather)" if spec.train.fp8_param_gather
                    else "cached beside the bf16 weights"))
    return note


def _per_microbatch(train: TrainSpec) -> TrainSpec:
    return dataclasses.replace(train, global_batch_size=train.micro_batch_size)


def memory_report(spec: RunSpec, options: MemoryOptions | None = None) -> MemoryReport:
    """Per-stage, per-rank memory of ``spec`` (see the module docstring)."""
    if spec.framework == "torchtitan":
        from primus_ext.memory.torchtitan import torchtitan_memory_report
        return torchtitan_memory_report(spec, options)
    return _report(spec, options or DEFAULT_OPTIONS)
