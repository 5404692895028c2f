"""A measured Profile -> LayerCosts of a target run (the hybrid backend), and the Estimate.

When the profile was measured on the target's hardware, each layer kind's time is the
measured one, restored to the target by recorded rules:

- ``measured``: the measured run had the target's per-rank shapes (the downscaler keeps
  them): the time is used as is, minus the measured time of the collectives inside it;
- ``rescaled``: where per-rank shapes differ (an SP token count, heads, FFN, experts,
  sequence...), each measured part (attention, MLP/MoE block, the rest: norms and
  residuals) is scaled by the ratio of the simulate backend's times for the target and
  for the measured shapes on the measuring hardware (so kernel efficiencies cancel);
- ``moe_imbalance``: the target's EP ranks wait for the busiest one; its extra expert
  load comes from the routing the measured run recorded (``project/moe_balance.py``);
- ``contention``: on a CPU node measured by one process, the slowdown measured with the
  other cores busy applies when the target keeps several ranks of a node busy;
- ``overhead``: the measured per-microbatch time outside the timed modules (schedule,
  data, gradient accumulation hooks; not the gradient sync) is split between the first
  and last stages;
- ``pipeline_insitu``: a pipeline target's layer times from the 1F1B probe, if one ran,
  and the schedule's time beyond them on every p2p (``project/pipeline_insitu.py``);
- collectives: the comm model's list for the target (what megatron-core issues there,
  with its overlap windows), each costed with the profile's microbenchmark fit when its
  group lies in the measured tier (same hardware, inside one scale-up domain, a fit for
  that collective and group size), otherwise with the comm model;
- the hardware's comm constants and HBM rate are fitted to the microbenchmarks and the
  measured optimizer step, so the projector's data-parallel sync, pipeline p2p and
  optimizer step use the measured machine too (``calibrated_spec``).

When the hardware differs (a CPU measuring for an H100 target), the measured times cannot
stand in: compute is the simulate backend's model of the target hardware and collectives
the comm model's, while the profile supplies what it captured (collective bytes per
layer, activation bytes, executed FLOPs) as checks; ``LayerCosts.notes`` say which parts
were measured and which simulated.
"""
from __future__ import annotations

import dataclasses

from primus_ext.project.simulate_backend import simulate_layer_costs
from primus_ext.compute.layer_ops import attention_ops, mlp_block_ops
from primus_ext.compute.ops import Shapes
from primus_ext.project.profile import Profile, rank_shapes
from primus_ext.project.profile_comm import _recost
from primus_ext.presets import hardware_preset
from primus_ext.compute.costs import LayerCost, LayerCosts
from primus_ext.project.moe_balance import busiest_rank_factor
from primus_ext.project.torchtitan import simulated_view
from primus_ext.project.profile_hardware import calibrated_spec, fitted_hardware, \
    measured_spec, same_hardware  # noqa: F401 - fitted_hardware: re-exported
from primus_ext.spec import RunSpec

ATTN_OPS = ("qkv", "q_proj", "q_down", "q_up", "kv_down", "kv_up", "qk_layernorm", "rope",
            "core_attn", "proj", "q_layernorm", "kv_layernorm")
OTHER_OPS = ("input_layernorm", "pre_mlp_layernorm", "attn_bda", "mlp_bda")
# Shape keys that do not change kernel times of the same hardware.
_NEUTRAL = ("activation", "normalization")
# The routed experts' ops: their rows follow the routing (moe_imbalance).
EXPERT_OPS = ("experts_fc1", "experts_act", "experts_fc2", "sort_chunks", "unsort_chunks")


# ---- simulate-backend part times (for rescaling ratios) ---------------------------------
def _parts(spec: RunSpec, moe: bool, window: int | None) -> dict[str, dict[str, float]]:
    sh = Shapes(spec)
    out = {p: {"fwd": 0.0, "bwd": 0.0}
           for p in ("attn", "mlp", "other", "core_attn", "experts")}
    for op in attention_ops(sh, window) + mlp_block_ops(sh, moe):
        part = "other" if op.name in OTHER_OPS else "attn" if (
            op.name in ATTN_OPS or op.module in ("core_attn", "qkv", "proj")) else "mlp"
        out[part]["fwd"] += op.fwd_s
        out[part]["bwd"] += op.dgrad_s + op.wgrad_s
        if op.module == "core_attn":
            out["core_attn"]["fwd"] += op.fwd_s
            out["core_attn"]["bwd"] += op.dgrad_s + op.wgrad_s
        if op.name in EXPERT_OPS:  # inside "mlp": the routed experts' share of it
            out["experts"]["fwd"] += op.fwd_s
            out["experts"]["bwd"] += op.dgrad_s + op.wgrad_s
    return out


