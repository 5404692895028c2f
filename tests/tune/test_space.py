"""The search space: default axes, user restrictions, normalisation, legality through
RunSpec (check_run), and the size it reports."""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings, strategies as st

from primus_ext.presets import hardware_preset, model_preset
from primus_ext.spec import ClusterSpec, ModelSpec, ParallelSpec, RunSpec, TrainSpec, check_run
from primus_ext.tune.settings import SpaceSettings, TuneSettings
from primus_ext.tune.space import (AXES, IDX, SearchSpace, as_dict, candidate_from_dict,
                                   parse_recompute, point_of, recompute_label)


def _spec(model="llama3.1_70b", hw="h100", nodes=8, gbs=128, seq=8192, **par) -> RunSpec:
    fields = {k: v for k, v in model_preset(model).items()}
    return RunSpec(model=ModelSpec(**fields), parallel=ParallelSpec(**par),
                   train=TrainSpec(seq_length=seq, global_batch_size=gbs),
                   cluster=ClusterSpec(hardware=hardware_preset(hw), num_nodes=nodes))


@pytest.fixture(scope="module")
def llama():
    return SearchSpace(_spec())


@pytest.fixture(scope="module")
def mixtral():
    return SearchSpace(_spec("mixtral_8x22b", "mi355x"))


def test_default_axes_dense(llama):
    ax = llama.axes
    assert ax["tp"] == (1, 2, 4, 8)  # powers of two up to the node size
    # The divisors of 80 layers, and every divisor of 64 GPUs with a split Megatron-LM
    # accepts (PP 32: 10 + 30 x 2 + 10 layers; PP 64: 9 + 62 x 1 + 9).
    assert set(ax["pp"]) == {d for d in range(1, 65) if 80 % d == 0} | {32, 64}
    assert ax["ep"] == (1,) and ax["etp"] == (None,)
    assert ax["cp"] == (1, 2, 4)  # seq/cp >= 2048
    assert ax["micro_batch_size"] == (1, 2, 4, 8)
    assert ax["recompute"] == ("none", "selective", "full-uniform-1")
    assert ax["sharding"] == ("distributed_optimizer", "fsdp")
    assert ax["num_nodes"] == (8,) and ax["hardware"] == ("h100",)
    assert ax["precision"] == ("bf16",)


def test_default_axes_moe(mixtral):
    assert mixtral.axes["ep"] == (1, 2, 4, 8)
    assert mixtral.axes["etp"] == (1, None)


def test_every_legal_point_is_a_legal_runspec(llama):
    points = llama.legal_points()
    assert len(points) == llama.num_legal > 100
    assert len(set(points)) == len(points)
    for p in points[::37]:
        spec = llama.spec(p)
        check_run(spec.model, spec.parallel, spec.train, spec.cluster)  # no raise
        assert llama.normalize(p) == p
        assert spec.train.global_batch_size == 128 and spec.train.seq_length == 8192
        assert spec.world_size == 64


def test_size_is_reported_with_reasons(llama):
    s = llama.summary()
    assert s["num_raw"] == _product(llama.axes)
    assert s["num_legal"] <= s["num_distinct"] <= s["num_raw"]
    assert any("not divisible by tp*pp*cp" in k for k in s["illegal_by_reason"])
    assert sum(s["illegal_by_reason"].values()) + sum(s["skipped_by_reason"].values()) \
        + s["num_legal"] == s["num_distinct"]


def _product(axes):
    n = 1
    for v in axes.values():
        n *= len(v)
    return n


def test_user_restriction():
    space = SearchSpace(_spec(), SpaceSettings(values={"tp": (2, 4), "pp": (1, 2),
                                                       "recompute_granularity": ("full",),
                                                       "recompute_num_layers": (1, 2)}))
    assert space.axes["tp"] == (2, 4) and space.axes["pp"] == (1, 2)
    assert space.axes["recompute"] == ("full-uniform-1", "full-uniform-2")
    for p in space.legal_points():
        d = as_dict(p)
        assert d["tp"] in (2, 4) and d["pp"] in (1, 2)


