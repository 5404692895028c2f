"""Profile -> LayerCosts -> Estimate: measured times used as recorded, rules applied."""
from __future__ import annotations

import dataclasses
import importlib.util
import pathlib

import pytest

from primus_ext.project.simulate_backend import simulate_layer_costs
from primus_ext.measure.downscale import downscale
from primus_ext.project.profile import rank_shapes
from primus_ext.presets.overrides import spec_overrides
from primus_ext.project.profile import CommFit, KindTiming, Profile, fit_alpha_beta
from primus_ext.project.from_profile import calibrated_spec, fitted_hardware, \
    layer_costs_from_profile, project_from_profile

_spec = importlib.util.spec_from_file_location(
    "measure_specs", pathlib.Path(__file__).with_name("specs.py"))
S = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(S)

FWD, BWD = 0.010, 0.020


def _fit(coll: str, alpha: float, gbps: float) -> CommFit:
    pts = tuple((float(b), alpha + b / (gbps * 1e9)) for b in (1e4, 1e5, 1e6, 1e7))
    return CommFit(collective=coll, group_size=2, alpha_s=alpha, gbps=gbps, points=pts,
                   max_rel_err=0.0)


def profile_for(target, local: int = 1, hw: str = "cpu", contention: float = 1.0,
                comm: dict | None = None, fits=()) -> Profile:
    d = downscale(target, local, hw)
    kinds = {"dense": KindTiming(kind="dense", num_layers=2, num_samples=12, fwd_s=FWD,
                                 bwd_s=BWD, parts={"attn": {"fwd": 0.004, "bwd": 0.008},
                                                   "mlp": {"fwd": 0.004, "bwd": 0.008},
                                                   "core_attn": {"fwd": 0.002}},
                                 comm_s=comm or {}, contention=contention,
                                 activation_bytes=1000),
             "embedding": KindTiming(kind="embedding", num_layers=1, num_samples=6,
                                     fwd_s=0.0002, bwd_s=0.0002, contention=contention),
             "output": KindTiming(kind="output", num_layers=1, num_samples=6, fwd_s=0.002,
                                  bwd_s=0.002, contention=contention)}
    timed = 2 * (FWD + BWD) + 0.0004 + 0.004
    return Profile(created="test", device={"kind": "cpu", "name": "test", "hardware": hw,
                                           "count": local},
                   versions={}, target_overrides=tuple(spec_overrides(target)),
                   downscale_overrides=d.overrides, rules=d.rules,
                   measured_shapes=rank_shapes(d.spec), measured_parallel={},
                   layers=kinds, collectives=(),
                   step={"step_s": 2 * timed + 0.01, "fwd_bwd_s": 2 * timed + 0.002,
                         "optimizer_s": 0.01, "zero_grad_s": 0.0, "num_microbatches": 2,
                         "num_params_per_rank": 1_000_000},
                   comm_fits=tuple(fits))


def test_same_shapes_use_the_measured_times():
    target = S.run(S.tiny(), hw="cpu", gpn=1, train={"seq_length": 256,
                                                    "global_batch_size": 8})
    costs = layer_costs_from_profile(profile_for(target), target)
    dense = costs.kinds["dense"]
    assert dense.fwd_s == pytest.approx(FWD)
    assert dense.bwd_input_s + dense.bwd_weight_s == pytest.approx(BWD)
    # The per-microbatch time outside the timed modules goes to the two ends.
    assert costs.kinds["embedding"].fwd_s == pytest.approx(0.0002 + 0.0005)
    assert any("measured layer times" in n for n in costs.notes)


