"""Step time of a pipeline schedule without the event simulation's op-by-op pass.

``fast_step_s(inp)`` returns the same step time as ``schedule.simulate(inp).step_s``
(to float rounding), or None where no fast path applies; the caller then runs the event
simulation. Two ideas make it fast:

1. No dependency sort. Every op is given a global step number such that each cross-stage
   dependency comes from an earlier step, so one pass over the steps in order, each
   stage in turn, times every op (the event simulation sorts its ops first, which is
   what makes a never-seen shape slow). Dependencies on the same stage (the weight-grad
   W on its own B, the loss backward on its forward) are implied by the stage's order
   and dropped.

   * 1F1B and ZB-H1: cycle i holds stage r's forward F(i + pp - 1 - r) and its backward
     B(i) (ZB-H1: and maybe a W). Forwards are timed in stage order (F at stage r waits
     for stage r-1's forward of the previous cycle), backwards in reverse stage order
     (B at stage r waits for stage r+1's B of the same cycle).
   * Interleaved (``schedule_fast_interleaved``): stage r's k-th (forward, backward)
     pair runs at step k - r; a forward waits on stage r-1 one step back, a backward on
     stage r+1 one step back, the wrap-around links ``group - pp + 1`` steps back. With
     one microbatch group (``group = m``) the forwards of chunks 0..vpp-2 and the
     backwards after the last chunk are runs of equal ops, timed a run at a time.

2. Periodic jump. In the steady phase each step (cycle) applies the same max-plus map
   to the state (end times the later ops read), and a max-plus map commutes with adding
   a constant. So as soon as the state at step t equals the state at step t - P plus one
   constant shift for every entry (P a period of the step templates), the state at step
   t + qP is that state plus q shifts, exactly, for as long as the templates repeat:
   the pass jumps there and continues. This is the cyclicity of max-plus linear systems
   (Baccelli, Cohen, Olsder, Quadrat, "Synchronization and Linearity", 1992, ch. 3);
   no period is assumed: where none shows up, every step is timed.
"""
from __future__ import annotations

from primus_ext.project.schedule import ScheduleInput, ScheduleResult, result_of, simulate
from primus_ext.project.schedule_fast_interleaved import (PERIODS, shift, step_interleaved,
                                                          step_one_group)

_STEPS: dict = {}  # ScheduleInput -> step_s: a spec projected again reuses its step


def simulate_fast(inp: ScheduleInput, *, record_events: bool = False) -> ScheduleResult:
    """``simulate(inp)``, through the fast path where one applies (the event simulation
    where none does, and when the events are wanted: drawing them is its job)."""
    if record_events:
        return simulate(inp, record_events=True)
    step = _STEPS.get(inp)
    if step is None:
        step = fast_step_s(inp)
        if step is None:
            step = simulate(inp).step_s
        if len(_STEPS) >= 4096:
            _STEPS.clear()
        _STEPS[inp] = step
    return result_of(inp, step)


def fast_step_s(inp: ScheduleInput) -> float | None:
    """The event simulation's step time, or None when no fast path applies."""
    p, v, m = inp.num_stages, inp.num_chunks, inp.num_microbatches
    lats = _links(inp)
    if inp.schedule in ("1f1b", "zb"):
        if m < p:
            return None  # warmup min(pp - r - 1, m) clamped: a short step anyway
        zb = inp.schedule == "zb"
        f = [row[0] for row in inp.fwd_s]
        if zb:
            b = [row[0] for row in inp.bwd_input_s]
            w = [row[0] for row in inp.bwd_weight_s]
        else:
            b = [x[0] + y[0] for x, y in zip(inp.bwd_input_s, inp.bwd_weight_s)]
            w = None
        return _step_1f1b(p, m, f, b, w, lats)
    if inp.schedule != "interleaved":
        return None  # fill-drain (GPipe) and any other order: the event simulation
    g = inp.group_size
    if (p - 1) * 2 + (v - 1) * g > m * v:
        return None  # warmup clamped by megatron-core: other step offsets
    f = inp.fwd_s
    b = [[x + y for x, y in zip(rx, ry)] for rx, ry in zip(inp.bwd_input_s,
                                                           inp.bwd_weight_s)]
    if g == m:
        return step_one_group(p, v, m, f, b, lats)
    return step_interleaved(p, v, m, g, f, b, lats)


def _links(inp: ScheduleInput) -> list[float]:
    p2p, p = inp.p2p_s, inp.num_stages
    lats = list(p2p) if isinstance(p2p, tuple) else [p2p] * p
    return lats + [0.0] * (p - len(lats))


def _step_1f1b(p, m, f, b, w, lat) -> float:
    # Orders of schedule_order._order_1f1b / _order_zb with m >= pp (no warmup clamp).
    warm = [p - r - 1 for r in range(p)]
    free = [0.0] * p
    fend = [0.0] * p  # forward end of the previous cycle, per stage
    # Steady cycles: every stage runs F and B (and W for ZB-H1, from cycle r on).
    lo, hi = (p - 1 if w else 0), m - p + 1
    seen: dict[int, list] = {}
    i = -(p - 1)
    while i < m:
        cur = fend[:]
        for r in range(p):
            if -warm[r] <= i < m - warm[r]:
                t = free[r]
                if r:
                    d = fend[r - 1] + lat[r - 1]
                    if d > t:
                        t = d
                t += f[r]
                free[r] = cur[r] = t
        fend = cur
        if i >= 0:
            nxt = 0.0
            for r in range(p - 1, -1, -1):
                t = free[r]
                if r < p - 1:
                    d = nxt + lat[r]
                    if d > t:
                        t = d
                t += b[r]
                nxt = t
                if w is not None and (i >= r or warm[r] + i >= m):
                    t += w[r]
                free[r] = t
        if lo - 1 <= i < hi:
            state = fend + free
            seen[i] = state
            for c in PERIODS:
                old = seen.get(i - c)
                if old is None or i - c < lo - 1:
                    continue
                d = shift(state, old)
                if d is not None:
                    q = (hi - 1 - i) // c
                    if q > 0:
                        fend = [x + q * d for x in fend]
                        free = [x + q * d for x in free]
                        i += q * c
                        seen.clear()
                    break
        i += 1
    if w is not None:  # ZB-H1: the W's held back run at the end of each stage
        for r in range(p):
            free[r] += min(r, m - warm[r]) * w[r]
    return max(free)
