"""Data-parallel synchronisation and the optimizer step, per pipeline stage.

The collectives and their overlap rule live in ``comm.step_comm`` (gradient reduce-scatter
or all-reduce in buckets, the distributed optimizer's parameter all-gather; FSDP's
per-layer traffic is inside the layer costs). Here they are applied to each stage with
its windows: the last microbatch's backward hides the gradient sync, the first
microbatch's forward hides the parameter gather.
"""
from __future__ import annotations

from dataclasses import dataclass

from primus_ext.comm.step_comm import dp_grad_sync, exposed_dp_s, param_gather
from primus_ext.compute.optimizer import optimizer_step_s
from primus_ext.compute.rank_params import stage_param_counts
from primus_ext.spec import RunSpec


@dataclass(frozen=True, slots=True)
class DpSync:
    exposed_s: tuple[float, ...]  # per stage
    optimizer_s: tuple[float, ...]
    notes: tuple[str, ...]


def dp_sync(spec: RunSpec, st) -> DpSync:
    par = spec.parallel
    exposed, opt = [], []
    for s in range(par.pp):
        counts = stage_param_counts(spec, s)
        fwd_window = sum(st.fwd_s[s])
        bwd_window = sum(st.bwd_input_s[s]) + sum(st.bwd_weight_s[s])
        exposed.append(exposed_dp_s(spec, dp_grad_sync(spec, counts), bwd_window)
                       + exposed_dp_s(spec, param_gather(spec, counts), fwd_window,
                                      gather=True))
        opt.append(optimizer_step_s(spec, counts))
    how = ("FSDP (per-layer traffic in the layer costs)" if par.fsdp else
           "distributed optimizer" if par.use_distributed_optimizer else "DDP all-reduce")
    notes = (f"data-parallel sync: {how}, overlap_grad_reduce={par.overlap_grad_reduce}, "
             f"overlap_param_gather={par.overlap_param_gather}",)
    return DpSync(exposed_s=tuple(exposed), optimizer_s=tuple(opt), notes=notes)
