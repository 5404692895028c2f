"""Tests of the pipeline schedule simulator and its Chrome trace export."""
from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from primus_ext.project.schedule import ScheduleInput, ScheduleResult, simulate
from primus_ext.project.schedule_order import (
    KIND_NAMES, _topological, schedule_table, stage_op_orders)
from primus_ext.project.trace import to_chrome_trace

TIGHT = 1e-9
PROP = settings(max_examples=60, deadline=None)


def uniform(schedule="1f1b", p=4, v=1, m=8, f=1.0, b=2.0, w=0.0, p2p=0.0, g=None):
    return ScheduleInput.uniform(num_stages=p, num_chunks=v, num_microbatches=m, fwd_s=f,
                                 bwd_input_s=b, bwd_weight_s=w, p2p_s=p2p,
                                 schedule=schedule, microbatch_group_size=g)


def random_input(rng: random.Random, schedule: str, p: int, v: int, m: int,
                 g=None) -> ScheduleInput:
    def grid(lo, hi):
        return tuple(tuple(rng.uniform(lo, hi) for _ in range(v)) for _ in range(p))
    links = p if schedule == "interleaved" and v > 1 else max(p - 1, 0)
    return ScheduleInput(num_stages=p, num_chunks=v, num_microbatches=m,
                         fwd_s=grid(0.1, 2.0), bwd_input_s=grid(0.1, 3.0),
                         bwd_weight_s=grid(0.0, 2.0),
                         p2p_s=tuple(rng.uniform(0.0, 0.5) for _ in range(links)),
                         schedule=schedule, microbatch_group_size=g)


def replace(inp: ScheduleInput, **kw) -> ScheduleInput:
    fields = {f: getattr(inp, f) for f in ScheduleInput.__dataclass_fields__}
    fields.update(kw)
    return ScheduleInput(**fields)


# --------------------------------------------------------------------------- op orders

def test_1f1b_order_matches_megatron_warmup_steady_cooldown():
    orders = stage_op_orders("1f1b", 4, 1, 6, 4)
    as_text = [" ".join(f"{KIND_NAMES[k]}{mb}" for k, mb, _ in o) for o in orders]
    assert as_text[0] == "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5"
    assert as_text[1] == "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4 B5"
    assert as_text[3] == "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5"
    # warmup clamped to m
    assert [k for k, _, _ in stage_op_orders("1f1b", 8, 1, 2, 8)[0]] == [0, 0, 1, 1]


def test_interleaved_schedule_table_and_order_match_megatron_docstring():
    # megatron-core convert_schedule_table_to_order's example: PP2, N3 (group), M5, VP2.
    table = schedule_table(5, 2, 3)
    assert [mb for mb, _ in table] == [0, 1, 2, 0, 1, 2, 3, 4, 3, 4]
    assert [c for _, c in table] == [0, 0, 0, 1, 1, 1, 0, 0, 1, 1]
    # Rank 0 has (2-0-1)*2 + (2-1)*3 = 5 warmup microbatches; the docstring's order
    # (+c: forward of chunk c-1; -c: backward of chunk c-1, 1-indexed):
    order = stage_op_orders("interleaved", 2, 2, 5, 3)[0]
    enc = [c + 1 if k == 0 else -(c + 1) for k, _, c in order]
    assert enc == [1, 1, 1, 2, 2, 2, -2, 1, -2, 1, -2, 2, -1, 2, -1, -1, -2, -2, -1, -1]


def test_every_op_once_per_stage():
    for sched, v, kinds in (("1f1b", 1, 2), ("interleaved", 3, 2), ("zb", 1, 3)):
        p, m = 4, 8
        for order in stage_op_orders(sched, p, v, m, p):
            assert len(order) == len(set(order)) == kinds * v * m


def test_deadlocking_orders_are_reported():
    # Two stages each waiting on the other's second op.
    plans = [[(0, 3, 0, 0, 0), (1, 4, 0, 0, 0)], [(2, 1, 0, 0, 1), (3, 4, 0, 0, 1)]]
    with pytest.raises(ValueError, match="deadlock"):
        _topological(plans, 4)


