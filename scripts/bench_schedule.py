"""Median wall time of one pipeline-schedule simulation for the tuner's big cases.

Times simulate(..., record_events=False) with the op order already cached (the
tuner's repeat calls); the first, uncached call is shown too. Then the fast path the
projector uses (schedule_fast.fast_step_s: no op order to build, so every call is a
first call), with its step time beside the event simulation's.

Usage: python scripts/bench_schedule.py [--runs 50]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from primus_ext.project.schedule import ScheduleInput, simulate  # noqa: E402
from primus_ext.project.schedule_fast import fast_step_s  # noqa: E402
from primus_ext.project.schedule_order import compiled_plan  # noqa: E402


def _case(schedule: str, p: int, v: int, m: int) -> ScheduleInput:
    # Non-uniform costs (heavier last stage, like the loss/embedding) so no shortcut
    # could apply; p2p per link, plus the wrap-around link for interleaved.
    fwd = tuple(tuple(1.0e-3 * (1.0 + 0.3 * (s == p - 1)) for _ in range(v))
                for s in range(p))
    bwd_in = tuple(tuple(2.0 * x for x in row) for row in fwd)
    bwd_w = tuple(tuple(0.9 * x for x in row) for row in fwd)
    links = p if schedule == "interleaved" and v > 1 else p - 1
    return ScheduleInput(num_stages=p, num_chunks=v, num_microbatches=m, fwd_s=fwd,
                         bwd_input_s=bwd_in, bwd_weight_s=bwd_w,
                         p2p_s=tuple(5e-5 for _ in range(links)), schedule=schedule)


CASES = (
    ("interleaved pp=8 vpp=8 m=192", "interleaved", 8, 8, 192),
    ("1f1b pp=16 m=512", "1f1b", 16, 1, 512),
    ("zb pp=16 m=512", "zb", 16, 1, 512),
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=50)
    args = ap.parse_args()
    for label, schedule, p, v, m in CASES:
        inp = _case(schedule, p, v, m)
        compiled_plan.cache_clear()
        t0 = time.perf_counter()
        result = simulate(inp)  # builds and caches the op order, as a tuner's first call
        cold_ms = (time.perf_counter() - t0) * 1e3
        times_ms = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            simulate(inp)
            times_ms.append((time.perf_counter() - t0) * 1e3)
        print(f"{label:32s} ops={result.num_ops:6d} median={statistics.median(times_ms):7.3f} ms"
              f"  (min {min(times_ms):.3f} ms, {args.runs} runs; first call {cold_ms:.1f} ms;"
              f" step_s={result.step_s:.4f})")
        fast_ms = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            fast = fast_step_s(inp)
            fast_ms.append((time.perf_counter() - t0) * 1e3)
        print(f"{'  fast path':32s} {'':10s} median={statistics.median(fast_ms):7.3f} ms"
              f"  (min {min(fast_ms):.3f} ms; step_s={fast:.4f})")


if __name__ == "__main__":
    main()
