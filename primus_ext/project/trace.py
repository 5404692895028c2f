"""Chrome trace export of a simulated pipeline step.

The output is the Trace Event Format that chrome://tracing and https://ui.perfetto.dev
load: one thread (tid) per pipeline stage, one complete ("X") event per op, times in
microseconds. Idle gaps of a stage inside the step are added as "bubble" events.

A long pipeline (hundreds of thousands of microbatches) would make a trace of hundreds of
megabytes that no viewer opens: at most ``max_events`` ops are drawn, the earliest ones
(the warm-up and the first steady-state microbatches, where the schedule's shape shows),
and the trace says so in its ``primus_ext`` entry and with a marker at the cut.
"""
from __future__ import annotations

from typing import Sequence

from primus_ext.project.schedule import ScheduleResult

_CATEGORY = {"F": "forward", "B": "backward", "W": "weight"}
_US_PER_S = 1e6
# Gaps shorter than this are float noise from summing op times, not idle time.
_MIN_BUBBLE_S = 1e-12
# About 25 MB of JSON: what chrome://tracing and Perfetto load in a few seconds.
MAX_EVENTS = 100_000


def to_chrome_trace(result: ScheduleResult, names: Sequence[str] | None = None,
                    max_events: int | None = MAX_EVENTS) -> dict:
    """``{"traceEvents": [...], "displayTimeUnit": "ms"}`` for `result`.

    `result` must come from ``simulate(..., record_events=True)``. `names` optionally
    names the stages' threads (default "stage N"). Op events are named like
    "F mb3 c1" with cat forward / backward / weight and args microbatch, chunk, stage;
    bubbles have cat "bubble" and args stage. ``max_events``: the most ops drawn (None:
    all); ``trace["primus_ext"]`` says how many were drawn of how many.
    """
    if result.events is None:
        raise ValueError("result.events=None: the trace needs the op intervals; run "
                         "simulate(..., record_events=True)")
    p = result.num_stages
    if names is None:
        names = [f"stage {s}" for s in range(p)]
    elif isinstance(names, str) or len(names) != p:
        raise ValueError(f"names={names!r} must be a sequence of num_stages={p} strings")
    names = [str(n) for n in names]

    trace = [{"name": "process_name", "ph": "M", "pid": 0, "tid": 0,
              "args": {"name": f"pipeline {result.schedule}"}}]
    for s in range(p):
        trace.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": s,
                      "args": {"name": names[s]}})
        trace.append({"name": "thread_sort_index", "ph": "M", "pid": 0, "tid": s,
                      "args": {"sort_index": s}})

    events, end_s = result.events, result.step_s
    info = {"ops_drawn": len(events), "ops_total": len(events), "truncated": False}
    if max_events is not None and len(events) > max_events:
        if max_events < 1:
            raise ValueError(f"max_events={max_events!r} must be a positive integer or None")
        end_s = sorted(ev.start_s for ev in events)[max_events]
        events = [ev for ev in events if ev.start_s < end_s]
        info = {"ops_drawn": len(events), "ops_total": len(result.events),
                "truncated": True, "drawn_until_s": end_s, "step_s": result.step_s}
        trace.append({"name": f"trace cut here: {len(events):,} of "
                              f"{len(result.events):,} ops drawn", "ph": "i", "s": "g",
                      "pid": 0, "tid": 0, "ts": end_s * _US_PER_S})
    by_stage: list[list] = [[] for _ in range(p)]
    for ev in events:
        by_stage[ev.stage].append(ev)
        trace.append({
            "name": f"{ev.kind} mb{ev.microbatch} c{ev.chunk}", "cat": _CATEGORY[ev.kind],
            "ph": "X", "pid": 0, "tid": ev.stage, "ts": ev.start_s * _US_PER_S,
            "dur": (ev.end_s - ev.start_s) * _US_PER_S,
            "args": {"microbatch": ev.microbatch, "chunk": ev.chunk, "stage": ev.stage}})

    for s, evs in enumerate(by_stage):
        evs.sort(key=lambda e: e.start_s)
        t = 0.0
        for ev in evs + [None]:
            start = end_s if ev is None else ev.start_s
            if start - t > _MIN_BUBBLE_S:
                trace.append({"name": "bubble", "cat": "bubble", "ph": "X", "pid": 0,
                              "tid": s, "ts": t * _US_PER_S,
                              "dur": (start - t) * _US_PER_S, "args": {"stage": s}})
            if ev is not None:
                t = max(t, ev.end_s)
    return {"traceEvents": trace, "displayTimeUnit": "ms", "primus_ext": info}