def _ratio(a: float, b: float) -> float:
    return a / b if a > 0 and b > 0 else 1.0


def _on(spec: RunSpec, hw_name: str) -> RunSpec:
    if spec.cluster.hardware.name == hw_name:
        return spec
    return dataclasses.replace(spec, cluster=dataclasses.replace(
        spec.cluster, hardware=hardware_preset(hw_name)))


# ---- the measured path ---------------------------------------------------------------------
def _base(kind: str) -> str:
    return kind.split("_")[0]


def _busy_ranks_per_node(spec: RunSpec) -> int:
    return min(spec.cluster.node_size, spec.world_size)


def _measured_comm(kt, part: str | None = None) -> dict[str, float]:
    """Collective seconds inside a measured kind (all axes; group-size-1 calls too)."""
    out = {"fwd": 0.0, "bwd": 0.0}
    for axis, phases in (kt.comm_s or {}).items():
        for ph in ("fwd", "bwd"):
            out[ph] += phases.get(ph, 0.0)
    return out


def _per_microbatch_overhead(profile: Profile) -> float:
    step = profile.step
    if "outside_layers_s" in step:  # the flattened run's (pipeline_insitu.py)
        return max(float(step["outside_layers_s"]), 0.0)
    m = max(int(step.get("num_microbatches", 1)), 1)
    timed = sum(k.num_layers * (k.fwd_s + k.bwd_s) for k in profile.layers.values())
    # Less the gradient sync inside fwd_bwd_s (finalize_model_grads; costed apart).
    per = (step.get("fwd_bwd_s", 0.0) - step.get("finalize_s", 0.0)) / m - timed
    return max(per, 0.0)


def _measured_kind(profile: Profile, target: RunSpec, meas: RunSpec, name: str,
                   sim: LayerCost, rules: list[str]) -> LayerCost | None:
    base = _base(name)
    kt = profile.layers.get(base)
    if kt is None:
        return None
    window = target.model.window_size if "_window" in name else None
    meas_comm = _measured_comm(kt)
    fwd_c = max(kt.fwd_s - meas_comm["fwd"], 0.0)
    bwd_c = max(kt.bwd_s - meas_comm["bwd"], 0.0)
    core_f = kt.parts.get("core_attn", {}).get("fwd", 0.0)
    same = _same_shapes(profile, target) and window is None
    if base in ("dense", "moe") and not same:
        hw = profile.hardware
        pt = _parts(_on(target, hw), base == "moe", window)
        pm = _parts(_as_measured(_on(meas, hw), profile), base == "moe", None)
        a, mlp = kt.parts.get("attn", {}), kt.parts.get("mlp", {})
        core = kt.parts.get("core_attn", {})
        new = {}
        for ph, total in (("fwd", fwd_c), ("bwd", bwd_c)):
            ma, mm = a.get(ph, 0.0), mlp.get(ph, 0.0)
            mo = max(total - ma - mm, 0.0)
            # Core attention (quadratic in the sequence) on its own ratio, the rest of
            # the attention block (its GEMMs, linear in the tokens) on theirs.
            mc = min(core.get(ph, 0.0), ma)
            rest_t = pt["attn"][ph] - pt["core_attn"][ph]
            rest_m = pm["attn"][ph] - pm["core_attn"][ph]
            new[ph] = ((ma - mc) * _ratio(rest_t, rest_m)
                       + mc * _ratio(pt["core_attn"][ph], pm["core_attn"][ph])
                       + mm * _ratio(pt["mlp"][ph], pm["mlp"][ph])
                       + mo * _ratio(pt["other"][ph], pm["other"][ph]))
        fwd_c, bwd_c = new["fwd"], new["bwd"]
        core_f *= _ratio(pt["core_attn"]["fwd"], pm["core_attn"]["fwd"])
        rules.append(f"{name}: rescaled by part (core attention, the rest of attention, "
                     "MLP, norms/residuals) with the "
                     f"simulate backend's target/measured ratios on {hw}")
    elif base in ("embedding", "output") and not same:
        simm = simulate_layer_costs(_as_measured(_on(meas, profile.hardware),
                                                 profile)).kinds.get(base)
        simt = simulate_layer_costs(_on(target, profile.hardware)).kinds.get(base)
        if simm and simt:
            fwd_c *= _ratio(simt.fwd_s, simm.fwd_s)
            bwd_c *= _ratio(simt.bwd_input_s + simt.bwd_weight_s,
                            simm.bwd_input_s + simm.bwd_weight_s)
    if base == "moe":
        fwd_c, bwd_c = _with_imbalance(profile, target, meas, kt, fwd_c, bwd_c, rules)
    factor = kt.contention if _busy_ranks_per_node(target) > 1 and \
        profile.device.get("count", 1) < _busy_ranks_per_node(target) else 1.0
    if base in ("embedding", "output"):
        over = 0.5 * _per_microbatch_overhead(profile)
        fwd_c += over
    fwd_c, bwd_c, core_f = fwd_c * factor, bwd_c * factor, core_f * factor
    # Backward split into input and weight grads as the simulate backend splits it.
    sd, sw = sim.bwd_input_s, sim.bwd_weight_s
    w_frac = sw / (sd + sw) if sd + sw > 0 else 0.5
    if name.endswith("_recompute"):
        rec = fwd_c
    elif target.train.recompute_granularity == "selective" and base in ("dense", "moe"):
        rec = core_f if tuple(target.train.recompute_modules) == ("core_attn",) else \
            sim.recompute_s * _ratio(fwd_c, sim.fwd_s)
    else:
        rec = 0.0
    comms, _ = _recost(profile, target, sim.comms, base)
    return dataclasses.replace(sim, fwd_s=fwd_c, bwd_input_s=bwd_c * (1 - w_frac),
                               bwd_weight_s=bwd_c * w_frac, recompute_s=rec, comms=comms)


