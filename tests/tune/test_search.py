"""Search strategies on a toy scorer (tune_fakes): the exhaustive search is exhaustive,
the guided one finds the optimum with a fraction of the evaluations, both are
deterministic, budgets hold, and the memory pre-filter rejects before projecting."""
from __future__ import annotations

import pytest
from tune_fakes import fake_memory, fake_project

from primus_ext.tune.evaluate import Evaluator
from primus_ext.tune.planner import plan, sweep_points
from primus_ext.tune.run import tune
from primus_ext.tune.settings import TuneSettings
from primus_ext.tune.space import IDX, SearchSpace, point_of
from test_space import _spec

SETTINGS = dict(progress=False, reference=None)


def _tune(spec, **kw):
    calls = {"memory": 0, "project": 0}

    def mem(s):
        calls["memory"] += 1
        return fake_memory(s)

    def proj(s):
        calls["project"] += 1
        return fake_project(s)

    result = tune(spec, {**SETTINGS, **kw}, memory_fn=mem, project_fn=proj, write=False)
    return result, calls


@pytest.mark.parametrize("model,hw", [("llama3.1_70b", "h100"), ("mixtral_8x22b", "mi355x")])
def test_guided_matches_exhaustive(model, hw):
    spec = _spec(model, hw)
    ex, ex_calls = _tune(spec, strategy="exhaustive")
    gd, gd_calls = _tune(spec, strategy="guided")
    assert ex.stats["evaluated"] == ex.space["num_legal"]
    assert gd.best.score >= 0.99 * ex.best.score
    assert gd.stats["evaluated"] < ex.stats["evaluated"] / 4
    # Every evaluated candidate met the memory model; only fitting ones were projected.
    assert ex_calls["memory"] == ex.stats["evaluated"]
    assert ex_calls["project"] == ex.stats["projected"] < ex_calls["memory"]
    assert ex.stats["rejected_by_reason"]["oom"] == ex_calls["memory"] - ex_calls["project"]


def test_exhaustive_best_is_the_max_over_all_trials():
    r, _ = _tune(_spec(), strategy="exhaustive")
    ok = [t for t in r.trials if t.verdict == "ok"]
    assert r.best.score == max(t.score for t in ok)
    for t in r.trials:
        if t.verdict == "oom":
            assert t.metrics["peak_memory_bytes"] > t.metrics["device_bytes"]


def test_auto_picks_by_legal_size():
    small, _ = _tune(_spec(), space={"tp": [4, 8], "pp": [2, 4]})
    assert small.strategy == "exhaustive"
    big, _ = _tune(_spec(), budget={"candidates": 100, "seconds": None})
    assert big.strategy == "guided"
    assert big.stats["evaluated"] <= 100


def test_deterministic():
    a, _ = _tune(_spec(), strategy="guided")
    b, _ = _tune(_spec(), strategy="guided")
    assert [t.point for t in a.trials] == [t.point for t in b.trials]


def test_planner_sweeps_one_axis_at_a_time():
    spec = _spec(tp=4, pp=4, sequence_parallel=True)
    space = SearchSpace(spec)
    center = space.normalize(point_of(spec))
    for p in sweep_points(space, center):
        assert sum(a != b for a, b in zip(p, center)) == 1 or p[IDX["tp"]] != center[IDX["tp"]]
    ev = Evaluator(space, TuneSettings(progress=False), memory_fn=fake_memory,
                   project_fn=fake_project)
    user, start, seeds = plan(ev, point_of(spec))
    assert user.source == "baseline" and start.verdict == "ok"
    assert {t.source for t in seeds[1:]} <= {"planner"}


def test_unfitting_baseline_gets_a_fitting_start():
    r, _ = _tune(_spec(), strategy="guided")  # TP1 PP1 of a 70B model: does not fit
    assert r.baseline.verdict == "oom"
    assert r.start.verdict == "ok"


def test_memory_margin_is_a_risk_not_a_filter():
    """The margin marks fitting peaks near the device as tight; it rejects nothing."""
    loose, _ = _tune(_spec(), strategy="exhaustive", memory_margin=0.0)
    wide, _ = _tune(_spec(), strategy="exhaustive", memory_margin=0.3)
    assert wide.stats["rejected_by_reason"] == loose.stats["rejected_by_reason"]
    assert wide.best.point == loose.best.point
    ok = [t for t in wide.trials if t.verdict == "ok"]
    tight = [t for t in ok if t.metrics["memory_tight"]]
    assert tight and all(t.metrics["peak_memory_bytes"] * 1.3 > t.metrics["device_bytes"]
                         for t in tight)
    assert not any(t.metrics["memory_tight"] for t in loose.trials if t.verdict == "ok")