# ------------------------------------------------------------------ closed-form steps

@pytest.mark.parametrize("p,m", [(1, 1), (1, 7), (2, 2), (2, 5), (4, 4), (4, 8), (4, 2),
                                 (8, 1), (8, 16), (8, 64), (16, 512)])
@pytest.mark.parametrize("f,b", [(1.0, 2.0), (0.013, 0.029)])
def test_uniform_1f1b_step_is_m_plus_p_minus_1_times_f_plus_b(p, m, f, b):
    r = simulate(uniform("1f1b", p=p, m=m, f=f, b=b * 0.6, w=b * 0.4))
    assert r.step_s == pytest.approx((m + p - 1) * (f + b), rel=TIGHT)
    assert r.ideal_s == pytest.approx(m * (f + b), rel=TIGHT)
    assert r.bubble_fraction == pytest.approx((p - 1) / m, rel=TIGHT, abs=1e-12)


@pytest.mark.parametrize("p,v,m", [(2, 2, 2), (2, 3, 6), (4, 2, 8), (4, 4, 4), (4, 3, 12),
                                   (8, 8, 192), (8, 2, 16), (4, 1, 8), (16, 2, 32)])
def test_uniform_interleaved_bubble_is_p_minus_1_over_v_m(p, v, m):
    f, b = 1.3, 2.9
    r = simulate(uniform("interleaved", p=p, v=v, m=m, f=f / v, b=b / v))
    assert r.step_s == pytest.approx((m + (p - 1) / v) * (f + b), rel=TIGHT)
    assert r.bubble_fraction == pytest.approx((p - 1) / (v * m), rel=1e-9)


@pytest.mark.parametrize("p,v,m,g", [(4, 2, 8, 8), (4, 2, 10, 5), (4, 3, 13, 9),
                                     (2, 2, 5, 3)])
def test_interleaved_custom_group_size(p, v, m, g):
    r = simulate(uniform("interleaved", p=p, v=v, m=m, f=1.0 / v, b=2.0 / v, g=g))
    assert r.bubble_fraction == pytest.approx((p - 1) / (v * m), rel=1e-9)


@given(p=st.integers(1, 12), m=st.integers(1, 40),
       f=st.floats(0.01, 5.0), b=st.floats(0.01, 5.0))
@PROP
def test_property_uniform_1f1b(p, m, f, b):
    r = simulate(uniform("1f1b", p=p, m=m, f=f, b=b))
    assert r.step_s == pytest.approx((m + p - 1) * (f + b), rel=TIGHT)


@given(p=st.integers(2, 8), v=st.integers(1, 6), k=st.integers(1, 6),
       f=st.floats(0.01, 5.0), b=st.floats(0.01, 5.0))
@PROP
def test_property_uniform_interleaved(p, v, k, f, b):
    m = k * p
    r = simulate(uniform("interleaved", p=p, v=v, m=m, f=f / v, b=b / v))
    assert r.bubble_fraction == pytest.approx((p - 1) / (v * m), rel=1e-9, abs=1e-12)
    assert r.step_s == pytest.approx((m + (p - 1) / v) * (f + b), rel=TIGHT)


@pytest.mark.parametrize("schedule", ["1f1b", "zb"])
def test_single_stage_is_m_times_f_plus_b(schedule):
    r = simulate(uniform(schedule, p=1, m=7, f=1.5, b=2.0, w=0.5, p2p=0.3))
    assert r.step_s == pytest.approx(7 * 4.0, rel=TIGHT)
    assert r.bubble_fraction == pytest.approx(0.0, abs=1e-12)
    assert r.bubble_s == (pytest.approx(0.0, abs=1e-12),)


