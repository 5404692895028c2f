"""Event simulation of megatron-core pipeline schedules over one training step.

Schedules (``ScheduleInput.schedule``):

* ``1f1b``: ``forward_backward_pipelining_without_interleaving``.
* ``interleaved``: ``forward_backward_pipelining_with_interleaving`` with vpp model
  chunks per stage, ordered by ``get_schedule_table`` / ``get_model_chunk_id`` /
  ``get_pp_rank_microbatches`` (see ``schedule_order``).
* ``zb``: ZB-H1 zero-bubble (backward split into B = input grad and W = weight grad).

Timing model. Each stage is one compute stream that runs its ops in the fixed order of
the schedule; an op starts at max(stage free, every dependency's end + its p2p
latency). Dependencies: F(stage s, chunk c) needs F(s-1, c), and F(0, c) needs
F(pp-1, c-1) over the wrap-around link; B(s, c) needs B(s+1, c), B(pp-1, c) needs
B(0, c+1) over the wrap-around link, and B(pp-1, vpp-1) needs its own F (the loss);
W needs its own B. A p2p transfer only delays the op that consumes it: it does not
occupy the compute stream of either side, and a sender is never blocked waiting for its
receiver. megatron-core's blocking ``send_forward_recv_backward`` pairs can couple the
two sides a little more than this; we leave that out so that step time stays a
max-plus (monotone) function of the op and link costs.

Bubble. ``bubble_s[s] = step_s - busy_s[s]`` (idle time of stage s inside the step);
``ideal_s = max(busy_s)`` (the busiest stage's compute time, a lower bound on the step);
``bubble_fraction = (step_s - ideal_s) / ideal_s`` (0 when ideal_s is 0). For uniform
stages and free p2p this is (pp-1)/m for 1f1b and (pp-1)/(vpp*m) for interleaved.

The projector times steps with ``schedule_fast.simulate_fast``: the same step time
without building the op order; this simulation draws the timeline, takes the shapes the
fast path leaves, and is what the fast path is tested against.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from primus_ext.project.schedule_order import KIND_NAMES, SCHEDULE_NAMES, compiled_plan

_OWNER = "schedule_input"


class ScheduleEvent(NamedTuple):
    stage: int
    kind: str  # 'F' | 'B' | 'W'
    microbatch: int
    chunk: int
    start_s: float
    end_s: float


def _times(name: str, value, p: int, v: int) -> tuple[tuple[float, ...], ...]:
    if not isinstance(value, (tuple, list)) or len(value) != p:
        raise ValueError(f"{_OWNER}.{name}={value!r} must be a tuple of num_stages={p} "
                         f"tuples of num_chunks={v} seconds each")
    rows = []
    for s, row in enumerate(value):
        if not isinstance(row, (tuple, list)) or len(row) != v:
            raise ValueError(f"{_OWNER}.{name}[{s}]={row!r} must be a tuple of "
                             f"num_chunks={v} seconds")
        for c, x in enumerate(row):
            _seconds(f"{name}[{s}][{c}]", x)
        rows.append(tuple(float(x) for x in row))
    return tuple(rows)


def _seconds(name: str, x) -> None:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not (
            math.isfinite(x) and x >= 0):
        raise ValueError(f"{_OWNER}.{name}={x!r} must be a finite number of seconds >= 0")


@dataclass(frozen=True, kw_only=True, slots=True)
class ScheduleInput:
    """One pipeline step to simulate. Times are seconds per microbatch.

    fwd_s / bwd_input_s / bwd_weight_s: [stage][chunk]. For 1f1b and interleaved the
    backward runs input and weight grads back to back (cost = their sum); zb splits them.
    p2p_s: one latency for every link, or a tuple per link: entry s (s < pp-1) is the
    link stage s <-> s+1; entry pp-1 is the wrap-around link last stage -> first stage,
    needed (and then required) only by interleaved with vpp > 1. Length pp-1 or pp.
    microbatch_group_size: megatron-core's ``microbatch_group_size_per_vp_stage``
    (interleaved only; None = pp, its default).
    """
    num_stages: int
    num_chunks: int
    num_microbatches: int
    fwd_s: tuple[tuple[float, ...], ...]
    bwd_input_s: tuple[tuple[float, ...], ...]
    bwd_weight_s: tuple[tuple[float, ...], ...]
    p2p_s: float | tuple[float, ...]
    schedule: str
    microbatch_group_size: int | None = None

    def __post_init__(self) -> None:
        for name in ("num_stages", "num_chunks", "num_microbatches"):
            x = getattr(self, name)
            if isinstance(x, bool) or not isinstance(x, int) or x < 1:
                raise ValueError(f"{_OWNER}.{name}={x!r} must be an integer >= 1")
        p, v, m = self.num_stages, self.num_chunks, self.num_microbatches
        if self.schedule not in SCHEDULE_NAMES:
            raise ValueError(f"{_OWNER}.schedule={self.schedule!r} must be one of "
                             + ", ".join(repr(s) for s in SCHEDULE_NAMES))
        if self.schedule != "interleaved" and v != 1:
            raise ValueError(f"{_OWNER}.num_chunks={v} must be 1 for schedule="
                             f"{self.schedule!r} (model chunks need 'interleaved')")
        g = self.microbatch_group_size
        if self.schedule == "interleaved":
            _check_interleaved(p, m, g)
        elif g is not None:
            raise ValueError(f"{_OWNER}.microbatch_group_size={g!r} must be None for "
                             f"schedule={self.schedule!r} (interleaved only)")
        for name in ("fwd_s", "bwd_input_s", "bwd_weight_s"):
            object.__setattr__(self, name, _times(name, getattr(self, name), p, v))
        object.__setattr__(self, "p2p_s", self._normalised_p2p())

    def _normalised_p2p(self) -> float | tuple[float, ...]:
        p2p, p = self.p2p_s, self.num_stages
        if not isinstance(p2p, (tuple, list)):
            _seconds("p2p_s", p2p)
            return float(p2p)
        wrap = self.schedule == "interleaved" and self.num_chunks > 1
        allowed = (p,) if wrap and p > 1 else (p - 1, p)
        if len(p2p) not in allowed:
            rule = ("num_stages entries (links s->s+1, then the wrap-around link), "
                    "as interleaved with num_chunks > 1 uses the wrap-around link" if wrap
                    else "num_stages-1 entries (one per link s->s+1), or num_stages")
            raise ValueError(f"{_OWNER}.p2p_s={p2p!r} has {len(p2p)} entries; it must "
                             f"have {rule}")
        for i, x in enumerate(p2p):
            _seconds(f"p2p_s[{i}]", x)
        return tuple(float(x) for x in p2p)

    @property
    def group_size(self) -> int:
        """The microbatch group size in effect (interleaved), else num_stages."""
        g = self.microbatch_group_size
        return self.num_stages if g is None else g

    @classmethod
    def uniform(cls, *, num_stages: int, num_microbatches: int, fwd_s: float,
                bwd_input_s: float, bwd_weight_s: float = 0.0, num_chunks: int = 1,
                p2p_s: float = 0.0, schedule: str = "1f1b",
                microbatch_group_size: int | None = None) -> "ScheduleInput":
        """Every stage and chunk costs the same (the per-chunk times are given)."""
        ok = all(isinstance(n, int) and not isinstance(n, bool) and n >= 1
                 for n in (num_stages, num_chunks))
        rows, cols = (num_stages, num_chunks) if ok else (0, 0)  # __post_init__ reports
        def grid(x: float) -> tuple:
            return tuple((x,) * cols for _ in range(rows))
        return cls(num_stages=num_stages, num_chunks=num_chunks,
                   num_microbatches=num_microbatches, fwd_s=grid(fwd_s),
                   bwd_input_s=grid(bwd_input_s), bwd_weight_s=grid(bwd_weight_s),
                   p2p_s=p2p_s, schedule=schedule,
                   microbatch_group_size=microbatch_group_size)


def _check_interleaved(p: int, m: int, g: int | None) -> None:
    # forward_backward_pipelining_with_interleaving checks: pp <= group size <= m, and
    # the last group is empty or holds >= pp microbatches (else megatron-core raises:
    # it would introduce dependency bubbles).
    if p < 2:
        raise ValueError(f"{_OWNER}.num_stages={p} must be >= 2 for schedule="
                         "'interleaved' (megatron-core does not pipeline pp=1)")
    if m < p:
        raise ValueError(f"{_OWNER}.num_microbatches={m} must be >= num_stages={p} for "
                         "schedule='interleaved'")
    if g is None:
        if m % p:
            raise ValueError(
                f"{_OWNER}.num_microbatches={m} must be a multiple of num_stages={p} for "
                "schedule='interleaved' with the default microbatch_group_size (=pp): "
                "megatron-core rejects a last microbatch group smaller than pp; set "
                "microbatch_group_size to a value in [pp, m] with m % size == 0 or "
                ">= pp")
        return
    if isinstance(g, bool) or not isinstance(g, int) or not p <= g <= m:
        raise ValueError(f"{_OWNER}.microbatch_group_size={g!r} must be an integer in "
                         f"[num_stages={p}, num_microbatches={m}]")
    if 0 < m % g < p:
        raise ValueError(f"{_OWNER}.microbatch_group_size={g}: num_microbatches={m} % "
                         f"{g} = {m % g} must be 0 or >= num_stages={p}")


@dataclass(frozen=True, kw_only=True, slots=True)
class ScheduleResult:
    """Simulated step. See the module docstring for the bubble definition."""
    schedule: str
    num_stages: int
    num_chunks: int
    num_microbatches: int
    step_s: float
    busy_s: tuple[float, ...]
    bubble_s: tuple[float, ...]
    ideal_s: float
    bubble_fraction: float
    num_ops: int
    events: tuple[ScheduleEvent, ...] | None = None


def simulate(inp: ScheduleInput, *, record_events: bool = False) -> ScheduleResult:
    """Time one step of `inp.schedule`; with record_events, also every op's interval
    (events listed stage by stage, each stage in its execution order)."""
    p, v, m = inp.num_stages, inp.num_chunks, inp.num_microbatches
    columns, num_slots = compiled_plan(inp.schedule, p, v, m, inp.group_size)
    # Flat per-(kind, stage, chunk) costs, indexed like compiled_plan's cost_idx.
    fwd = [x for row in inp.fwd_s for x in row]
    if inp.schedule == "zb":
        bwd = [x for row in inp.bwd_input_s for x in row]
    else:  # megatron-core's backward_step computes input and weight grads together
        bwd = [a + b for ra, rb in zip(inp.bwd_input_s, inp.bwd_weight_s)
               for a, b in zip(ra, rb)]
    costs = fwd + bwd + [x for row in inp.bwd_weight_s for x in row]
    p2p = inp.p2p_s
    lats = list(p2p) if isinstance(p2p, tuple) else [p2p] * p
    lats += [0.0] * (p - len(lats))  # wrap-around entry, unused when not given
    lats.append(0.0)  # lat_idx p: no transfer

    # One pass in dependency order (see compiled_plan): an op starts when its stage is
    # free and its input has arrived (dependency end + p2p latency).
    end = [0.0] * (num_slots + 1)
    free = [0.0] * p
    if record_events:
        events = _timed_events(columns, end, free, costs, lats, p, v, m)
    else:
        events = None
        for slot, dep, lat, ci, s in zip(*columns):
            t = free[s]
            e = end[dep] + lats[lat]
            if e > t:
                t = e
            t += costs[ci]
            free[s] = t
            end[slot] = t
    return result_of(inp, max(free), events=events, num_ops=len(columns[0]))


def result_of(inp: ScheduleInput, step_s: float, *, events: tuple | None = None,
              num_ops: int | None = None) -> ScheduleResult:
    """The ScheduleResult of ``inp`` for a step time (busy, bubble, ideal follow)."""
    p, v, m = inp.num_stages, inp.num_chunks, inp.num_microbatches
    busy = tuple(m * (sum(inp.fwd_s[s]) + sum(inp.bwd_input_s[s]) + sum(inp.bwd_weight_s[s]))
                 for s in range(p))
    ideal_s = max(busy)
    if num_ops is None:
        num_ops = (3 if inp.schedule == "zb" else 2) * v * p * m
    return ScheduleResult(
        schedule=inp.schedule, num_stages=p, num_chunks=v, num_microbatches=m,
        step_s=step_s, busy_s=busy, bubble_s=tuple(max(step_s - b, 0.0) for b in busy),
        ideal_s=ideal_s, bubble_fraction=(step_s - ideal_s) / ideal_s if ideal_s > 0 else 0.0,
        num_ops=num_ops, events=events)


def _timed_events(columns, end, free, costs, lats, p, v, m) -> tuple:
    # Same pass as simulate's, also keeping every op's start; kept apart so the hot loop
    # has no branch on record_events.
    per_stage = [[] for _ in range(p)]
    for slot, dep, lat, ci, s in zip(*columns):
        t = free[s]
        e = end[dep] + lats[lat]
        if e > t:
            t = e
        t1 = t + costs[ci]
        free[s] = t1
        end[slot] = t1
        rest, mb = divmod(slot, m)
        rest //= p
        kind, c = divmod(rest, v)
        per_stage[s].append(ScheduleEvent(s, KIND_NAMES[kind], mb, c, t, t1))
    return tuple(ev for stage_events in per_stage for ev in stage_events)
