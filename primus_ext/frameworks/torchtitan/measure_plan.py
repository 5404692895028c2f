"""The torchtitan measurement's plan (``measure/plan.py``) on this CPU, sized on what the
run builds (``proxy.proxy_spec``) and agreed over the local ranks."""
from __future__ import annotations

import os

from primus_ext.frameworks.torchtitan.proxy import proxy_spec
from primus_ext.measure.budget import local_budget, local_processes
from primus_ext.measure.host_rate import measured_rates
from primus_ext.measure.plan import Candidate, MeasurePlan, plan_measurement
from primus_ext.spec import RunSpec


def plan_for(target: RunSpec, down_of, world: int, opts) -> MeasurePlan:
    """measure/plan.py's plan for the measured run on this CPU. torchtitan always builds
    its optimizer, so that step of the ladder is left out; a capture (one step: the
    target's hardware is not this CPU) allocates AdamW's moments only at the step's end,
    after the backward's transient buffers are gone, and uses no optimizer time: its
    peak is planned without them, as megatron-core's capture builds no optimizer."""
    contention = opts.contention and not opts.capture_only
    neighbours = max((os.cpu_count() or 1) - world, 0) if contention else 0
    budget = local_budget(opts.memory_gib, opts.max_seconds, cuda=False,
                          num_local_processes=local_processes(world) + neighbours)
    req = Candidate(layers_per_kind=opts.layers_per_kind,
                    num_microbatches=opts.num_microbatches, optimizer=not opts.capture_only)
    return plan_measurement(
        target, lambda c: proxy_spec(down_of(c).spec), req, hardware="cpu", use_te=False,
        num_processes=budget.num_processes, budget_bytes=budget.memory_bytes,
        seconds_budget=budget.seconds, base_bytes=budget.base_bytes, warmup=opts.warmup,
        repeats=opts.repeats, capture=opts.capture_only, contention=contention,
        cuda=False, optimizer_optional=False,
        host_rates=measured_rates(target.train.precision))


def agreed_plan(make, world: int) -> tuple[MeasurePlan, bool]:
    """(the plan, whether this call created the process group): made on rank 0 and
    broadcast, so that every rank builds the same run (the budget reads this machine's
    free memory). With several processes the group stays up for the trainer's build
    (``build.build_trainer`` then skips torchtitan's own init)."""
    if world == 1:
        return make(), False
    import torch.distributed as dist
    own = not dist.is_initialized()
    if own:
        dist.init_process_group("gloo")
    box = [make() if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0], own
