"""The tuner relieves a layout that does not fit with the same ladder as the published
reader (memory/fit_ladder.py): the cheapest recompute that fits, off the recompute axis
if need be (e.g. 'full-block-k'), before heavier recompute, FSDP or a smaller batch."""
from __future__ import annotations

from dataclasses import replace

from test_space import _spec
from tune_fakes import fake_project

from primus_ext.memory.fit_ladder import cheapest_fit
from primus_ext.tune.evaluate import Evaluator
from primus_ext.tune.planner import relieve
from primus_ext.tune.points import parse_recompute
from primus_ext.tune.settings import TuneSettings
from primus_ext.tune.space import IDX, SearchSpace, point_of


def test_relief_takes_the_ladders_choice():
    # Llama 3.1 8B at TP1, 8K tokens, one node: too big without recompute.
    spec = _spec("llama3.1_8b", "h100", nodes=1, gbs=64)
    space = SearchSpace(spec)
    ev = Evaluator(space, TuneSettings(progress=False), project_fn=fake_project)
    trial = ev.evaluate(space.normalize(point_of(spec)), "baseline")
    assert trial.verdict == "oom"
    relieved = relieve(ev, trial, "planner")
    assert relieved.verdict == "ok"
    granularity, method, num = parse_recompute(relieved.point[IDX["recompute"]])
    # The reader's choice for the same spec (same memory options: the evaluator's).
    choice = cheapest_fit(spec, memory_fn=ev.memory_fn,
                          module_sets=[tuple(spec.train.recompute_modules)])
    t = choice.spec.train
    assert (granularity, method, num) == (t.recompute_granularity, t.recompute_method,
                                          t.recompute_num_layers)
    assert choice.step in ("selective", "block")
    # Cheaper than the axis's full recompute: fewer layers recomputed.
    if method == "block":
        full = replace(spec, train=replace(spec.train, recompute_granularity="full",
                                           recompute_method="uniform",
                                           recompute_num_layers=1))
        assert num < spec.model.num_layers and ev.memory_fn(full).fits
