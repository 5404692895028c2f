"""Monotone sanity and closed forms of the whole projector (hypothesis).

- More scale-up, scale-out or HBM bandwidth never makes a step slower.
- More decoder layers never make a step faster.
- With uniform stages and free point-to-point links the simulated pipeline bubble is the
  closed form: (p-1)/m for 1F1B, (p-1)/(v m) for the interleaved schedule, through
  ``project`` with a uniform LayerCosts.
- The long-step shortcut of the schedule simulation (project/estimate.py) matches the
  full simulation: exactly on uniform stages, within a few percent on heterogeneous ones.
"""
from __future__ import annotations

import dataclasses
import random

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from primus_ext.presets import hardware_preset
from primus_ext.compute.costs import LayerCost, LayerCosts
from primus_ext.project.estimate import project
from primus_ext.project.schedule import ScheduleInput, simulate
from primus_ext.project.schedule_fast import simulate_fast
from primus_ext.spec import ClusterSpec, ModelSpec, ParallelSpec, RunSpec, TrainSpec

SETTINGS = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


def _model(layers: int, moe: bool, hidden: int) -> ModelSpec:
    kw = dict(name="prop", num_layers=layers, hidden_size=hidden,
              num_attention_heads=hidden // 128, num_query_groups=8,
              ffn_hidden_size=hidden * 3, vocab_size=32000)
    if moe:
        kw.update(num_moe_experts=16, moe_router_topk=2, moe_ffn_hidden_size=hidden,
                  moe_router_num_groups=4, moe_router_group_topk=2)
    return ModelSpec(**kw)


specs = st.fixed_dictionaries({
    "layers": st.sampled_from([8, 12, 16]),
    "moe": st.booleans(),
    "hidden": st.sampled_from([1024, 2048]),
    "tp": st.sampled_from([1, 2, 4]),
    "pp": st.sampled_from([1, 2, 4]),
    "vpp": st.sampled_from([1, 2]),
    "cp": st.sampled_from([1, 2]),
    "ep": st.sampled_from([1, 2, 4, 8]),
    "nodes": st.sampled_from([1, 2, 4]),
    "mbs": st.sampled_from([1, 2]),
    "gpu": st.sampled_from(["h100", "b200", "mi300x", "gb200"]),
    "precision": st.sampled_from(["bf16", "fp8"]),
    "fsdp": st.booleans(),
    "tp_overlap": st.booleans(),
    "dispatcher": st.sampled_from(["alltoall", "flex", "allgather"]),
    "a2a_overlap": st.booleans(),
    "grad_fp32": st.booleans(),
    "recompute": st.sampled_from([None, "selective", "full"]),
})


def _spec(d: dict, layers: int | None = None) -> RunSpec:
    model = _model(layers or d["layers"], d["moe"], d["hidden"])
    tp, pp, vpp = d["tp"], d["pp"], d["vpp"] if d["pp"] > 1 else 1
    ep = d["ep"] if d["moe"] else 1
    a2a = d["a2a_overlap"] and d["moe"] and ep > 1 and d["dispatcher"] != "allgather" \
        and (pp == 1 or vpp > 1)
    par = ParallelSpec(tp=tp, pp=pp, vpp=vpp, cp=d["cp"], ep=ep, etp=1,
                       sequence_parallel=tp > 1, fsdp=d["fsdp"] and pp == 1,
                       tp_comm_overlap=d["tp_overlap"] and tp > 1,
                       moe_token_dispatcher_type=d["dispatcher"],
                       overlap_moe_expert_parallel_comm=a2a,
                       grad_reduce_in_fp32=d["grad_fp32"])
    hw = hardware_preset(d["gpu"])
    cluster = ClusterSpec(hardware=hw, num_nodes=d["nodes"])
    dp = cluster.world_size // (tp * pp * d["cp"])
    rec = {}
    if d["recompute"] == "full":
        rec = dict(recompute_granularity="full", recompute_method="block",
                   recompute_num_layers=1)
    elif d["recompute"]:
        rec = dict(recompute_granularity="selective")
    train = TrainSpec(seq_length=4096, micro_batch_size=d["mbs"],
                      global_batch_size=d["mbs"] * max(dp, 1) * 4 * pp,
                      precision=d["precision"], **rec)
    return RunSpec(model=model, parallel=par, train=train, cluster=cluster)


def _legal(d: dict, layers: int | None = None) -> RunSpec:
    try:
        return _spec(d, layers)
    except ValueError:
        assume(False)


def _with_hw(spec: RunSpec, **scale) -> RunSpec:
    hw = spec.cluster.hardware
    hw = dataclasses.replace(hw, **{k: getattr(hw, k) * f for k, f in scale.items()})
    return dataclasses.replace(spec, cluster=dataclasses.replace(spec.cluster, hardware=hw))


def _step(spec: RunSpec) -> float:
    return project(spec, calibration=None).step_time_s


@SETTINGS
@given(specs, st.sampled_from(["scale_up_gbps", "scale_out_gbps", "hbm_gbps"]),
       st.floats(min_value=1.05, max_value=4.0))
def test_more_bandwidth_is_never_slower(d, field, factor):
    spec = _legal(d)
    assert _step(_with_hw(spec, **{field: factor})) <= _step(spec) * (1 + 1e-9)


