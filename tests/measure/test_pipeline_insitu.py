"""Rule ``pipeline_insitu`` (project/pipeline_insitu.py): a pipeline target takes its
layer times from the two-stage probe that ran megatron-core's 1F1B schedule, and what
the schedule took beyond them goes to every pipeline p2p."""
from __future__ import annotations

import dataclasses
import importlib.util
import pathlib

import pytest

from primus_ext.measure.downscale import downscale
from primus_ext.presets.overrides import apply_overrides, spec_overrides
from primus_ext.project.from_profile import _per_microbatch_overhead, \
    calibrated_spec, layer_costs_from_profile, project_from_profile
from primus_ext.project.pipeline_insitu import insitu_profile, pipeline_insitu_s, \
    probe_projection_s

_spec = importlib.util.spec_from_file_location(
    "test_from_profile", pathlib.Path(__file__).with_name("test_from_profile.py"))
T = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(T)
S = T.S

M = 4  # the probe's microbatches


def _targets():
    tr = {"seq_length": 256, "global_batch_size": 8}
    return (S.run(S.tiny(), hw="cpu", gpn=2, train=tr, pp=2),
            S.run(S.tiny(), hw="cpu", gpn=2, train=tr))


def _probe_spec(target):
    d = downscale(target, 1, "cpu")
    return apply_overrides(d.spec, ["parallel.pp=2", f"train.global_batch_size={M}",
                                    f"model.num_layers={2 * d.spec.model.num_layers}",
                                    "cluster.gpus_per_node=2"])


def _with_probe(prof, target, fwd_bwd_s, layers=None):
    probe = {"overrides": spec_overrides(_probe_spec(target)), "num_microbatches": M,
             "fwd_bwd_s": fwd_bwd_s, "steps": 6,
             "layers": layers if layers is not None else {
                 k: {"fwd": kt.fwd_s, "bwd": kt.bwd_s} for k, kt in prof.layers.items()}}
    return dataclasses.replace(prof, step={**prof.step, "pipeline_probe": probe})


def _projected_probe(prof, target):
    spec = calibrated_spec(prof, target)
    return probe_projection_s(insitu_profile(prof),
                              dataclasses.replace(_probe_spec(target),
                                                  cluster=spec.cluster))


def test_a_probe_that_matches_its_projection_changes_nothing():
    pp, _ = _targets()
    base = T.profile_for(pp)
    same = _with_probe(base, pp, 0.0)
    same = _with_probe(base, pp, _projected_probe(same, pp))
    extra, note = pipeline_insitu_s(insitu_profile(same), calibrated_spec(same, pp))
    assert extra == pytest.approx(0.0, abs=1e-9)
    assert "pipeline_insitu" in note
    assert project_from_profile(same, pp).step_time_s == pytest.approx(
        project_from_profile(base, pp).step_time_s, rel=1e-6)


def test_the_schedule_time_beyond_the_layers_goes_to_every_crossing():
    pp, flat = _targets()
    base = _with_probe(T.profile_for(pp), pp, 0.0)
    pred = _projected_probe(base, pp)
    slow = _with_probe(T.profile_for(pp), pp, pred + 0.080)
    extra, _ = pipeline_insitu_s(insitu_profile(slow), calibrated_spec(slow, pp))
    # 4 microbatches cross the one boundary forward and backward.
    assert extra == pytest.approx(0.080 / (2 * M), rel=1e-6)
    est = project_from_profile(slow, pp)
    assert est.step_time_s > project_from_profile(base, pp).step_time_s + 0.05
    assert any(n.startswith("pipeline_insitu") for n in est.notes)
    # Not a pipeline target: the probe is not used.
    assert project_from_profile(slow, flat).step_time_s == pytest.approx(
        project_from_profile(T.profile_for(flat), flat).step_time_s, rel=1e-9)


def test_a_probe_faster_than_its_projection_adds_nothing():
    pp, _ = _targets()
    base = _with_probe(T.profile_for(pp), pp, 0.0)
    fast = _with_probe(T.profile_for(pp), pp, 0.5 * _projected_probe(base, pp))
    assert pipeline_insitu_s(insitu_profile(fast), calibrated_spec(fast, pp))[0] == 0.0


def test_layer_times_come_from_the_probe_and_the_outside_time_from_the_flat_run():
    pp, _ = _targets()
    base = T.profile_for(pp)
    layers = {"dense": {"fwd": 1.5 * T.FWD, "bwd": 1.5 * T.BWD}}
    prof = insitu_profile(_with_probe(base, pp, 1.0, layers=layers))
    assert prof.layers["dense"].fwd_s == pytest.approx(1.5 * T.FWD)
    assert prof.layers["dense"].parts["attn"]["bwd"] == pytest.approx(1.5 * 0.008)
    assert prof.layers["output"] == base.layers["output"]  # not in the probe
    assert _per_microbatch_overhead(prof) == pytest.approx(_per_microbatch_overhead(base))
    dense = layer_costs_from_profile(prof, pp).kinds["dense"]
    assert dense.fwd_s == pytest.approx(1.5 * T.FWD)


def test_the_gradient_sync_inside_the_schedule_is_not_outside_time():
    pp, _ = _targets()
    base = T.profile_for(pp)
    synced = dataclasses.replace(base, step={**base.step, "fwd_bwd_s":
                                             base.step["fwd_bwd_s"] + 0.03,
                                             "finalize_s": 0.03})
    assert _per_microbatch_overhead(synced) == pytest.approx(
        _per_microbatch_overhead(base))
