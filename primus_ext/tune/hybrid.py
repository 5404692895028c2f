"""Hybrid re-ranking (``tune.backend=hybrid``): the extension point.

The analytic projector ranks the whole space; a measured profile (a real megatron-core
run of a downscaled model, ``profile=FILE``) then re-scores the top ``hybrid_top_k``
candidates through ``primus_ext.project.from_profile.estimate_from_profile``, and the
final order follows the measured-profile estimates. Where that module is not available
the tuner says so and stops before searching, rather than silently using simulate.
"""
from __future__ import annotations

from primus_ext.tune.evaluate import (Trial, compact_estimate, cost_per_mtok, gpu_hour_cost,
                                      objective_score)


def check_available(settings) -> None:
    if settings.backend != "hybrid":
        return
    try:
        from primus_ext.project import from_profile  # noqa: F401
    except ImportError:
        raise ValueError("tune.backend=hybrid needs primus_ext.project.from_profile, which "
                         "this version does not have yet; use tune.backend=simulate") from None
    if not settings.profile:
        raise ValueError("tune.backend=hybrid needs profile=FILE (a saved Profile JSON)")


def rerank(ev, settings) -> list[Trial]:
    """The top candidates re-scored from the measured profile, best first."""
    from primus_ext.project.from_profile import estimate_from_profile

    out = []
    for t in ev.ok_trials()[:settings.hybrid_top_k]:
        spec = ev.space.spec(t.point)
        est = estimate_from_profile(settings.profile, spec, calibration=settings.calibration)
        m = compact_estimate(est, spec, t.metrics["peak_memory_bytes"],
                             t.metrics["device_bytes"])
        m["cost_per_mtok"] = cost_per_mtok(m, gpu_hour_cost(spec, settings))
        out.append(Trial(point=t.point, source="hybrid", verdict="ok", metrics=m,
                         score=objective_score(m, settings.objective), index=t.index))
    return sorted(out, key=lambda x: (-x.score, x.index))
