"""The tuner's ties (tune/ties.py): layouts of one job inside the band of their
difference are tied; among ties the one closest to the published recipe, else the
simplest, is recommended, and the rule is named."""
from __future__ import annotations

import math

from primus_ext.project import bands
from primus_ext.tune.evaluate import Trial
from primus_ext.tune.points import AXES
from primus_ext.tune.ties import axes_above_one, axes_changed, recommend, versus

FEATS = {"arch": "dense", "hardware": "hopper", "scale": "9-64"}


def _point(**kw):
    d = dict(num_nodes=8, hardware="h100", tp=1, pp=1, vpp=1, cp=1, ep=1, etp=None,
             micro_batch_size=1, recompute="none", sharding="distributed_optimizer",
             sequence_parallel=False, overlap_grad_reduce=True, overlap_param_gather=True,
             tp_comm_overlap=False, schedule="auto", precision="bf16")
    d.update(kw)
    return tuple(d[a] for a in AXES)


def _trial(tokens, i, **kw):
    m = {"tokens_per_s_per_gpu": tokens, "step_time_s": 1000.0 / tokens,
         "breakdown": {"host_s": 0.0}, "hardware": "h100", "world_size": 64,
         "band_features": FEATS}
    return Trial(point=_point(**kw), source="search", verdict="ok", metrics=m,
                 score=tokens, index=i)


def _resolvable_ratio() -> float:
    """The smallest throughput ratio two layouts of this group resolve."""
    t = bands.load_bands()
    lo, hi, _ = bands.ratio_band({**FEATS, "host": "device-bound",
                                  "recompute": "published"}, t)
    h = (math.log(hi) - math.log(lo)) / 2
    return math.exp(h * math.sqrt(2 * (1 - t.rho)))


def test_counting_axes():
    assert axes_above_one(_point(tp=4, pp=2, vpp=1)) == 2
    assert axes_above_one(_point(tp=4, pp=2, vpp=4, ep=1, etp=None)) == 3
    assert axes_changed(_point(tp=4), _point(tp=8, micro_batch_size=2)) == 2


def test_simplest_among_ties_without_a_recipe():
    k = _resolvable_ratio()
    best = _trial(1000.0, 0, tp=4, pp=2, vpp=4)
    near = _trial(1000.0 / k ** 0.5, 1, tp=8)  # inside the band: tied, simpler
    far = _trial(1000.0 / k ** 1.5, 2, tp=1)  # outside: resolvably slower
    assert not versus(best.metrics, near.metrics, False).resolvable
    assert versus(best.metrics, far.metrics, False).resolvable
    rec = recommend([best, near, far], False)
    assert rec.trial is near and rec.tied == (best, near)
    assert rec.rule.startswith("the simplest (1 parallel axes above 1)")


def test_closest_to_the_published_recipe_among_ties():
    k = _resolvable_ratio()
    best = _trial(1000.0, 0, tp=8)
    like_recipe = _trial(1000.0 / k ** 0.5, 1, tp=4, pp=2, vpp=4)
    recipe = _point(tp=4, pp=2, vpp=2)
    rec = recommend([best, like_recipe], False, recipe, "P042")
    assert rec.trial is like_recipe
    assert "closest to the published recipe P042 (1 setting(s) changed)" in rec.rule


def test_a_lone_winner_is_the_fastest():
    k = _resolvable_ratio()
    best = _trial(1000.0, 0, tp=4, pp=2)
    rec = recommend([best, _trial(1000.0 / k ** 2, 1, tp=8)], False)
    assert rec.trial is best and rec.tied == (best,) and "fastest" in rec.rule