def _with_imbalance(profile: Profile, target: RunSpec, meas: RunSpec, kt, fwd_c: float,
                    bwd_c: float, rules: list[str]) -> tuple[float, float]:
    """Rule ``moe_imbalance``: the target's busiest EP rank computes more than the mean
    expert load (project/moe_balance.py, from the measured routing); the measured run's
    own factor (1 in one process: it computes every expert) is divided out. Applied to
    the experts' share of the measured MoE block."""
    if not kt.expert_loads:
        return fwd_c, bwd_c
    ep_t, ep_m = target.parallel.ep, meas.parallel.ep
    f_t = busiest_rank_factor(kt.expert_loads, target.model.num_moe_experts // ep_t, ep_t)
    f_m = busiest_rank_factor(kt.expert_loads, meas.model.num_moe_experts // ep_m, ep_m)
    ratio = f_t / f_m
    if abs(ratio - 1.0) < 1e-9:
        return fwd_c, bwd_c
    parts = _parts(_as_measured(_on(meas, profile.hardware), profile), True, None)
    share = {ph: parts["experts"][ph] / parts["mlp"][ph] if parts["mlp"][ph] else 0.0
             for ph in ("fwd", "bwd")}
    mlp = kt.parts.get("mlp", {})
    rules.append(f"moe_imbalance: the busiest of {ep_t} EP ranks carries {f_t:.3f} x the "
                 f"mean expert load (measured routing, {len(kt.expert_loads)} router "
                 f"calls; measured run {f_m:.3f}); the experts' time scaled by {ratio:.3f}")
    return (fwd_c + mlp.get("fwd", 0.0) * share["fwd"] * (ratio - 1.0),
            bwd_c + mlp.get("bwd", 0.0) * share["bwd"] * (ratio - 1.0))


def _as_measured(spec: RunSpec, profile: Profile) -> RunSpec:
    """``spec`` in the precision the profile really ran (FP8 targets are measured in
    BF16)."""
    prec = profile.measured_shapes.get("precision", spec.train.precision)
    if prec == spec.train.precision:
        return spec
    return dataclasses.replace(spec, train=dataclasses.replace(spec.train, precision=prec))


def _same_shapes(profile: Profile, target: RunSpec) -> bool:
    t = rank_shapes(target)
    m = profile.measured_shapes
    keys = (set(t) | set(m)) - set(_NEUTRAL) - {"attention_backend"}
    return all(t.get(k) == m.get(k) for k in keys)


def layer_costs_from_profile(profile: Profile, target_spec: RunSpec) -> LayerCosts:
    """LayerCosts of ``target_spec`` from ``profile`` (see the module docstring)."""
    sim = simulate_layer_costs(target_spec)
    if not same_hardware(profile, target_spec):
        notes = (f"hybrid: measured on {profile.device.get('name')} "
                 f"({profile.hardware or '?'}), target {target_spec.cluster.hardware.name}: "
                 "layer times cannot stand in for the target's",
                 "measured: the downscaled megatron-core run (ops and executed FLOPs, "
                 "collectives with bytes per layer, activation bytes per layer)",
                 f"simulated: compute times ({target_spec.cluster.hardware.name} model of "
                 "the simulate backend), collective times (comm model), pipeline "
                 "schedule, data-parallel sync, optimizer")
        return LayerCosts(kinds=dict(sim.kinds), decoder_kinds=sim.decoder_kinds,
                          source=f"profile:{profile.created}:simulated-times", notes=notes)
    meas = measured_spec(profile, target_spec)
    if meas.framework == "torchtitan":  # a torchtitan target given unviewed
        meas = simulated_view(meas)
    rules: list[str] = []
    kinds: dict[str, LayerCost] = {}
    measured, simulated = [], []
    fitted = in_situ = 0
    for name, lc in sim.kinds.items():
        got = _measured_kind(profile, target_spec, meas, name, lc, rules)
        if got is None:
            got = _scaled_sim(profile, target_spec, meas, lc)
            simulated.append(name)
        else:
            measured.append(name)
        fitted += sum(1 for a, b in zip(got.comms, lc.comms) if a.seconds != b.seconds)
        in_situ += _recost(profile, target_spec, lc.comms, _base(name))[1]
        kinds[name] = got
    notes = [f"hybrid: measured on {profile.device.get('name')} ({profile.hardware}), "
             f"profile {profile.created}",
             f"measured layer times: {', '.join(measured) or 'none'}",
             "simulated: pipeline schedule, data-parallel sync, optimizer step (hardware "
             "constants fitted to the profile)" + (
                 f"; kinds from the simulate backend scaled by the measured/simulated "
                 f"ratio: {', '.join(simulated)}" if simulated else ""),
             f"collectives: {fitted} in-layer ops costed on the measured machine "
             f"({in_situ} with their in-situ times from the measured run, the others with "
             "microbenchmark fits), the rest with the comm model"]
    notes += sorted(set(rules))
    return LayerCosts(kinds=kinds, decoder_kinds=sim.decoder_kinds,
                      source=f"profile:{profile.created}", notes=tuple(notes))


def _scaled_sim(profile: Profile, target: RunSpec, meas: RunSpec, lc: LayerCost
                ) -> LayerCost:
    """A kind the profile lacks (MTP; MoE from a dense profile): the simulate backend's
    time times the measured/simulated ratio of the kinds that were measured."""
    simm = simulate_layer_costs(_on(meas, profile.hardware))
    num = den = 0.0
    for kind, kt in profile.layers.items():
        s = simm.kinds.get(kind)
        if s is not None:
            num += kt.fwd_s + kt.bwd_s
            den += s.fwd_s + s.bwd_input_s + s.bwd_weight_s + s.fwd_comm_s + s.bwd_comm_s
    r = _ratio(num, den)
    comms, _ = _recost(profile, target, lc.comms)
    return dataclasses.replace(lc, fwd_s=lc.fwd_s * r, bwd_input_s=lc.bwd_input_s * r,
                               bwd_weight_s=lc.bwd_weight_s * r,
                               recompute_s=lc.recompute_s * r, comms=comms)


def project_from_profile(profile: Profile | str, target_spec: RunSpec, *,
                         calibration="default", **kwargs):
    """Estimate of ``target_spec`` with the profile's layer costs.

    Same hardware: the hardware's constants are fitted to the profile (``calibration`` is
    not applied: the profile is the calibration). Other hardware: ``calibration`` applies
    to the simulate backend's model of the target, as in ``backend=simulate``.
    """
    from primus_ext.project.calibration import Calibration, load_calibration
    from primus_ext.project.estimate import project
    if not isinstance(profile, Profile):
        profile = Profile.load(profile)
    if same_hardware(profile, target_spec):
        spec = calibrated_spec(profile, target_spec)
    else:
        calib = calibration if isinstance(calibration, Calibration) else \
            load_calibration(calibration)
        spec = calib.apply(target_spec)
    # A torchtitan target's layers are costed on its megatron-equivalent layout, as the
    # estimate composes its step (project/torchtitan.py: FSDP2's per-block collectives).
    view = simulated_view(spec)
    if same_hardware(profile, target_spec) and view.parallel.pp > 1:
        from primus_ext.project.pipeline_insitu import pipeline_costs
        costs, extra = pipeline_costs(profile, view)
        return project(spec, costs=costs, calibration=None, p2p_extra_s=extra, **kwargs)
    costs = layer_costs_from_profile(profile, view)
    return project(spec, costs=costs, calibration=None, **kwargs)


# The name mode=project calls.
estimate_from_profile = project_from_profile