def test_measured_collective_time_is_taken_out_and_recosted():
    target = S.run(S.tiny(), hw="cpu", gpn=2, tp=2, sequence_parallel=True,
                   train={"seq_length": 256, "global_batch_size": 8})
    fits = [_fit(c, 1e-4, 1.0) for c in ("all_gather", "reduce_scatter", "all_reduce")]
    prof = profile_for(target, local=2, comm={"tp": {"fwd": 0.003, "bwd": 0.005}},
                       fits=fits)
    dense = layer_costs_from_profile(prof, target).kinds["dense"]
    assert dense.fwd_s == pytest.approx(FWD - 0.003)
    ag = [c for c in dense.comms if c.collective == "all_gather" and c.phase == "fwd"][0]
    assert ag.seconds == pytest.approx(1e-4 + ag.num_bytes / 1e9)


def _seen(op, *, kind="dense", count=2.0, seconds=5e-4, blocked=8e-4):
    from primus_ext.project.profile import CollectiveSeen
    return CollectiveSeen(kind=kind, part="layer", op="x", collective=op.collective,
                          axis=op.axis, phase=op.phase, group_size=op.group_size,
                          num_bytes=op.num_bytes / op.calls, count=count, seconds=seconds,
                          blocked_s=blocked)


def test_collectives_the_measured_run_issued_use_their_in_situ_times():
    target = S.run(S.tiny(), hw="cpu", gpn=2, tp=2, sequence_parallel=True,
                   train={"seq_length": 256, "global_batch_size": 8})
    sim = simulate_layer_costs(target)
    ops = {o.name: o for o in sim.kinds["dense"].comms}
    ag, ag_w = ops["attn.tp_all_gather"], ops["attn.tp_all_gather_wgrad_input"]
    ce = next(o for o in sim.kinds["output"].comms if o.calls > 1)
    fits = [_fit(c, 1e-4, 1.0) for c in ("all_gather", "reduce_scatter", "all_reduce")]
    prof = dataclasses.replace(profile_for(target, local=2, fits=fits), collectives=(
        _seen(ag),  # a blocking call: mean 0.8 ms, median 0.5 ms
        _seen(ag_w, count=4.0, seconds=2e-3, blocked=3e-4),  # async, overlapped
        _seen(ce, kind="output", count=3.0, seconds=4e-4, blocked=6e-4)))
    costs = layer_costs_from_profile(prof, target)
    got = {o.name: o for o in costs.kinds["dense"].comms}
    assert (got[ag.name].seconds, got[ag.name].exposed_s) == pytest.approx((8e-4, 8e-4))
    assert (got[ag_w.name].seconds, got[ag_w.name].exposed_s) == pytest.approx((2e-3, 3e-4))
    out = {o.name: o for o in costs.kinds["output"].comms}
    # Three calls of one per-call size (the cross-entropy's max, logit, sum-exp).
    assert out[ce.name].exposed_s == pytest.approx(3 * 6e-4)
    # A size the run never issued (the reduce-scatters here) falls back to the fit.
    rs = got["attn.tp_reduce_scatter"]
    assert rs.seconds == pytest.approx(1e-4 + rs.num_bytes / 1e9)
    assert any("with their in-situ times" in n for n in costs.notes)


def test_contention_applies_when_the_target_keeps_cores_busy():
    one = S.run(S.tiny(), hw="cpu", gpn=1, train={"seq_length": 256, "global_batch_size": 8})
    two = S.run(S.tiny(), hw="cpu", gpn=2, train={"seq_length": 256, "global_batch_size": 8})
    prof = profile_for(one, contention=1.4)
    assert layer_costs_from_profile(prof, one).kinds["dense"].fwd_s == pytest.approx(FWD)
    assert layer_costs_from_profile(prof, two).kinds["dense"].fwd_s == pytest.approx(
        1.4 * FWD)


def test_sp_tokens_rescale_only_norms_and_residuals():
    target = S.run(S.tiny(), hw="cpu", gpn=2, tp=2, sequence_parallel=True,
                   train={"seq_length": 256, "global_batch_size": 8})
    prof = profile_for(target, local=1)  # measured at TP1 with half the heads/FFN
    dense = layer_costs_from_profile(prof, target).kinds["dense"]
    # attention and MLP parts keep their time; the rest (2 ms fwd) shrinks.
    assert 0.008 < dense.fwd_s < FWD
    assert any("rescaled" in n for n in layer_costs_from_profile(prof, target).notes)


