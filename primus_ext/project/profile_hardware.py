"""The measuring machine's constants fitted to a profile (pure).

A profile measured on the target's hardware also calibrates it: the scale-up tier (the
comm model's alpha-beta terms) is fitted to the collective microbenchmarks and the HBM
rate to the measured optimizer step, so the projector's data-parallel sync, pipeline p2p
and optimizer step use the measured machine (``calibrated_spec``).
"""
from __future__ import annotations

import dataclasses

from primus_ext.presets.overrides import apply_overrides
from primus_ext.project.profile import Profile
from primus_ext.spec import RunSpec


def measured_spec(profile: Profile, base: RunSpec) -> RunSpec:
    """The run the profile measured: its (complete) target overrides plus the
    downscale overrides, applied on ``base``."""
    return apply_overrides(base, list(profile.target_overrides)
                           + list(profile.downscale_overrides))


def same_hardware(profile: Profile, spec: RunSpec) -> bool:
    return profile.hardware == spec.cluster.hardware.name


def _ring_factor(collective: str, n: int) -> float:
    """Bytes on the wire per byte of the full buffer (comm model, one domain)."""
    if collective == "all_reduce":
        return 2 * (n - 1) / n
    if collective in ("reduce_scatter", "all_gather", "all_to_all"):
        return (n - 1) / n
    return 1.0


def fitted_hardware(profile: Profile, hw):
    """``hw`` with its scale-up tier fitted to the microbenchmarks (pure alpha-beta: no
    size-dependent bandwidth, no per-hop latency) and its HBM rate to the measured
    optimizer step. Unchanged where the profile has no data."""
    from primus_ext.project.profile import fit_alpha_beta
    changes = {}
    pts = [(p[0] * _ring_factor(f.collective, f.group_size), p[1])
           for f in profile.comm_fits if f.collective in ("all_reduce", "reduce_scatter",
                                                          "all_gather")
           for p in f.points]
    if pts:
        alpha, gbps, _ = fit_alpha_beta(pts)
        changes.update(scale_up_latency_s=alpha, scale_up_gbps=gbps,
                       scale_up_efficiency=1.0, scale_up_half_bytes=0.0,
                       scale_up_hop_latency_s=0.0)
        a2a = [(p[0] * _ring_factor("all_to_all", f.group_size), p[1])
               for f in profile.comm_fits if f.collective == "all_to_all" for p in f.points]
        if a2a:
            _, g2, _ = fit_alpha_beta(a2a)
            changes.update(scale_up_a2a_efficiency=min(1.0, g2 / gbps), a2a_peer_latency_s=0.0)
    return dataclasses.replace(hw, **changes) if changes else hw


def _fit_hbm(spec: RunSpec, profile: Profile, meas: RunSpec) -> RunSpec:
    from primus_ext.project.optimizer import optimizer_step_s
    step = profile.step
    if step.get("optimizer") == "modelled":  # the plan built no optimizer: nothing to fit
        return spec
    target_s = step.get("optimizer_s", 0.0) + step.get("zero_grad_s", 0.0)
    n = step.get("num_params_per_rank", 0)
    n_e = step.get("num_expert_params_per_rank", 0)
    if target_s <= 0 or n <= 0:
        return spec
    lo, hi = 1e-3, 1e5
    for _ in range(80):  # optimizer_step_s falls as hbm_gbps rises
        mid = (lo * hi) ** 0.5
        hw = dataclasses.replace(meas.cluster.hardware, hbm_gbps=mid)
        s = dataclasses.replace(meas, cluster=dataclasses.replace(meas.cluster, hardware=hw))
        if optimizer_step_s(s, n - n_e, n_e) > target_s:
            lo = mid
        else:
            hi = mid
    hw = dataclasses.replace(spec.cluster.hardware, hbm_gbps=(lo * hi) ** 0.5)
    return dataclasses.replace(spec, cluster=dataclasses.replace(spec.cluster, hardware=hw))


def calibrated_spec(profile: Profile, target_spec: RunSpec) -> RunSpec:
    """The target with its hardware constants fitted to the profile (same hardware only)."""
    if not same_hardware(profile, target_spec):
        return target_spec
    hw = fitted_hardware(profile, target_spec.cluster.hardware)
    spec = dataclasses.replace(target_spec, cluster=dataclasses.replace(
        target_spec.cluster, hardware=hw))
    meas = measured_spec(profile, spec)
    meas = dataclasses.replace(meas, cluster=dataclasses.replace(meas.cluster, hardware=hw))
    return _fit_hbm(spec, profile, meas)
