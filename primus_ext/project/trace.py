"""Chrome trace export of a simulated pipeline step.

The output is the Trace Event Format that chrome://tracing and https://ui.perfetto.dev
load: one thread (tid) per pipeline stage, one complete ("X") event per op, times in
microseconds. Idle gaps of a stage inside the step are added as "bubble" events.
"""
from __future__ import annotations

from typing import Sequence

from primus_ext.project.schedule import ScheduleResult

_CATEGORY = {"F": "forward", "B": "backward", "W": "weight"}
_US_PER_S = 1e6
# Gaps shorter than this are float noise from summing op times, not idle time.
_MIN_BUBBLE_S = 1e-12


def to_chrome_trace(result: ScheduleResult, names: Sequence[str] | None = None) -> dict:
    """``{"traceEvents": [...], "displayTimeUnit": "ms"}`` for `result`.

    `result` must come from ``simulate(..., record_events=True)``. `names` optionally
    names the stages' threads (default "stage N"). Op events are named like
    "F mb3 c1" with cat forward / backward / weight and args microbatch, chunk, stage;
    bubbles have cat "bubble" and args stage.
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

    by_stage: list[list] = [[] for _ in range(p)]
    for ev in result.events:
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
            start = result.step_s if ev is None else ev.start_s
            if start - t > _MIN_BUBBLE_S:
                trace.append({"name": "bubble", "cat": "bubble", "ph": "X", "pid": 0,
                              "tid": s, "ts": t * _US_PER_S,
                              "dur": (start - t) * _US_PER_S, "args": {"stage": s}})
            if ev is not None:
                t = max(t, ev.end_s)
    return {"traceEvents": trace, "displayTimeUnit": "ms"}
