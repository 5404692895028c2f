"""The interleaved schedule's fast path (see ``schedule_fast``): a pass over global steps
with a periodic jump, and, for one microbatch group, a pass a run of ops at a time.

Step numbering (``forward_backward_pipelining_with_interleaving``, orders as in
``schedule_order``): stage r's k-th (forward, backward) pair, forward = table entry
k + warmup_r, backward = table entry k, runs at step k - r. Then a forward waits on
stage r-1 one step back (warmup_{r-1} = warmup_r + 2), a backward on stage r+1 one step
back, and the wrap-around links (stage 0's forward of chunk c on the last stage's of
chunk c-1, the last stage's backward of chunk c on stage 0's of chunk c+1) reach
``group - pp + 1`` steps back: every dependency is on an earlier step.
"""
from __future__ import annotations

import numpy as np

TOL = 1e-12  # relative: two states are "one shift apart" to this tolerance
PERIODS = (1, 2, 3, 4, 6)  # candidate periods, in template periods


def shift(a: list, b: list) -> float | None:
    """The constant c with a = b + c entrywise (to TOL), else None."""
    c = a[0] - b[0]
    tol = TOL * (abs(a[-1]) + abs(c) + 1e-300)
    for x, y in zip(a, b):
        if abs(x - y - c) > tol:
            return None
    return c


def step_interleaved(p, v, m, g, f, b, lat) -> float:
    # Groups of g microbatches (the last may be shorter, >= pp): table entry n runs
    # chunk (n mod g v) // g, and chunk c >= 1 waits on the entry one group size back.
    total = m * v
    gv = g * v
    nfull = m // g
    last = m - nfull * g  # size of a short last group (0 or >= pp)
    full_end = nfull * gv  # table index where the short last group starts
    warm = [(p - r - 1) * 2 + (v - 1) * g for r in range(p)]
    wrap = lat[p - 1]
    fh = [0.0] * total  # stage pp-1's forward ends, by table index
    bh = [0.0] * total  # stage 0's backward ends, by table index
    free = [0.0] * p
    fend = [0.0] * p  # previous step's ends, per stage
    bend = [0.0] * p
    lo, hi = 0, min(total, full_end) - warm[0]  # steady steps: periodic templates
    look = g - p + 1  # how far back (in steps) the wrap-around links read
    anchor = lo + look - 1  # first step whose state (with its look-back) is all steady
    seen: dict[int, list] = {}
    t = -warm[0]
    while t < total:
        fcur = fend[:]
        bcur = bend[:]
        for r in range(p):
            k = t + r
            n = k + warm[r]
            x = free[r]
            if 0 <= n < total:
                if n < full_end:
                    c, size = (n % gv) // g, g
                else:
                    c, size = (n - full_end) // last, last
                if r:
                    d = fend[r - 1] + lat[r - 1]
                    if d > x:
                        x = d
                elif c:
                    d = fh[n - size] + wrap
                    if d > x:
                        x = d
                x += f[r][c]
                fcur[r] = x
                if r == p - 1:
                    fh[n] = x
            if 0 <= k < total:
                if k < full_end:
                    c, size = (k % gv) // g, g
                else:
                    c, size = (k - full_end) // last, last
                if r < p - 1:
                    d = bend[r + 1] + lat[r]
                    if d > x:
                        x = d
                elif c:
                    d = bh[k - size] + wrap
                    if d > x:
                        x = d
                x += b[r][v - 1 - c]
                bcur[r] = x
                if r == 0:
                    bh[k] = x
            free[r] = x
        fend, bend = fcur, bcur
        if anchor <= t < hi and (t - anchor) % gv == 0:
            state = fend + bend + free + fh[t + p - look + warm[p - 1]:t + p + warm[p - 1]] \
                + bh[t + 1 - look:t + 1]
            seen[t] = state
            for c in PERIODS:
                old = seen.get(t - c * gv)
                if old is None or t - c * gv - look + 1 < lo:
                    continue
                d = shift(state, old)
                if d is not None:
                    q = (hi - 1 - t) // (c * gv)
                    if q > 0:
                        jump = q * c * gv
                        sh = q * d
                        fend = [x + sh for x in fend]
                        bend = [x + sh for x in bend]
                        free = [x + sh for x in free]
                        base = t + p - 1 + warm[p - 1]
                        for s in range(look):
                            fh[base - s + jump] = fh[base - s] + sh
                            bh[t - s + jump] = bh[t - s] + sh
                        t += jump
                        seen.clear()
                    break
        t += 1
    return max(free)


def _run(arr, cost: float, start: float, idx):
    """End times of a run of same-cost ops on one stage: op j starts when the stage is
    free and its input arr[j] has arrived (arr None: no input); the stage is free at
    `start`. end[j] = max(end[j-1], arr[j]) + cost unrolls to
    cost * j + cost + max(start, max_{i <= j} (arr[i] - cost * i))."""
    ramp = idx * cost
    if arr is None:
        ramp += start + cost
        return ramp
    out = np.subtract(arr, ramp)
    np.maximum(out, start, out=out)
    np.maximum.accumulate(out, out=out)
    out += ramp
    out += cost
    return out


