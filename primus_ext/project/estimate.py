"""Step composition: layer costs -> pipeline schedule -> data-parallel sync -> Estimate.

step = pipeline makespan (event simulation over per-stage costs, p2p included; each
       phase timed on two clocks, the host's and the device's: project/stages.py)
     + exposed data-parallel gradient sync and parameter all-gather
     + optimizer step (device and host side by side)
     + the host's per-iteration work (read-backs, the training loop: host_step.py)
     + the other ranks' host pauses an FSDP group waits for (host_pauses.py),
taken on the slowest pipeline stage. Overlap rules for the data-parallel part
(megatron-core DDP and distributed optimizer):

- ``overlap_grad_reduce``: buckets are reduced while the last microbatch's backward still
  runs (earlier microbatches accumulate locally under no_sync); the part of the sync that
  outlasts that backward is exposed, and at least the last bucket always is.
- ``overlap_param_gather``: the distributed optimizer's parameter all-gather runs under the
  first microbatch's forward of the next step, with the same rule.
- Without the switches the whole collective is exposed.
"""
from __future__ import annotations

from primus_ext.compute.model_flops import FORMULA_NAME, model_flops_per_token
from primus_ext.project.calibration import Calibration, load_calibration
from primus_ext.compute.costs import LayerCosts
from primus_ext.project.dp_sync import dp_sync
from primus_ext.project.host_pauses import host_pause_s, pause_group_size
from primus_ext.project.host_step import p2p_host_s, step_host
from primus_ext.project.bands import spec_features
from primus_ext.project.estimate_types import Estimate
from primus_ext.project.schedule import ScheduleInput
from primus_ext.project.schedule_fast import simulate_fast
from primus_ext.project.stages import stage_times
from primus_ext.spec import RunSpec

# Stages whose step ends within this fraction of the last one's are tied by the pipeline
# (estimate's critical stage).
TIED_STAGES = 1e-3


def schedule_runs(spec: RunSpec) -> int:
    """Pipeline schedules the step runs one after another (``train.
    microbatches_per_schedule``): each fills and drains the pipeline."""
    per_run = spec.train.microbatches_per_schedule
    return spec.num_microbatches // per_run if per_run else 1


def _schedule_input(spec: RunSpec, st, p2p_s: float) -> ScheduleInput:
    p = spec.parallel
    sched = p.resolved_schedule
    m = spec.num_microbatches // schedule_runs(spec)
    if p.pp == 1:
        sched = "1f1b"
    group = None
    if sched == "interleaved" and m % p.pp:
        group = m  # one microbatch group: megatron-core rejects a short last group
    return ScheduleInput(num_stages=p.pp, num_chunks=p.vpp if sched == "interleaved" else 1,
                         num_microbatches=m,
                         fwd_s=st.fwd_s if sched == "interleaved" else _fold(st.fwd_s),
                         bwd_input_s=st.bwd_input_s if sched == "interleaved"
                         else _fold(st.bwd_input_s),
                         bwd_weight_s=st.bwd_weight_s if sched == "interleaved"
                         else _fold(st.bwd_weight_s),
                         p2p_s=p2p_s, schedule=sched, microbatch_group_size=group)


_MEMORY: dict = {}


def _memory(spec: RunSpec, options, memory_report):
    """The memory report, memoised on what it depends on: everything but the hardware's
    efficiency constants (only its HBM capacity and node size matter), so that a
    calibration fit, which varies only those constants, builds each row's report once."""
    c = spec.cluster
    hw = c.hardware
    key = (spec.framework, spec.model, spec.parallel, spec.train, c.num_nodes,
           c.gpus_per_node, hw.name, hw.hbm_bytes, hw.gpus_per_node, options)
    hit = _MEMORY.get(key)
    if hit is None:
        if len(_MEMORY) > 4096:
            _MEMORY.clear()
        hit = _MEMORY[key] = memory_report(spec, options) if options else memory_report(spec)
    return hit


def _fold(grid):
    """Sum the chunks of each stage (a non-interleaved schedule runs them as one)."""
    return tuple((sum(row),) for row in grid)