def test_cost_objective_and_pareto():
    r, _ = _tune(_spec(), strategy="exhaustive", objective="cost",
                 gpu_hour_cost={"h100": 2.0, "h200": 3.5},
                 space={"num_nodes": [4, 8], "hardware": ["h100", "h200"], "tp": [4, 8],
                        "pp": [2, 4], "cp": [1]})
    assert r.best.metrics["cost_per_mtok"] == pytest.approx(
        2.0 / 3600 / r.best.metrics["tokens_per_s_per_gpu"] * 1e6
        if r.best.metrics["hardware"] == "h100" else
        3.5 / 3600 / r.best.metrics["tokens_per_s_per_gpu"] * 1e6)
    costs = [t.metrics["cost_per_mtok"] for t in r.trials if t.verdict == "ok"]
    assert r.best.metrics["cost_per_mtok"] == min(costs)
    assert r.pareto and all(t.verdict == "ok" for t in r.pareto)
    tps = [t.metrics["tokens_per_s"] for t in r.pareto]
    assert tps == sorted(tps, reverse=True)
    front_costs = [t.metrics["cost_per_mtok"] for t in r.pareto]
    assert front_costs == sorted(front_costs, reverse=True)  # faster costs more


def test_cost_objective_needs_a_price():
    with pytest.raises(ValueError, match="gpu_hour_cost"):
        _tune(_spec(), strategy="guided", objective="cost")


def test_cluster_planning_searches_every_cluster():
    space = {"num_nodes": [4, 8], "hardware": ["h100", "h200"]}
    ex, _ = _tune(_spec(), strategy="exhaustive", space=space)
    gd, _ = _tune(_spec(), strategy="guided", space=space,
                  budget={"candidates": 800, "seconds": None})
    # 800 per cluster: the uneven pipeline splits Megatron-LM accepts add a third to the
    # legal space (3450 -> 4458 points per cluster).
    assert gd.strategy == "guided" and gd.stats["evaluated"] <= 4 * 800  # per cluster

    def bests(r):
        out = {}
        for t in r.trials:
            if t.verdict == "ok":
                key = (t.metrics["hardware"], t.metrics["num_nodes"])
                out[key] = max(out.get(key, 0.0), t.score)
        return out

    ex_b, gd_b = bests(ex), bests(gd)
    assert set(gd_b) == set(ex_b) == {("h100", 4), ("h100", 8), ("h200", 4), ("h200", 8)}
    for key, score in ex_b.items():
        assert gd_b[key] >= 0.99 * score, key
    assert len(gd.pareto) >= 1


def test_public_entry_point_is_callable():
    import primus_ext
    import primus_ext.tune.run  # noqa: F401 - binds the subpackage on primus_ext

    r = primus_ext.tune(_spec(tp=4, pp=4, sequence_parallel=True),
                        {**SETTINGS, "strategy": "guided", "budget": {"candidates": 20}},
                        memory_fn=fake_memory, project_fn=fake_project, write=False)
    assert r.best is not None and r.stats["evaluated"] <= 20


def test_published_layout_over_the_device_stays_a_candidate():
    """A published layout ran: the memory model putting it over the device marks it,
    and does not reject it, even when the planner met the point first."""
    from tune_fakes import FakeMemory

    spec = _spec(tp=4, pp=4, sequence_parallel=True)
    space = SearchSpace(spec)

    def over(s):
        return FakeMemory(peak_bytes=s.cluster.hardware.hbm_bytes + 1,
                          device_bytes=s.cluster.hardware.hbm_bytes)
    ev = Evaluator(space, TuneSettings(progress=False), memory_fn=over,
                   project_fn=fake_project)
    assert ev.evaluate(point_of(spec), "planner").verdict == "oom"
    t = ev.evaluate(point_of(spec), "reference")
    assert t.verdict == "ok" and t.metrics["memory_over_device"] and \
        t.metrics["memory_tight"]
    assert ev.best is t
