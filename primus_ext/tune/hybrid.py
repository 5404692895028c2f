"""Hybrid re-ranking (``tune.backend=hybrid``): measured-profile estimates for the best.

The analytic projector ranks the whole space (milliseconds a candidate); a measured
profile (a real megatron-core run of a downscaled model, ``profile=FILE`` as written by
``mode=measure``) then re-scores the top ``tune.hybrid_top_k`` candidates through
``primus_ext.project.from_profile.project_from_profile``, and the final order follows
those estimates. The baseline and the reference layout are re-scored the same way, so
the report compares like with like; overrides.txt then carries ``backend=profile
profile=FILE`` so ``mode=project`` reproduces the hybrid figures.
"""
from __future__ import annotations

from primus_ext.tune.evaluate import (Trial, compact_estimate, cost_per_mtok, gpu_hour_cost,
                                      objective_score)


def check_available(settings) -> None:
    """Fail before searching when hybrid cannot run (no module, no profile file)."""
    if settings.backend != "hybrid":
        return
    try:
        from primus_ext.project import from_profile  # noqa: F401
    except ImportError:
        raise ValueError("tune.backend=hybrid needs primus_ext.project.from_profile, which "
                         "this version does not have; use tune.backend=simulate") from None
    if not settings.profile:
        raise ValueError("tune.backend=hybrid needs profile=FILE (a Profile JSON written by "
                         "mode=measure)")


class ProfileScorer:
    """Compact estimates of specs from one measured profile (loaded once)."""

    def __init__(self, settings):
        from primus_ext.project.profile import Profile

        self.settings = settings
        self.profile = Profile.load(settings.profile)

    def metrics(self, spec) -> dict:
        from primus_ext.project.from_profile import project_from_profile

        est = project_from_profile(self.profile, spec, calibration=self.settings.calibration)
        mem = est.memory
        m = compact_estimate(est, spec, mem.peak_bytes,
                             getattr(mem, "device_bytes", None) or spec.cluster.hardware.hbm_bytes)
        m["cost_per_mtok"] = cost_per_mtok(m, gpu_hour_cost(spec, self.settings))
        return m

    def rescore(self, trial: Trial, spec, source: str | None = None) -> Trial:
        m = self.metrics(spec)
        return Trial(point=trial.point, source=source or trial.source, verdict="ok",
                     metrics=m, score=objective_score(m, self.settings.objective),
                     hypothesis=trial.hypothesis, index=trial.index)


def rerank(ev, settings, scorer: ProfileScorer | None = None) -> list[Trial]:
    """The top candidates re-scored from the measured profile, best first."""
    scorer = scorer or ProfileScorer(settings)
    out = [scorer.rescore(t, ev.space.spec(t.point), source="hybrid")
           for t in ev.ok_trials()[:settings.hybrid_top_k]]
    return sorted(out, key=lambda x: (-x.score, x.index))