def project(spec: RunSpec, *, costs: LayerCosts | None = None,
            calibration: Calibration | str | None = "default",
            record_timeline: bool = False, memory_options=None,
            p2p_extra_s: float = 0.0) -> Estimate:
    """Project one training step of ``spec``.

    ``costs`` defaults to the simulate backend; a measured profile supplies its own.
    ``calibration`` ("default", None, a path or a Calibration) sets the hardware's fitted
    physical constants. ``p2p_extra_s`` is added to every pipeline p2p (a measured
    profile's in-situ pipeline cost: project/pipeline_insitu.py).
    """
    from primus_ext.project.simulate_backend import p2p_time_s, simulate_layer_costs
    from primus_ext.memory.report import memory_report

    calib = calibration if isinstance(calibration, Calibration) else load_calibration(calibration)
    spec = calib.apply(spec)
    # A torchtitan run is costed as its megatron-equivalent layout (project/torchtitan.py);
    # its memory is torchtitan's own model.
    framework_spec = spec
    if spec.framework == "torchtitan":
        from primus_ext.project.torchtitan import simulated_view
        spec = simulated_view(spec)
    if costs is None:
        costs = simulate_layer_costs(spec)
    st = stage_times(spec, costs)
    sched = simulate_fast(_schedule_input(spec, st, p2p_time_s(spec) + p2p_host_s(spec)
                                          + p2p_extra_s),
                          record_events=record_timeline)
    mem = _memory(framework_spec, memory_options, memory_report)
    sync = dp_sync(spec, st, megatron_buckets=framework_spec.framework == "megatron")
    replicas = (0.0,) * spec.parallel.pp
    if framework_spec.framework == "torchtitan":
        from primus_ext.project.torchtitan import replica_all_reduce_s
        bwd = tuple(sum(a) + sum(b) for a, b in zip(st.bwd_input_s, st.bwd_weight_s))
        replicas = replica_all_reduce_s(framework_spec, bwd)[1]

    m = spec.num_microbatches
    host = [step_host(spec, s) for s in range(spec.parallel.pp)]
    # The optimizer's device and host time side by side; the rest of the loop's host
    # work (read-backs, logging reductions, the loop itself) with the device idle.
    optimizer = [max(sync.optimizer_s[s], host[s].optimizer_s)
                 for s in range(spec.parallel.pp)]
    # Schedules run back to back (schedule_runs); the timeline shows the first.
    runs = schedule_runs(spec)
    busy = [runs * b for b in sched.busy_s]
    totals = [runs * sched.step_s + sync.exposed_s[s] + optimizer[s] + replicas[s]
              + host[s].other_s for s in range(spec.parallel.pp)]
    # The critical stage: among the stages that finish together (the pipeline ties
    # them: within TIED_STAGES of the last; the first stage's embedding or the last's
    # loss keeps it a little longer after the others are done) the one with the most
    # work of its own, so that the breakdown shows the stage that sets the pace rather
    # than one that waits for it. The step ends with the last stage to finish.
    # Other ranks' host pauses, waited for at FSDP's per-layer collectives (host_pauses).
    pause = host_pause_s(spec, max(totals))
    totals = [t + pause for t in totals]
    step_s = max(totals)
    crit = max((s for s in range(len(totals)) if totals[s] >= step_s * (1 - TIED_STAGES)),
               key=lambda s: busy[s] + sync.exposed_s[s] + optimizer[s]
               + replicas[s])
    comm = st.comm_s[crit]
    breakdown = {
        "compute_s": m * st.compute_s[crit],
        "recompute_s": m * st.recompute_s[crit],
        "tp_comm_s": m * (comm.get("tp", 0.0) + comm.get("etp", 0.0)),
        "cp_comm_s": m * comm.get("cp", 0.0),
        "ep_comm_s": m * comm.get("ep", 0.0),
        "dp_comm_s": sync.exposed_s[crit] + replicas[crit]
        + m * (comm.get("dp", 0.0) + comm.get("edp", 0.0)),
        "optimizer_s": sync.optimizer_s[crit],
        # What the host clock adds: host-bound phases of the layers, the optimizer's
        # host time beyond its device time, the loop's own work.
        "host_s": m * (st.host_s[crit] if st.host_s else 0.0)
        + optimizer[crit] - sync.optimizer_s[crit] + host[crit].other_s,
        # Other ranks' pauses waited for (host_pauses.py): not this host's issue time.
        "host_pause_s": pause,
    }
    # The pipeline's idle time and p2p waits on the critical stage close the sum.
    breakdown["pp_bubble_s"] = max(step_s - sum(breakdown.values()), 0.0)

    world = spec.world_size
    tokens = spec.tokens_per_step
    flops = model_flops_per_token(spec.model, spec.train.seq_length) * tokens
    peak = spec.cluster.hardware.peak_tflops(spec.train.precision)
    tflops = flops / step_s / world / 1e12
    notes = (f"layout: {spec.layout.describe()}",) + tuple(costs.notes) + sync.notes
    if pause:
        notes += (f"host pauses: {pause_group_size(spec) - 1} other ranks of the FSDP "
                  f"group x hardware.host_pause_fraction="
                  f"{spec.cluster.hardware.host_pause_fraction:.3g} of the step "
                  f"(+{pause:.4g} s: host_pause_s)",)
    if framework_spec.framework == "torchtitan":
        from primus_ext.project.torchtitan import view_notes
        notes = view_notes(framework_spec) + notes
    return Estimate(
        step_time_s=step_s, tokens_per_s_per_gpu=tokens / step_s / world,
        tflops_per_gpu=tflops, mfu=tflops / peak, flop_formula=FORMULA_NAME,
        peak_tflops=peak, breakdown=breakdown, critical_stage=crit,
        stage_busy_s=tuple(totals), num_microbatches=m, schedule=sched.schedule,
        layout=spec.layout.describe(), backend=costs.source, memory=mem, notes=notes,
        timeline=sched if record_timeline else None, layer_clocks=layer_clocks(costs),
        band_features=spec_features(spec))


def layer_clocks(costs: LayerCosts) -> dict:
    """Per layer kind: device and host seconds of each phase and the host-bound share."""
    out = {}
    for name, lc in costs.kinds.items():
        dev_f, dev_b = lc.fwd_total_s, lc.bwd_total_s
        over = max(lc.fwd_host_s - dev_f, 0.0) + max(lc.bwd_host_s - dev_b, 0.0)
        total = max(lc.fwd_host_s, dev_f) + max(lc.bwd_host_s, dev_b)
        out[name] = {"device_fwd_s": dev_f, "host_fwd_s": lc.fwd_host_s,
                     "device_bwd_s": dev_b, "host_bwd_s": lc.bwd_host_s,
                     "host_bound_share": over / total if total > 0 else 0.0}
    return out