@pytest.mark.parametrize("p,m", [(2, 2), (4, 4), (4, 8), (8, 16), (8, 64)])
@pytest.mark.parametrize("f,b,w", [(1.0, 1.0, 1.0), (1.0, 1.2, 0.8), (1.0, 2.0, 0.5)])
def test_zb_h1_bubble_below_1f1b(p, m, f, b, w):
    zb = simulate(uniform("zb", p=p, m=m, f=f, b=b, w=w))
    one = simulate(uniform("1f1b", p=p, m=m, f=f, b=b, w=w))
    assert zb.bubble_fraction < one.bubble_fraction
    assert one.step_s == pytest.approx((m + p - 1) * (f + b + w), rel=TIGHT)
    # ZB-H1's bubble (Qi et al. 2023): (p - 1) * (F + B - W) when W <= F + B, m >= p.
    assert zb.step_s == pytest.approx(m * (f + b + w) + (p - 1) * (f + b - w), rel=TIGHT)


# ----------------------------------------------------------- non-uniform properties

SCHEDULES = st.sampled_from(["1f1b", "interleaved", "zb"])


def _shape(schedule, p, v, k):
    if schedule == "interleaved":
        return max(p, 2), v, k * max(p, 2)
    return p, 1, k


@given(schedule=SCHEDULES, p=st.integers(1, 6), v=st.integers(1, 4), k=st.integers(1, 5),
       seed=st.integers(0, 2**32 - 1))
@PROP
def test_property_step_at_least_busiest_stage(schedule, p, v, k, seed):
    p, v, m = _shape(schedule, p, v, k)
    r = simulate(random_input(random.Random(seed), schedule, p, v, m))
    assert r.step_s >= r.ideal_s * (1 - 1e-12)
    assert r.ideal_s == max(r.busy_s)
    assert all(bs >= 0 for bs in r.bubble_s)
    for busy, bubble in zip(r.busy_s, r.bubble_s):
        assert busy + bubble == pytest.approx(r.step_s, rel=TIGHT)


@given(schedule=SCHEDULES, p=st.integers(1, 5), v=st.integers(1, 3), k=st.integers(1, 4),
       seed=st.integers(0, 2**32 - 1), extra=st.floats(0.0, 5.0))
@PROP
def test_property_slower_op_or_link_never_speeds_up(schedule, p, v, k, seed, extra):
    p, v, m = _shape(schedule, p, v, k)
    rng = random.Random(seed)
    inp = random_input(rng, schedule, p, v, m)
    base = simulate(inp).step_s
    field = rng.choice(["fwd_s", "bwd_input_s", "bwd_weight_s"])
    s, c = rng.randrange(p), rng.randrange(v)
    grid = [list(row) for row in getattr(inp, field)]
    grid[s][c] += extra
    slower = replace(inp, **{field: tuple(tuple(r) for r in grid)})
    assert simulate(slower).step_s >= base * (1 - 1e-12)
    if inp.p2p_s:
        links = list(inp.p2p_s)
        links[rng.randrange(len(links))] += extra
        assert simulate(replace(inp, p2p_s=tuple(links))).step_s >= base * (1 - 1e-12)
    wider = replace(inp, p2p_s=tuple(x + extra for x in inp.p2p_s))
    assert simulate(wider).step_s >= base * (1 - 1e-12)


@pytest.mark.parametrize("schedule", ["1f1b", "interleaved", "zb"])
def test_larger_scalar_p2p_never_decreases_step(schedule):
    v = 2 if schedule == "interleaved" else 1
    steps = [simulate(uniform(schedule, p=4, v=v, m=8, w=0.5, p2p=x)).step_s
             for x in (0.0, 0.01, 0.1, 0.5, 2.0)]
    assert steps == sorted(steps)
    assert steps[-1] > steps[0]


# -------------------------------------------------------------------- recorded events