def step_one_group(p, v, m, f, b, lat) -> float:
    # One microbatch group (megatron-core's microbatch_group_size = m): stage r runs the
    # forwards of chunks 0..v-2 for every microbatch, then 1F1B on chunk v-1 with
    # 2 (p - r - 1) warmup forwards, then the backwards of chunks v-2..0. The first and
    # last parts are runs of same-cost ops fed by one other run: timed a run at a time.
    idx = np.arange(m, dtype=float)
    wrap = lat[p - 1]
    free = [0.0] * p
    ends = None
    for c in range(v - 1):
        arr = None if c == 0 else ends + wrap
        for r in range(p):
            if r:
                arr = ends + lat[r - 1]
            ends = _run(arr, f[r][c], free[r], idx)
            free[r] = float(ends[-1])
    ext = None if v == 1 else (ends + wrap)
    b0 = _last_chunk(p, m, [row[v - 1] for row in f], [row[v - 1] for row in b], lat,
                     free, ext)
    for c in range(v - 2, -1, -1):
        for r in range(p - 1, -1, -1):
            arr = ends + lat[r] if r < p - 1 else b0 + wrap
            ends = _run(arr, b[r][c], free[r], idx)
            free[r] = float(ends[-1])
        b0 = ends
    return max(free)


def _arith_from(x) -> tuple[int, float]:
    """(a, d): x[i+1] - x[i] == d (to TOL) for every i >= a."""
    d = np.diff(x)
    if not len(d):
        return len(x), 0.0
    step = float(d[-1])
    bad = np.nonzero(np.abs(d - step) > TOL * (abs(float(x[-1])) + abs(step)))[0]
    return (int(bad[-1]) + 1 if len(bad) else 0), step


def _inputs_repeat(ext, shift_s: float, rise_s: float, waited: bool, tol: float) -> bool:
    # The steps after a period repeat the period's, shifted, if stage 0's inputs do
    # (ext rises by the shift over a period), or if ext, rising less, did not hold
    # stage 0 back during the period (then it never will: its lead only grows).
    if ext is None or abs(shift_s - rise_s) <= tol:
        return True
    return rise_s < shift_s and not waited


def _last_chunk(p, m, f, b, lat, free, ext):
    # 1F1B on the last chunk: stage r's pair k (forward 2 (p - r - 1) + k, backward k)
    # runs at step k - r; stage 0's forwards wait for `ext` (the previous chunk's
    # forwards on the last stage, plus the wrap-around link). Returns stage 0's backward
    # ends (the next chunk's inputs) and updates `free`.
    warm = [2 * (p - r - 1) for r in range(p)]
    b0 = [0.0] * m
    fend = [0.0] * p
    bend = [0.0] * p
    extl = None if ext is None else ext.tolist()
    tail, rate = (m, 0.0) if ext is None else _arith_from(ext)
    if ext is None:
        tail = 0
    hi = m - warm[0]  # steady steps: every stage runs a forward and a backward
    seen: dict[int, list] = {}
    waited = -warm[0] - 1  # the last step at which stage 0 waited for `ext`
    t = -warm[0]
    while t < m:
        fcur = fend[:]
        bcur = bend[:]
        for r in range(p):
            k = t + r
            n = k + warm[r]
            x = free[r]
            if 0 <= n < m:
                if r:
                    d = fend[r - 1] + lat[r - 1]
                    if d > x:
                        x = d
                elif extl is not None:
                    d = extl[n]
                    if d > x:
                        x = d
                        waited = t
                x += f[r]
                fcur[r] = x
            if 0 <= k < m:
                if r < p - 1:
                    d = bend[r + 1] + lat[r]
                    if d > x:
                        x = d
                x += b[r]
                bcur[r] = x
                if r == 0:
                    b0[k] = x
            free[r] = x
        fend, bend = fcur, bcur
        if 0 <= t < hi and t + warm[0] >= tail:
            state = fend + bend + free
            seen[t] = state
            for c in PERIODS:
                old = seen.get(t - c)
                if old is None:
                    continue
                d = shift(state, old)
                if d is None or not _inputs_repeat(ext, d, c * rate, waited > t - c,
                                                   TOL * (abs(state[-1]) + abs(d))):
                    continue
                q = (hi - 1 - t) // c
                if q > 0:
                    sh = q * d
                    fend = [x + sh for x in fend]
                    bend = [x + sh for x in bend]
                    for r in range(p):
                        free[r] += sh
                    for s in range(t + 1, t + q * c + 1):
                        b0[s] = b0[s - c] + d
                    t += q * c
                    seen.clear()
                break
        t += 1
    return np.asarray(b0)