def test_settings_from_hydra_shape():
    s = TuneSettings.from_dict({"strategy": "guided", "budget": {"candidates": 50,
                                                                "seconds": None},
                                "space": {"tp": [1, 2], "uneven_layouts": True,
                                          "micro_batch_size": 2}})
    assert s.max_candidates == 50 and s.max_seconds is None
    assert s.space.get("tp") == (1, 2) and s.space.get("micro_batch_size") == (2,)
    assert s.space.uneven_layouts is True
    with pytest.raises(ValueError, match="tune.space.tpp is not a search axis"):
        TuneSettings.from_dict({"space": {"tpp": [1]}})
    with pytest.raises(ValueError, match="tune.strategy='fast'"):
        TuneSettings.from_dict({"strategy": "fast"})
    with pytest.raises(ValueError, match="tune.budget.cand"):
        TuneSettings.from_dict({"budget": {"cand": 3}})


def test_bad_axis_values_are_clear():
    with pytest.raises(ValueError, match="tune.space.sharding value 'zero9'"):
        SearchSpace(_spec(), SpaceSettings(values={"sharding": ("zero9",)}))
    with pytest.raises(ValueError, match="hardware='h900' is not a preset"):
        SearchSpace(_spec(), SpaceSettings(values={"hardware": ("h900",)}))
    with pytest.raises(ValueError, match="recompute"):
        parse_recompute("full-sometimes-2")


def test_normalisation_collapses_equivalent_points(llama):
    base = point_of(_spec(tp=1))
    p = llama.vary(base, tp=1, sequence_parallel=True, tp_comm_overlap=True)
    d = as_dict(p)
    assert d["sequence_parallel"] is False and d["tp_comm_overlap"] is False
    p2 = llama.normalize(llama.vary(base, pp=1, vpp=4))
    assert as_dict(p2)["vpp"] == 1
    # vary snaps a forced value back onto its axis when it stops being forced
    assert as_dict(llama.vary(p, tp=4))["sequence_parallel"] is True


def test_uneven_layouts_state_megatrons_split():
    spec = _spec("llama3.1_405b", nodes=64, gbs=512)  # 126 layers
    space = SearchSpace(spec)
    assert 16 in space.axes["pp"]
    par = space.spec(space.vary(point_of(spec), tp=8, pp=16)).parallel
    assert par.account_for_embedding_in_pipeline_split and \
        par.account_for_loss_in_pipeline_split  # 7 + 14 x 8 + 7 layers
    off = SearchSpace(spec, SpaceSettings(uneven_layouts=False))
    assert 16 not in off.axes["pp"]
    p = off.vary(point_of(spec), tp=8, pp=2, vpp=2)  # 63 layers per stage over 2 chunks
    assert off.spec(p) is None and "uneven" in off.why(p)


def test_cluster_planning_axes():
    space = SearchSpace(_spec(), SpaceSettings(values={"num_nodes": (4, 8),
                                                       "hardware": ("h100", "h200")}))
    worlds = {(space.spec(p).cluster.hardware.name, space.spec(p).world_size)
              for p in space.legal_points()}
    assert worlds == {("h100", 32), ("h100", 64), ("h200", 32), ("h200", 64)}


def test_candidate_from_dict(llama):
    start = llama.legal_points()[0]
    p = candidate_from_dict(llama, {"tp": 4, "recompute": "full-uniform-1"}, start)
    assert as_dict(p)["tp"] == 4 and as_dict(p)["recompute"] == "full-uniform-1"
    with pytest.raises(ValueError, match="'tensor_parallel' is not a search axis"):
        candidate_from_dict(llama, {"tensor_parallel": 4}, start)
    with pytest.raises(ValueError, match="single value"):
        candidate_from_dict(llama, {"tp": [4]}, start)


def test_recompute_labels_round_trip():
    for g, m, n in ((None, None, None), ("selective", None, None), ("full", "block", 3)):
        assert parse_recompute(recompute_label(g, m, n)) == (g, m, n)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_property_points_build_legal_specs_or_say_why(data):
    """Any point drawn from the axes either builds a RunSpec that passes check_run, or
    the space names the rule it broke; normalising twice changes nothing."""
    space = _MIXTRAL_SPACE
    raw = tuple(data.draw(st.sampled_from(space.axes[a])) for a in AXES)
    p = space.normalize(raw)
    assert space.normalize(p) == p
    spec = space.spec(p)
    if spec is None:
        assert space.why(p)
    else:
        check_run(spec.model, spec.parallel, spec.train, spec.cluster)
        assert point_of(spec)[IDX["tp"]] == as_dict(p)["tp"]


_MIXTRAL_SPACE = SearchSpace(_spec("mixtral_8x22b", "mi355x"))
