"""Median wall time of memory_report for the tuner's big case: DeepSeek-V3 on 128 nodes of
8 H100, PP16 EP64 (TP1, MBS 1, seq 4096, GBS 8192, full recompute).

Three figures: ``cold`` with every memory cache cleared (the first candidate the tuner
sees), ``new spec`` with the caches warm but a fresh RunSpec each call (the tuner varying
micro batch size and recompute, so the per-layer pieces are recomputed only when they
depend on the changed field), and ``repeat`` (the same spec again).

Usage: python scripts/bench_memory.py [--runs 50]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from primus_ext.memory import activations, grad_buffer, inflight, rank_params, report, \
    states  # noqa: E402
from primus_ext.memory.report import memory_report  # noqa: E402
from primus_ext.presets import hardware_preset, model_preset  # noqa: E402
from primus_ext.spec import ClusterSpec, ModelSpec, ParallelSpec, RunSpec, TrainSpec  # noqa: E402


def deepseek_v3_spec(mbs: int = 1, recompute_layers: int = 1) -> RunSpec:
    return RunSpec(
        model=ModelSpec(**model_preset("deepseek_v3")),
        parallel=ParallelSpec(tp=1, pp=16, ep=64),
        train=TrainSpec(seq_length=4096, micro_batch_size=mbs, global_batch_size=8192,
                        recompute_granularity="full", recompute_method="uniform",
                        recompute_num_layers=recompute_layers),
        cluster=ClusterSpec(hardware=hardware_preset("h100"), num_nodes=128))


def clear_caches() -> None:
    for mod in (activations, grad_buffer, inflight, rank_params, report, states):
        for value in vars(mod).values():
            if hasattr(value, "cache_clear"):
                value.cache_clear()


def _median_ms(fn, runs: int) -> float:
    times = []
    for i in range(runs):
        t = time.perf_counter()
        fn(i)
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=50)
    runs = ap.parse_args().runs
    spec = deepseek_v3_spec()

    def cold(_):
        clear_caches()
        memory_report(spec)

    variants = [replace(spec, train=replace(spec.train, micro_batch_size=mbs,
                                            recompute_num_layers=r))
                for mbs in (1, 2) for r in (1, 2)]
    clear_caches()
    for v in variants:
        memory_report(v)

    def new_spec(i):
        report._report.cache_clear()  # a RunSpec the report cache has not seen
        memory_report(variants[i % len(variants)])

    memory_report(spec)
    rep = memory_report(spec)
    print(f"memory_report, DeepSeek-V3, 128x8 H100, PP16 EP64 ({runs} runs, median):")
    print(f"  cold (all caches cleared) {_median_ms(cold, runs):8.3f} ms")
    print(f"  new spec (warm per-layer) {_median_ms(new_spec, runs):8.3f} ms")
    print(f"  repeat (same spec)        {_median_ms(lambda _: memory_report(spec), runs):8.3f} ms")
    print(f"  peak {rep.peak_bytes / 2**30:.1f} GiB on stage {rep.worst_stage}, "
          f"fits={rep.fits}")


if __name__ == "__main__":
    main()