def check_events(inp: ScheduleInput, r: ScheduleResult) -> None:
    p, v, m = inp.num_stages, inp.num_chunks, inp.num_microbatches
    eps = 1e-9
    lat = inp.p2p_s if isinstance(inp.p2p_s, tuple) else (inp.p2p_s,) * p
    ev = {(e.stage, e.kind, e.microbatch, e.chunk): e for e in r.events}
    kinds = "FBW" if inp.schedule == "zb" else "FB"
    assert len(ev) == len(r.events) == r.num_ops == len(kinds) * p * v * m
    for (s, kind, mb, c), e in ev.items():
        assert e.end_s >= e.start_s
        if kind == "F":
            if s > 0:
                assert e.start_s >= ev[s - 1, "F", mb, c].end_s + lat[s - 1] - eps
            elif c > 0:
                assert e.start_s >= ev[p - 1, "F", mb, c - 1].end_s + lat[p - 1] - eps
        elif kind == "B":
            assert e.start_s >= ev[s, "F", mb, c].end_s - eps
            if s < p - 1:
                assert e.start_s >= ev[s + 1, "B", mb, c].end_s + lat[s] - eps
            elif c < v - 1:
                assert e.start_s >= ev[0, "B", mb, c + 1].end_s + lat[p - 1] - eps
        else:
            assert e.start_s >= ev[s, "B", mb, c].end_s - eps
    for s in range(p):
        mine = sorted((e for e in r.events if e.stage == s), key=lambda e: e.start_s)
        for a, b in zip(mine, mine[1:]):
            assert b.start_s >= a.end_s - eps  # one stage never runs two ops at once
        assert sum(e.end_s - e.start_s for e in mine) == pytest.approx(r.busy_s[s], rel=1e-9)
    assert max(e.end_s for e in r.events) == pytest.approx(r.step_s, rel=TIGHT)


@pytest.mark.parametrize("schedule,p,v,m,g", [
    ("1f1b", 4, 1, 8, None), ("1f1b", 5, 1, 3, None), ("interleaved", 4, 3, 8, None),
    ("interleaved", 4, 2, 10, 5), ("zb", 4, 1, 8, None), ("zb", 6, 1, 4, None),
    ("1f1b", 1, 1, 3, None)])
def test_recorded_events_respect_dependencies(schedule, p, v, m, g):
    inp = random_input(random.Random(7), schedule, p, v, m, g)
    r = simulate(inp, record_events=True)
    assert r.step_s == simulate(inp).step_s
    assert simulate(inp).events is None
    check_events(inp, r)


@given(schedule=SCHEDULES, p=st.integers(1, 5), v=st.integers(1, 3), k=st.integers(1, 4),
       seed=st.integers(0, 2**32 - 1))
@settings(max_examples=30, deadline=None)
def test_property_recorded_events_respect_dependencies(schedule, p, v, k, seed):
    p, v, m = _shape(schedule, p, v, k)
    inp = random_input(random.Random(seed), schedule, p, v, m)
    check_events(inp, simulate(inp, record_events=True))


# ---------------------------------------------------------------------- validation

@pytest.mark.parametrize("kw,match", [
    (dict(num_microbatches=0), r"num_microbatches=0 .*>= 1"),
    (dict(num_stages=-1), r"num_stages=-1"),
    (dict(num_stages=2.0), r"num_stages=2.0"),
    (dict(schedule="gpipe"), r"schedule='gpipe' must be one of"),
    (dict(fwd_s=((1.0,), (-1.0,))), r"fwd_s\[1\]\[0\]=-1.0 .*>= 0"),
    (dict(bwd_input_s=((1.0,), (float("nan"),))), r"bwd_input_s\[1\]\[0\]=nan"),
    (dict(bwd_weight_s=((1.0,),)), r"bwd_weight_s=.*num_stages=2"),
    (dict(fwd_s=((1.0, 2.0), (1.0, 2.0))), r"fwd_s\[0\]=.*num_chunks=1"),
    (dict(p2p_s=-0.1), r"p2p_s=-0.1"),
    (dict(p2p_s=(0.1, 0.1, 0.1)), r"p2p_s=.*3 entries"),
    (dict(num_chunks=2), r"num_chunks=2 must be 1 for schedule='1f1b'"),
    (dict(microbatch_group_size=2), r"microbatch_group_size=2 must be None"),
])
def test_bad_input_names_field_value_and_rule(kw, match):
    base = dict(num_stages=2, num_chunks=1, num_microbatches=4, fwd_s=((1.0,), (1.0,)),
                bwd_input_s=((1.0,), (1.0,)), bwd_weight_s=((0.0,), (0.0,)), p2p_s=0.0,
                schedule="1f1b")
    base.update(kw)
    with pytest.raises(ValueError, match=match):
        ScheduleInput(**base)


