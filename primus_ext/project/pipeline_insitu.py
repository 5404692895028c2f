"""Rule ``pipeline_insitu``: what a real pipeline schedule costs beyond its layers (pure).

A measurement flattens the pipeline to one stage (measure/downscale.py, rule ``pp``) and
the projector restores the schedule from the measured layer times plus a modelled p2p
per boundary crossing. What the real schedule adds is not in those layer times: the
stages hand microbatches to each other (a waiting rank must be woken: on a shared host
that can cost milliseconds), megatron-core's schedule does host work per microbatch
(``forward_backward_pipelining_without_interleaving``: p2p set-up, the batched
isend/irecv and its wait, output deallocation), and two stages compute side by side.

When the launched processes hold two stages, the measurement also runs a two-stage
pipeline, each stage holding the measured layers, in megatron-core's own 1F1B schedule,
and times it (``profile.step["pipeline_probe"]``, frameworks/megatron/probes.py): the
step, and every layer by hooks. For a pipeline target the projector then

- takes each layer kind's time from the probe (the layers as they run inside the
  schedule, the other stage computing beside them), the per-microbatch time outside the
  layers from the flattened run (the rule ``overhead`` of from_profile.py);
- projects the probe itself from those times with its own schedule; what the real
  schedule took beyond that, spread over the probe's boundary crossings (each
  microbatch crosses once forward and once backward), is added to every pipeline p2p of
  the target. A probe faster than its projection adds nothing (a hand-off cannot
  shorten the compute around it).
"""
from __future__ import annotations

import dataclasses

from primus_ext.spec import RunSpec


def _probe_spec(probe: dict, target: RunSpec) -> RunSpec | None:
    from primus_ext.presets.overrides import spec_from_overrides
    try:
        spec = spec_from_overrides(list(probe["overrides"]))
    except (KeyError, TypeError, ValueError):
        return None
    # The probe ran on the measuring machine: cost it with the target's (same, fitted)
    # hardware constants.
    hw = target.cluster.hardware
    return dataclasses.replace(spec, cluster=dataclasses.replace(
        spec.cluster, hardware=dataclasses.replace(hw, gpus_per_node=max(
            hw.gpus_per_node, spec.cluster.gpus_per_node))))


def probe_projection_s(profile, probe_spec: RunSpec) -> float:
    """The projector's fwd/bwd schedule time of the probe from the profile's layers."""
    from primus_ext.comm.step_comm import p2p_time_s
    from primus_ext.project.estimate import _schedule_input
    from primus_ext.project.from_profile import layer_costs_from_profile
    from primus_ext.project.host_step import p2p_host_s
    from primus_ext.project.schedule_fast import simulate_fast
    from primus_ext.project.stages import stage_times
    costs = layer_costs_from_profile(profile, probe_spec)
    st = stage_times(probe_spec, costs)
    return simulate_fast(_schedule_input(probe_spec, st, p2p_time_s(probe_spec)
                                         + p2p_host_s(probe_spec))).step_s


def insitu_profile(profile):
    """``profile`` with its layer times taken from the pipeline probe (kinds the probe
    timed; parts scaled with them) and the flattened run's per-microbatch time outside
    the layers kept (``step["outside_layers_s"]``); the profile itself without a probe."""
    from primus_ext.project.from_profile import _per_microbatch_overhead
    probe = (profile.step or {}).get("pipeline_probe") or {}
    got = probe.get("layers") or {}
    if not got:
        return profile
    layers = {}
    for kind, kt in profile.layers.items():
        t = got.get(kind, {})
        f, b = t.get("fwd"), t.get("bwd")
        if not f or not b or kt.fwd_s <= 0 or kt.bwd_s <= 0:
            layers[kind] = kt
            continue
        ratio = {"fwd": f / kt.fwd_s, "bwd": b / kt.bwd_s}
        parts = {part: {ph: v * ratio.get(ph, 1.0) for ph, v in d.items()}
                 for part, d in kt.parts.items()}
        layers[kind] = dataclasses.replace(kt, fwd_s=f, bwd_s=b, parts=parts)
    step = {**profile.step, "outside_layers_s": _per_microbatch_overhead(profile)}
    return dataclasses.replace(profile, layers=layers, step=step)


def pipeline_insitu_s(profile, target: RunSpec) -> tuple[float, str | None]:
    """(seconds added to each pipeline p2p of ``target``, the rule's note or None), for
    ``profile`` as ``insitu_profile`` gives it. ``target`` carries the hardware constants
    fitted to the profile."""
    probe = (profile.step or {}).get("pipeline_probe")
    if target.parallel.pp == 1 or not probe or not probe.get("fwd_bwd_s"):
        return 0.0, None
    spec = _probe_spec(probe, target)
    if spec is None or spec.parallel.pp < 2:
        return 0.0, None
    m = int(probe.get("num_microbatches", spec.num_microbatches))
    pred = probe_projection_s(profile, spec)
    real = float(probe["fwd_bwd_s"])
    crossings = 2 * m * (spec.parallel.pp - 1)
    extra = max(real - pred, 0.0) / crossings
    timed = "layer times from the probe; " if probe.get("layers") else ""
    return extra, (f"pipeline_insitu: {timed}a {spec.parallel.pp}-stage 1F1B probe of the "
                   f"measured layers ({m} microbatches) took {real * 1e3:.1f} ms in "
                   f"megatron-core's schedule against {pred * 1e3:.1f} ms projected from "
                   f"its layers; {extra * 1e3:.2f} ms per boundary crossing added to "
                   "every pipeline p2p")


def pipeline_costs(profile, target: RunSpec):
    """(LayerCosts of the pipeline ``target`` from the probe's layer times, with the
    rule's note; seconds added to each of its pipeline p2p)."""
    from primus_ext.project.from_profile import layer_costs_from_profile
    prof = insitu_profile(profile)
    extra, note = pipeline_insitu_s(prof, target)
    costs = layer_costs_from_profile(prof, target)
    if note:
        costs = dataclasses.replace(costs, notes=costs.notes + (note,))
    return costs, extra