def test_other_hardware_times_come_from_the_simulate_backend():
    target = S.run(S.llama70b(), nodes=8, tp=8, pp=4, sequence_parallel=True)
    prof = profile_for(target, local=2)
    costs = layer_costs_from_profile(prof, target)
    sim = simulate_layer_costs(target)
    assert costs.kinds["dense"].fwd_s == sim.kinds["dense"].fwd_s
    text = " ".join(costs.notes)
    assert "cannot stand in" in text and "simulated: compute times" in text


def test_fitted_hardware_reproduces_the_fits():
    from primus_ext.comm.collectives import collective_s
    from primus_ext.comm.groups import group_span
    target = S.run(S.tiny(), hw="cpu", gpn=2, train={"seq_length": 256,
                                                    "global_batch_size": 8})
    fits = [_fit("all_reduce", 2e-4, 2.0), _fit("all_gather", 2e-4, 4.0),
            _fit("reduce_scatter", 2e-4, 4.0)]
    prof = profile_for(target, local=2, fits=fits)
    hw = fitted_hardware(prof, target.cluster.hardware)
    spec = dataclasses.replace(target, cluster=dataclasses.replace(target.cluster,
                                                                   hardware=hw))
    span = group_span(spec, "dp_cp")
    for f in fits:
        for b, t in f.points:
            assert collective_s(hw, span, f.collective, b) == pytest.approx(t, rel=0.05)


def test_optimizer_rate_fitted_to_the_measured_step():
    from primus_ext.project.optimizer import optimizer_step_s
    target = S.run(S.tiny(), hw="cpu", gpn=1, train={"seq_length": 256,
                                                    "global_batch_size": 8})
    prof = profile_for(target)
    spec = calibrated_spec(prof, target)
    assert optimizer_step_s(spec, 1_000_000) == pytest.approx(0.01, rel=1e-3)


def test_more_layers_never_faster():
    base = dict(hw="cpu", gpn=2, pp=2, train={"seq_length": 256, "global_batch_size": 8})
    prof = profile_for(S.run(S.tiny(), **base))
    steps = [project_from_profile(prof, S.run(S.tiny(num_layers=n), **base)).step_time_s
             for n in (4, 8, 16)]
    assert steps == sorted(steps)


def test_fit_alpha_beta_recovers_parameters():
    pts = [(b, 5e-5 + b / 3e9) for b in (1e3, 1e4, 1e5, 1e6, 1e7)]
    a, gbps, err = fit_alpha_beta(pts)
    assert a == pytest.approx(5e-5, rel=1e-6) and gbps == pytest.approx(3.0, rel=1e-6)
    assert err < 1e-9


def test_profile_json_round_trip(tmp_path):
    target = S.run(S.tiny(), hw="cpu", gpn=2, train={"seq_length": 256,
                                                    "global_batch_size": 8})
    prof = profile_for(target, fits=[_fit("all_reduce", 1e-4, 1.0)])
    path = tmp_path / "p.json"
    prof.save(path)
    assert Profile.load(path) == prof
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema_version": 99}')
    with pytest.raises(ValueError, match="schema_version"):
        Profile.load(bad)


