"""The schedule's fast path (project/schedule_fast*.py) against the event simulation.

The event simulation (``schedule.simulate``) times every op of the megatron-core orders
in dependency order; the fast path must give its step time on every shape, with uneven
stage and chunk times and p2p gaps (a scalar or one per link), and must hand the shapes
it does not cover back to it.
"""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from primus_ext.project.schedule import ScheduleInput, simulate
from primus_ext.project.schedule_fast import fast_step_s, simulate_fast

REL = 1e-9  # float rounding only: the two sum the same op costs in another order


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= REL * max(abs(b), 1e-12)


@st.composite
def shapes(draw, long: bool = False):
    sched = draw(st.sampled_from(["1f1b", "interleaved", "zb"]))
    p = draw(st.sampled_from([1, 2, 3, 4, 5, 8]) if sched != "interleaved"
             else st.sampled_from([2, 3, 4, 5, 8]))
    v = draw(st.integers(1, 4)) if sched == "interleaved" else 1
    top = (40 if long else 6) * p
    g = None
    if sched == "interleaved":
        m = draw(st.integers(p, top))
        kind = draw(st.sampled_from(["default", "one", "custom"]))
        if kind == "one" or (kind == "default" and m % p):
            g = m  # one group, as estimate.py asks for when pp does not divide m
        elif kind == "custom":
            g = draw(st.integers(p, m))
            if 0 < m % g < p:
                g = m
    else:
        m = draw(st.integers(1, top))
    uniform = draw(st.booleans())
    cost = st.floats(0.0, 3.0, allow_nan=False) if not uniform else st.just(1.0)

    def grid():
        return tuple(tuple(draw(cost) for _ in range(v)) for _ in range(p))
    lat_kind = draw(st.sampled_from(["zero", "scalar", "links"]))
    if lat_kind == "zero":
        lat = 0.0
    elif lat_kind == "scalar":
        lat = draw(st.floats(0.0, 1.0))
    else:
        n = p if sched == "interleaved" and v > 1 else max(p - 1, 1)
        lat = tuple(draw(st.floats(0.0, 1.0)) for _ in range(n))
    return ScheduleInput(num_stages=p, num_chunks=v, num_microbatches=m, fwd_s=grid(),
                         bwd_input_s=grid(), bwd_weight_s=grid(), p2p_s=lat,
                         schedule=sched, microbatch_group_size=g)


def _covered(inp: ScheduleInput) -> bool:
    """The shapes the fast path takes (the rest are short: the event simulation)."""
    p, v, m = inp.num_stages, inp.num_chunks, inp.num_microbatches
    if inp.schedule == "interleaved":
        return (p - 1) * 2 + (v - 1) * inp.group_size <= m * v
    return m >= p


SETTINGS = settings(max_examples=300, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@SETTINGS
@given(shapes())
def test_fast_path_equals_event_simulation(inp):
    fast = fast_step_s(inp)
    assert (fast is not None) == _covered(inp)
    if fast is not None:
        assert _close(fast, simulate(inp).step_s), (fast, simulate(inp).step_s)


@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(shapes(long=True))
def test_fast_path_equals_event_simulation_on_long_steps(inp):
    """Long steps: the periodic jump skips most of the steady phase."""
    fast = fast_step_s(inp)
    assert (fast is not None) == _covered(inp)
    if fast is not None:
        assert _close(fast, simulate(inp).step_s)


def _uneven(p, v, m, sched, g=None, lat=0.3):
    # A slow middle stage, a slow first chunk: the steady state is set by one stage
    # while the others wait (and the wrap-around link carries a gap).
    f = tuple(tuple(1.0 + (s == p // 2) * 0.7 + (c == 0) * 0.4 for c in range(v))
              for s in range(p))
    b = tuple(tuple(2 * x for x in row) for row in f)
    w = tuple(tuple(0.5 * x for x in row) for row in f)
    n = p if sched == "interleaved" and v > 1 else p - 1
    return ScheduleInput(num_stages=p, num_chunks=v, num_microbatches=m, fwd_s=f,
                         bwd_input_s=b, bwd_weight_s=w,
                         p2p_s=tuple(lat * (1 + i % 3) for i in range(n)), schedule=sched,
                         microbatch_group_size=g)


@pytest.mark.parametrize("inp", [
    _uneven(8, 8, 192, "interleaved"),  # the Llama 3.1 405B shape of bench_project.py
    _uneven(8, 8, 193, "interleaved", g=193),  # m % pp != 0: one microbatch group
    _uneven(8, 4, 200, "interleaved", g=20),  # a custom group size
    _uneven(16, 1, 129, "1f1b"),  # the DeepSeek-V3 shape
    _uneven(16, 1, 129, "zb"),
])
def test_reference_shapes(inp):
    assert _close(fast_step_s(inp), simulate(inp).step_s)


def test_one_group_inputs_that_catch_up_stop_the_jump():
    """One microbatch group: the last chunk (cheap) runs ahead of the previous chunk's
    forwards (slow) that feed stage 0, and looks periodic before they catch up with it.
    Jumping there would miss the wait (step 114.142 instead of 114.153)."""
    inp = ScheduleInput(num_stages=2, num_chunks=2, num_microbatches=17,
                        fwd_s=((4.67, 0.011), (6.24, 0.0)),
                        bwd_input_s=((0.0, 0.0), (0.07, 0.0)),
                        bwd_weight_s=((0.0, 0.0), (0.116, 0.0)), p2p_s=(0.0, 0.23),
                        schedule="interleaved", microbatch_group_size=17)
    assert _close(fast_step_s(inp), simulate(inp).step_s)
    assert _close(fast_step_s(inp), 114.153)


@pytest.mark.parametrize("inp", [
    ScheduleInput.uniform(num_stages=8, num_microbatches=5, fwd_s=1.0, bwd_input_s=2.0),
    ScheduleInput.uniform(num_stages=8, num_microbatches=3, fwd_s=1.0, bwd_input_s=2.0,
                          bwd_weight_s=1.0, schedule="zb"),
    # warmup (pp - 1) * 2 + (vpp - 1) * m is clamped to m * vpp by megatron-core
    ScheduleInput.uniform(num_stages=8, num_microbatches=9, fwd_s=1.0, bwd_input_s=2.0,
                          num_chunks=2, schedule="interleaved", microbatch_group_size=9),

    # fill-drain (torchtitan's GPipe): no fast path; all forwards before any backward
    ScheduleInput.uniform(num_stages=4, num_microbatches=16, fwd_s=1.0, bwd_input_s=2.0,
                          schedule="fill_drain"),
])
def test_shapes_without_fast_path_fall_back_to_the_event_simulation(inp):
    assert fast_step_s(inp) is None
    assert simulate_fast(inp) == simulate(inp)


def test_dispatch_returns_the_event_simulation_result():
    inp = _uneven(4, 2, 24, "interleaved")
    fast, full = simulate_fast(inp), simulate(inp)
    assert full.events is None and fast.events is None
    for field in ("schedule", "num_stages", "num_chunks", "num_microbatches", "busy_s",
                  "ideal_s", "num_ops"):
        assert getattr(fast, field) == getattr(full, field), field
    assert _close(fast.step_s, full.step_s)
    assert _close(fast.bubble_fraction + 1, full.bubble_fraction + 1)
    # events are the event simulation's own, op by op
    rec = simulate_fast(inp, record_events=True)
    assert rec == simulate(inp, record_events=True) and len(rec.events) == rec.num_ops