@pytest.mark.parametrize("p,m,g,match", [
    (4, 2, None, r"num_microbatches=2 must be >= num_stages=4"),
    (4, 10, None, r"num_microbatches=10 must be a multiple of num_stages=4"),
    (4, 10, 3, r"microbatch_group_size=3 must be an integer in \[num_stages=4"),
    (4, 10, 11, r"microbatch_group_size=11"),
    (4, 10, 4, r"10 % 4 = 2 must be 0 or >= num_stages=4"),
    (1, 4, None, r"num_stages=1 must be >= 2"),
])
def test_interleaved_microbatch_rules(p, m, g, match):
    with pytest.raises(ValueError, match=match):
        uniform("interleaved", p=p, v=2, m=m, g=g)


def test_interleaved_needs_wrap_link_in_p2p_tuple():
    base = uniform("interleaved", p=3, v=2, m=3)
    with pytest.raises(ValueError, match=r"p2p_s=.*2 entries.*wrap-around"):
        replace(base, p2p_s=(0.1, 0.1))
    # the wrap-around link (last entry) is used: its latency shows up in the step
    zero = replace(base, p2p_s=(0.0, 0.0, 0.0))
    wrap = replace(base, p2p_s=(0.0, 0.0, 0.5))
    assert simulate(wrap).step_s > simulate(zero).step_s


def test_lists_are_normalised_to_tuples():
    inp = ScheduleInput(num_stages=2, num_chunks=1, num_microbatches=2,
                        fwd_s=[[1], [1]], bwd_input_s=[[2], [2]], bwd_weight_s=[[0], [0]],
                        p2p_s=[0.5], schedule="1f1b")
    assert inp.fwd_s == ((1.0,), (1.0,)) and inp.p2p_s == (0.5,)
    hash(inp)


def test_zero_cost_step_has_zero_bubble_fraction():
    r = simulate(uniform("1f1b", p=3, m=3, f=0.0, b=0.0))
    assert r.step_s == 0.0 and r.bubble_fraction == 0.0


# -------------------------------------------------------------------------- trace

@pytest.mark.parametrize("schedule,v", [("1f1b", 1), ("interleaved", 2), ("zb", 1)])
def test_chrome_trace_round_trips(schedule, v):
    inp = uniform(schedule, p=4, v=v, m=8, f=0.001, b=0.002, w=0.001, p2p=1e-4)
    r = simulate(inp, record_events=True)
    trace = json.loads(json.dumps(to_chrome_trace(r)))
    assert trace["displayTimeUnit"] == "ms"
    evs = trace["traceEvents"]
    ops = [e for e in evs if e["ph"] == "X" and e["cat"] != "bubble"]
    assert len(ops) == r.num_ops
    assert {e["cat"] for e in ops} == ({"forward", "backward", "weight"} if schedule == "zb"
                                       else {"forward", "backward"})
    names = {e["tid"]: e["args"]["name"] for e in evs if e["name"] == "thread_name"}
    assert names == {s: f"stage {s}" for s in range(4)}
    first = next(e for e in ops if e["tid"] == 1 and e["args"]["microbatch"] == 3)
    assert first["name"] == "F mb3 c0" and first["args"]["chunk"] == 0
    for s in range(4):
        bubble_us = sum(e["dur"] for e in evs
                        if e["ph"] == "X" and e["cat"] == "bubble" and e["tid"] == s)
        assert bubble_us == pytest.approx(r.bubble_s[s] * 1e6, rel=1e-6, abs=1e-6)


def test_chrome_trace_needs_events_and_matching_names():
    r = simulate(uniform("1f1b", p=2, m=2))
    with pytest.raises(ValueError, match="record_events=True"):
        to_chrome_trace(r)
    r = simulate(uniform("1f1b", p=2, m=2), record_events=True)
    with pytest.raises(ValueError, match="names="):
        to_chrome_trace(r, names=["only one"])
    trace = to_chrome_trace(r, names=["embed+L0-3", "L4-7+loss"])
    assert [e["args"]["name"] for e in trace["traceEvents"]
            if e["name"] == "thread_name"] == ["embed+L0-3", "L4-7+loss"]
