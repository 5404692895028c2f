"""Data-parallel synchronisation and the optimizer step, per pipeline stage.

Message sizes come from the memory model (the grad buffer megatron-core allocates, the
parameters each rank holds), times from the comm model. Dense parameters sync over the
data-parallel group (``dp``, which spans cp too: megatron-core reduces gradients over
dp x cp), expert parameters over the expert-data-parallel group (``edp``).

Exposure (see ``estimate`` for the overlap rules):
- distributed optimizer: grad reduce-scatter + param all-gather;
- plain DDP: grad all-reduce;
- FSDP: per-layer param all-gather in forward and backward and grad reduce-scatter for
  every microbatch, prefetched under the stage's compute: what exceeds that compute is
  exposed, and at least one layer's gather always is.
"""
from __future__ import annotations

from dataclasses import dataclass

from primus_ext.spec import RunSpec


@dataclass(frozen=True, slots=True)
class DpSync:
    exposed_s: tuple[float, ...]  # per stage
    optimizer_s: tuple[float, ...]
    notes: tuple[str, ...]


def _expose(total_s: float, window_s: float, num_buckets: int, enabled: bool) -> float:
    if not enabled or total_s <= 0:
        return total_s
    return max(total_s - window_s, total_s / max(num_buckets, 1))


def dp_sync(spec: RunSpec, mem, st) -> DpSync:
    from primus_ext.comm.collectives import group_collective_s
    from primus_ext.compute.backend import optimizer_step_s

    par = spec.parallel
    m = spec.num_microbatches
    exposed, opt = [], []
    for s, stage in enumerate(mem.stages):
        dense_params = stage.num_params - stage.num_expert_params
        expert_params = stage.num_expert_params
        # Per microbatch, on this stage: the windows the overlap can hide behind.
        fwd_window = sum(st.fwd_s[s])
        bwd_window = sum(st.bwd_input_s[s]) + sum(st.bwd_weight_s[s])
        num_layers = max(spec.layout.stage_num_layers(s), 1)
        grad_bytes_per_param = stage.grad_bytes / max(stage.num_params, 1)
        dense_grad = dense_params * grad_bytes_per_param
        expert_grad = expert_params * grad_bytes_per_param
        param_b = spec.train.param_bytes
        if par.fsdp:
            ag = (group_collective_s(spec, "dp", "all_gather", dense_params * param_b)
                  + group_collective_s(spec, "edp", "all_gather", expert_params * param_b))
            rs = (group_collective_s(spec, "dp", "reduce_scatter", dense_grad)
                  + group_collective_s(spec, "edp", "reduce_scatter", expert_grad))
            total = m * (2 * ag + rs)
            window = m * (fwd_window + bwd_window)
            exposed.append(max(total - window, 2 * ag / num_layers))
        elif par.use_distributed_optimizer:
            rs = (group_collective_s(spec, "dp", "reduce_scatter", dense_grad)
                  + group_collective_s(spec, "edp", "reduce_scatter", expert_grad))
            ag = (group_collective_s(spec, "dp", "all_gather", dense_params * param_b)
                  + group_collective_s(spec, "edp", "all_gather", expert_params * param_b))
            exposed.append(_expose(rs, bwd_window, num_layers, par.overlap_grad_reduce)
                           + _expose(ag, fwd_window, num_layers, par.overlap_param_gather))
        else:
            ar = (group_collective_s(spec, "dp", "all_reduce", dense_grad)
                  + group_collective_s(spec, "edp", "all_reduce", expert_grad))
            exposed.append(_expose(ar, bwd_window, num_layers, par.overlap_grad_reduce))
        opt.append(optimizer_step_s(spec, stage.optimizer_num_params))
    notes = ("data-parallel sync: " + ("FSDP" if par.fsdp else "distributed optimizer"
             if par.use_distributed_optimizer else "DDP all-reduce")
             + f", overlap_grad_reduce={par.overlap_grad_reduce}, "
             f"overlap_param_gather={par.overlap_param_gather}",)
    return DpSync(exposed_s=tuple(exposed), optimizer_s=tuple(opt), notes=notes)
