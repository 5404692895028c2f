"""Step composition: layer costs -> pipeline schedule -> data-parallel sync -> Estimate.

step = pipeline makespan (event simulation over per-stage costs, p2p included)
     + exposed data-parallel gradient sync and parameter all-gather
     + optimizer step,
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

import dataclasses

from primus_ext.compute.model_flops import FORMULA_NAME, model_flops_per_token
from primus_ext.project.calibration import Calibration, load_calibration
from primus_ext.compute.costs import LayerCosts
from primus_ext.project.dp_sync import dp_sync
from primus_ext.project.estimate_types import Estimate
from primus_ext.project.schedule import ScheduleInput, ScheduleResult, simulate
from primus_ext.project.stages import stage_times
from primus_ext.spec import RunSpec


def _schedule_input(spec: RunSpec, st, p2p_s: float) -> ScheduleInput:
    p = spec.parallel
    sched = p.resolved_schedule
    m = spec.num_microbatches
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


_SHORT: dict = {}


def _short_step(inp: ScheduleInput) -> float:
    """Step time of a short schedule, memoised on the whole input (a batch-size sweep
    with the same per-microbatch costs reuses the same short schedules)."""
    hit = _SHORT.get(inp)
    if hit is None:
        if len(_SHORT) > 8192:
            _SHORT.clear()
        hit = _SHORT[inp] = simulate(inp).step_s
    return hit


def _simulate_step(inp: ScheduleInput, record_events: bool) -> ScheduleResult:
    """The schedule simulation, shortened for long steps.

    A pipeline schedule is a max-plus linear system in the microbatch count: after a
    transient of a few microbatch groups, every further group of ``unit`` microbatches
    (pp for interleaved, one for 1F1B / ZB-H1) adds the same time. With many
    microbatches the step is therefore simulated at two short lengths m1 < m2 (several
    groups past the transient, the second two periods later, checked periodic at the
    midpoint) and extended linearly: ``step(m) = step(m1) + (m - m1) / (m3 - m1) *
    (step(m3) - step(m1))``. The exact simulation runs when the events are wanted, when
    the step is short anyway, when the microbatches do not fall into whole groups or
    when the midpoint shows no period yet. On every published run the extension equals
    the full simulation to 1e-14; on random heterogeneous pipelines with p2p latencies a
    slower circuit can overtake after the check (a long max-plus transient): the error
    stays within a few percent (tests/project/test_properties.py bounds it)."""
    p, v, m = inp.num_stages, inp.num_chunks, inp.num_microbatches
    interleaved = inp.schedule == "interleaved"
    unit = inp.group_size if interleaved else 1
    # The periodic regime may repeat every 2 or more units (heterogeneous stages with
    # p2p latencies: 1F1B alternates), so the two lengths differ by a multiple of such
    # periods and m1 is aligned with m on it.
    period = 2 * unit if interleaved else 12
    m1 = unit * max(4, -(-3 * p // unit))
    m1 += (m - m1) % period
    m3 = m1 + 2 * period
    if record_events or m <= m3 or m % unit or (interleaved and inp.microbatch_group_size):
        return simulate(inp, record_events=record_events)
    s1, s2, s3 = (_short_step(dataclasses.replace(inp, num_microbatches=k))
                  for k in (m1, m1 + period, m3))
    if abs((s3 - s2) - (s2 - s1)) > 1e-9 * s3:  # not periodic yet: time it all
        return simulate(inp)
    step = s1 + (m - m1) * (s3 - s1) / (m3 - m1)
    busy = tuple(m * (sum(inp.fwd_s[s]) + sum(inp.bwd_input_s[s]) + sum(inp.bwd_weight_s[s]))
                 for s in range(p))
    step = max(step, max(busy))
    ideal = max(busy)
    per_op = 3 if inp.schedule == "zb" else 2
    return ScheduleResult(
        schedule=inp.schedule, num_stages=p, num_chunks=v, num_microbatches=m,
        step_s=step, busy_s=busy, bubble_s=tuple(max(step - b, 0.0) for b in busy),
        ideal_s=ideal, bubble_fraction=(step - ideal) / ideal if ideal > 0 else 0.0,
        num_ops=per_op * v * p * m, events=None)


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
            record_timeline: bool = False, memory_options=None) -> Estimate:
    """Project one training step of ``spec``.

    ``costs`` defaults to the simulate backend; a measured profile supplies its own.
    ``calibration`` ("default", None, a path or a Calibration) sets the hardware's fitted
    physical constants.
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
    sched = _simulate_step(_schedule_input(spec, st, p2p_time_s(spec)), record_timeline)
    mem = _memory(framework_spec, memory_options, memory_report)
    sync = dp_sync(spec, st)

    m = spec.num_microbatches
    totals = [sched.step_s + sync.exposed_s[s] + sync.optimizer_s[s]
              for s in range(spec.parallel.pp)]
    # The critical stage: the latest to finish; among stages that finish together (the
    # pipeline ties them) the one with the most work of its own, so that the breakdown
    # shows the stage that sets the pace rather than one that waits for it.
    top = max(totals)
    crit = max((s for s in range(len(totals)) if totals[s] >= top * (1 - 1e-6)),
               key=lambda s: sched.busy_s[s] + sync.exposed_s[s] + sync.optimizer_s[s])
    step_s = totals[crit]
    comm = st.comm_s[crit]
    breakdown = {
        "compute_s": m * st.compute_s[crit],
        "recompute_s": m * st.recompute_s[crit],
        "tp_comm_s": m * (comm.get("tp", 0.0) + comm.get("etp", 0.0)),
        "cp_comm_s": m * comm.get("cp", 0.0),
        "ep_comm_s": m * comm.get("ep", 0.0),
        "dp_comm_s": sync.exposed_s[crit] + m * (comm.get("dp", 0.0) + comm.get("edp", 0.0)),
        "optimizer_s": sync.optimizer_s[crit],
    }
    # The pipeline's idle time and p2p waits on the critical stage close the sum.
    breakdown["pp_bubble_s"] = max(step_s - sum(breakdown.values()), 0.0)

    world = spec.world_size
    tokens = spec.tokens_per_step
    flops = model_flops_per_token(spec.model, spec.train.seq_length) * tokens
    peak = spec.cluster.hardware.peak_tflops(spec.train.precision)
    tflops = flops / step_s / world / 1e12
    notes = (f"layout: {spec.layout.describe()}",) + tuple(costs.notes) + sync.notes
    if framework_spec.framework == "torchtitan":
        from primus_ext.project.torchtitan import view_notes
        notes = view_notes(framework_spec) + notes
    return Estimate(
        step_time_s=step_s, tokens_per_s_per_gpu=tokens / step_s / world,
        tflops_per_gpu=tflops, mfu=tflops / peak, flop_formula=FORMULA_NAME,
        peak_tflops=peak, breakdown=breakdown, critical_stage=crit,
        stage_busy_s=tuple(totals), num_microbatches=m, schedule=sched.schedule,
        layout=spec.layout.describe(), backend=costs.source, memory=mem, notes=notes,
        timeline=sched if record_timeline else None)
