"""tune.backend=hybrid: the top candidates re-scored from a measured Profile; the recipe's
overrides (backend=profile profile=FILE) reproduce the hybrid figures exactly."""
from __future__ import annotations

import pytest

from primus_ext.config import compose, compose_cfg
from primus_ext.tune.run import tune

from_profile = pytest.importorskip("primus_ext.project.from_profile")
from primus_ext.measure.downscale import downscale  # noqa: E402
from primus_ext.project.profile import rank_shapes  # noqa: E402
from primus_ext.presets.overrides import spec_overrides  # noqa: E402
from primus_ext.project.profile import KindTiming, Profile  # noqa: E402

JOB = ["model=tiny_dense", "cluster.hardware=h100", "cluster.num_nodes=1",
       "train.global_batch_size=64", "train.seq_length=1024"]


def _profile(target) -> Profile:
    """A synthetic profile of ``target`` measured by one CPU process."""
    d = downscale(target, 1, "cpu")
    kinds = {"dense": KindTiming(kind="dense", num_layers=2, num_samples=12, fwd_s=0.01,
                                 bwd_s=0.02, parts={"attn": {"fwd": 0.004, "bwd": 0.008},
                                                    "mlp": {"fwd": 0.004, "bwd": 0.008},
                                                    "core_attn": {"fwd": 0.002}},
                                 comm_s={}, contention=1.0, activation_bytes=1000),
             "embedding": KindTiming(kind="embedding", num_layers=1, num_samples=6,
                                     fwd_s=0.0002, bwd_s=0.0002, contention=1.0),
             "output": KindTiming(kind="output", num_layers=1, num_samples=6, fwd_s=0.002,
                                  bwd_s=0.002, contention=1.0)}
    return Profile(created="test", device={"kind": "cpu", "name": "test", "hardware": "cpu",
                                           "count": 1},
                   versions={}, target_overrides=tuple(spec_overrides(target)),
                   downscale_overrides=d.overrides, rules=d.rules,
                   measured_shapes=rank_shapes(d.spec), measured_parallel={},
                   layers=kinds, collectives=(),
                   step={"step_s": 0.2, "fwd_bwd_s": 0.19, "optimizer_s": 0.01,
                         "zero_grad_s": 0.0, "num_microbatches": 2,
                         "num_params_per_rank": 1_000_000})


def test_hybrid_reranks_and_the_recipe_reproduces_it(tmp_path):
    path = tmp_path / "profile.json"
    _profile(compose(JOB)).save(path)
    out = tmp_path / "recipe"
    r = tune(JOB + [f"profile={path}", "tune.backend=hybrid", "tune.hybrid_top_k=3",
                    "tune.progress=false", "tune.reference=null", "tune.space.tp=[1,2]",
                    "tune.space.pp=[1,2]", f"tune.out_dir={out}"])
    assert r.hybrid and len(r.hybrid) <= 3 and r.best is r.hybrid[0]
    assert r.best.source == "hybrid"
    scores = [t.score for t in r.hybrid]
    assert scores == sorted(scores, reverse=True)
    overrides = (out / "overrides.txt").read_text().split()
    assert "backend=profile" in overrides and f"profile={path}" in overrides
    cfg = compose_cfg(overrides)
    est = from_profile.estimate_from_profile(cfg.profile, compose(overrides),
                                             calibration=cfg.calibration)
    assert est.tokens_per_s_per_gpu == r.best.metrics["tokens_per_s_per_gpu"]
    assert est.step_time_s == r.best.metrics["step_time_s"]
    assert "backend: " in (out / "report.md").read_text()


def test_hybrid_without_a_profile_is_a_clear_error():
    with pytest.raises(ValueError, match="needs profile=FILE"):
        tune(JOB + ["tune.backend=hybrid", "tune.progress=false"], write=False)