@SETTINGS
@given(specs, st.sampled_from([1, 2, 4, 8]))
def test_more_layers_are_never_faster(d, extra):
    spec = _legal(d)
    bigger = _legal(d, layers=d["layers"] + extra)
    assert _step(bigger) >= _step(spec) * (1 - 1e-9)


def _uniform_costs(layers: int, f: float, b: float) -> LayerCosts:
    dense = LayerCost(kind="dense", fwd_s=f, bwd_input_s=b, bwd_weight_s=0.0)
    return LayerCosts(kinds={"dense": dense}, decoder_kinds=("dense",) * layers,
                      source="uniform")


def _free_links(spec: RunSpec) -> RunSpec:
    """Point-to-point effectively free: no latency, enormous bandwidth; no host clock
    (the closed forms are the device's pipeline alone)."""
    hw = dataclasses.replace(spec.cluster.hardware, scale_up_latency_s=0.0,
                             scale_out_latency_s=0.0, scale_up_gbps=1e15,
                             scale_out_gbps=1e15, host_clock=False)
    return dataclasses.replace(spec, cluster=dataclasses.replace(spec.cluster, hardware=hw))


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([2, 4, 8]), st.sampled_from([1, 2, 4]), st.integers(1, 12),
       st.floats(min_value=0.01, max_value=1.0), st.floats(min_value=1.0, max_value=3.0))
def test_bubble_matches_the_closed_forms(pp, vpp, groups, f, ratio):
    """Uniform stages, free p2p, one data-parallel rank (no gradient sync): the pipeline
    part of the step is m (F+B) (1 + (p-1)/(v m)) with v = 1 for 1F1B."""
    m = pp * groups
    layers = pp * vpp * 2
    spec = RunSpec(model=_model(layers, False, 1024),
                   parallel=ParallelSpec(pp=pp, vpp=vpp),
                   train=TrainSpec(seq_length=1024, global_batch_size=m),
                   cluster=ClusterSpec(hardware=hardware_preset("h100"), num_nodes=1,
                                       gpus_per_node=pp))
    spec = _free_links(spec)
    costs = _uniform_costs(layers, f, f * ratio)
    for record in (True, False):  # the event simulation and the fast path
        est = project(spec, costs=costs, calibration=None, record_timeline=record)
        per_mb = 2 * vpp * f * (1 + ratio)  # one stage, one microbatch: F + B
        bubble = (pp - 1) / (vpp * m)
        pipeline = est.step_time_s - est.breakdown["optimizer_s"]
        assert abs(pipeline - m * per_mb * (1 + bubble)) <= 1e-9 * pipeline
        if record:
            assert abs(est.timeline.bubble_fraction - bubble) <= 1e-9


def test_fast_path_matches_the_full_simulation_on_long_steps():
    """The projector's schedule (schedule_fast.simulate_fast) on long steps: equal to
    the event simulation to float rounding, uniform or not (the periodic jump is exact:
    no extrapolation error to bound)."""
    rng = random.Random(7)
    worst_uniform = worst = 0.0
    for _ in range(150):
        p = rng.choice([2, 4, 8, 16])
        sched = rng.choice(["1f1b", "interleaved", "zb"])
        v = rng.choice([2, 4]) if sched == "interleaved" else 1
        m = p * rng.randint(8, 24)
        for uniform in (True, False):
            def grid(lo, hi):
                if uniform:
                    return tuple(tuple(1.0 for _ in range(v)) for _ in range(p))
                return tuple(tuple(rng.uniform(lo, hi) for _ in range(v)) for _ in range(p))
            lat = 0.0 if uniform else tuple(rng.uniform(0, 0.3) for _ in range(p))
            if isinstance(lat, tuple) and sched != "interleaved":
                lat = lat[:p - 1]
            inp = ScheduleInput(num_stages=p, num_chunks=v, num_microbatches=m,
                                fwd_s=grid(0.5, 2), bwd_input_s=grid(1, 4),
                                bwd_weight_s=grid(0, 1), p2p_s=lat, schedule=sched)
            err = abs(simulate_fast(inp).step_s / simulate(inp).step_s - 1)
            if uniform:
                worst_uniform = max(worst_uniform, err)
            else:
                worst = max(worst, err)
    assert worst_uniform <= 1e-9
    assert worst <= 1e-9


@SETTINGS
@given(specs, st.integers(0, 7))
def test_projection_through_the_fast_path_equals_the_event_simulation(d, extra):
    """project() takes the schedule's fast path unless the timeline is wanted (then the
    event simulation runs): both give one step time, also when the microbatches do not
    fill whole groups (extra microbatches per data-parallel rank)."""
    spec = _legal(d)
    t = spec.train
    gbs = t.global_batch_size + extra * t.micro_batch_size * spec.dp
    spec = _legal_replace(spec, gbs)
    fast = project(spec, calibration=None)
    full = project(spec, calibration=None, record_timeline=True)
    assert abs(fast.step_time_s - full.step_time_s) <= 1e-9 * full.step_time_s
    assert fast.critical_stage == full.critical_stage


def _legal_replace(spec: RunSpec, gbs: int) -> RunSpec:
    try:
        return dataclasses.replace(spec, train=dataclasses.replace(
            spec.train, global_batch_size=gbs))
    except ValueError:
        assume(False)