def test_moe_imbalance_from_the_measured_routing():
    """EP 2 target, one-process measurement of all 4 experts: the MoE layer pays the
    counted busiest rank on the experts' share of its MoE block; EP 1 pays nothing."""
    moe = S.tiny(num_moe_experts=4, moe_router_topk=2)
    train = {"seq_length": 256, "global_batch_size": 8}
    ep2 = S.run(moe, hw="cpu", gpn=2, ep=2, train=train)
    ep1 = S.run(moe, hw="cpu", gpn=2, train=train)
    loads = ((100, 20, 70, 66),) * 8  # ranks: 120 and 136 tokens -> 136 / 128

    def with_loads(target, vectors):
        prof = profile_for(target)
        kt = KindTiming(kind="moe", num_layers=2, num_samples=12, fwd_s=FWD, bwd_s=BWD,
                        parts={"attn": {"fwd": 0.004, "bwd": 0.008},
                               "mlp": {"fwd": 0.005, "bwd": 0.010}},
                        expert_loads=vectors)
        layers = {k: v for k, v in prof.layers.items() if k != "dense"} | {"moe": kt}
        return dataclasses.replace(prof, layers=layers)

    flat = layer_costs_from_profile(with_loads(ep2, ()), ep2).kinds["moe"]
    costs = layer_costs_from_profile(with_loads(ep2, loads), ep2)
    skew = costs.kinds["moe"]
    assert skew.fwd_s > flat.fwd_s and skew.bwd_input_s > flat.bwd_input_s
    extra = skew.fwd_s - flat.fwd_s
    assert 0 < extra <= 0.005 * (136 / 128 - 1) + 1e-12  # at most the whole MoE block
    assert any(n.startswith("moe_imbalance") for n in costs.notes)
    same = layer_costs_from_profile(with_loads(ep1, loads), ep1).kinds["moe"]
    assert same.fwd_s == pytest.approx(
        layer_costs_from_profile(with_loads(ep1, ()), ep1).kinds["moe"].fwd_s)


def test_shorter_measured_sequence_is_restored_with_core_attention_on_its_own():
    """The plan's ``seq`` rule: measured at half the target's sequence, per-token parts
    scale with the tokens (about 2x) and core attention by its own, steeper, ratio."""
    target = S.run(S.tiny(), hw="cpu", gpn=1, train={"seq_length": 8192,
                                                    "global_batch_size": 8})
    d = downscale(target, 1, "cpu", seq_length=4096)
    assert any(r.startswith("seq: 8192 -> 4096") for r in d.rules)
    prof = profile_for(target)
    prof = dataclasses.replace(prof, downscale_overrides=d.overrides, rules=d.rules,
                               measured_shapes=rank_shapes(d.spec))
    from primus_ext.project.from_profile import _parts
    pt, pm = _parts(target, False, None), _parts(d.spec, False, None)
    r_core = pt["core_attn"]["fwd"] / pm["core_attn"]["fwd"]
    r_rest = (pt["attn"]["fwd"] - pt["core_attn"]["fwd"]) / (
        pm["attn"]["fwd"] - pm["core_attn"]["fwd"])
    assert r_core > r_rest > 1.5  # quadratic vs linear in the tokens
    dense = layer_costs_from_profile(prof, target).kinds["dense"]
    core, attn, mlp = 0.002, 0.004, 0.004
    other = FWD - attn - mlp
    want = ((attn - core) * r_rest + core * r_core
            + mlp * pt["mlp"]["fwd"] / pm["mlp"]["fwd"]
            + other * pt["other"]["fwd"] / pm["other"]["fwd"])
    assert dense.fwd_s == pytest.approx(want)
    assert 1.5 * FWD < dense.fwd_s < r_core * FWD


def test_provenance_says_what_was_measured_and_modelled():
    from primus_ext.measure.provenance import provenance, provenance_lines
    target = S.run(S.tiny(), hw="cpu", gpn=1, train={"seq_length": 256,
                                                    "global_batch_size": 8})
    prof = profile_for(target)
    prov = provenance(prof, target)
    assert prov["times_stand_in"] and "optimizer step (fits the HBM rate)" in prov["measured"]
    assert prov["downscale_rules"] == list(prof.rules)
    modelled = dataclasses.replace(prof, step={**prof.step, "optimizer": "modelled"})
    assert "optimizer step" in provenance(modelled, target)["modelled"]
    on_h100 = S.run(S.tiny(), hw="h100", gpn=1, train={"seq_length": 256,
                                                      "global_batch_size": 8})
    lines = provenance_lines(provenance(prof, on_h100))
    assert any(x.startswith("simulated: compute times (h100 model)") for x in lines)
