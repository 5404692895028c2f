"""Wall time of one projection (RunSpec in, Estimate out) for the two big reference cases.

Reported per case:

- **first call**: the very first projection in the process (every cache empty: layer
  costs, group spans, parameter counts, memory report);
- **cold median**: a never-seen pipeline shape each call: every call has one more
  microbatch per data-parallel rank than the last (global batch + dp * micro batch), so
  no schedule, layer cost, memory report or estimate of an earlier call can be reused;
  the memory model is included;
- **colder median**: each call also a new sequence length, so that the per-microbatch
  caches (layer costs, activation and state bytes) miss as well;
- **warm median**: the same spec projected again (every cache hits).

Each figure is the wall-clock median and, in brackets, the median CPU time of this
process (``time.process_time``): on a shared machine the wall clock also counts the
time other processes hold the cores (the load average is printed), the CPU time only
the projection's own work.

Cases (the acceptance cases of docs/accuracy.md):
  Llama 3.1 405B on 1,024 H100: TP8 PP8 VPP8 CP2, GBS 1536, seq 8192, FP8;
  DeepSeek-V3 on 1,024 H100: PP16 EP64, GBS 8192, seq 4096, FP8.

Usage: python scripts/bench_project.py [--runs 40] [--profile]
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from primus_ext.presets import hardware_preset, model_preset  # noqa: E402
from primus_ext.project.estimate import project  # noqa: E402
from primus_ext.spec import ClusterSpec, ModelSpec, ParallelSpec, RunSpec, TrainSpec  # noqa: E402


def cases() -> list[tuple[str, RunSpec]]:
    h100 = hardware_preset("h100")
    llama = ModelSpec(**model_preset("llama3.1_405b"))
    dsv3 = ModelSpec(**model_preset("deepseek_v3"))
    return [
        ("llama3.1-405b 1024xH100 tp8 pp8 vpp8 cp2", RunSpec(
            model=llama,
            parallel=ParallelSpec(tp=8, pp=8, vpp=8, cp=2, sequence_parallel=True,
                                  tp_comm_overlap=True),
            train=TrainSpec(seq_length=8192, micro_batch_size=1, global_batch_size=1536,
                            precision="fp8"),
            cluster=ClusterSpec(hardware=h100, num_nodes=128))),
        ("deepseek-v3 1024xH100 pp16 ep64", RunSpec(
            model=dsv3, parallel=ParallelSpec(pp=16, ep=64, etp=1),
            train=TrainSpec(seq_length=4096, micro_batch_size=1, global_batch_size=8192,
                            precision="fp8", recompute_granularity="selective",
                            recompute_modules=("mla_up_proj",)),
            cluster=ClusterSpec(hardware=h100, num_nodes=128))),
    ]


def more_microbatches(spec: RunSpec, n: int) -> list[RunSpec]:
    """``n`` specs after ``spec``, call i with i more microbatches per data-parallel rank
    (a pipeline shape no earlier call had)."""
    t = spec.train
    step = spec.dp * t.micro_batch_size
    return [replace(spec, train=replace(t, global_batch_size=t.global_batch_size + step * i))
            for i in range(1, n + 1)]


def new_microbatches(spec: RunSpec, n: int) -> list[RunSpec]:
    """``n`` specs after ``spec``, each with a sequence length no other call had (and
    one more microbatch per data-parallel rank than the last)."""
    t, step = spec.train, spec.dp * spec.train.micro_batch_size
    return [replace(spec, train=replace(t, seq_length=t.seq_length + 1024 * i,
                                        global_batch_size=t.global_batch_size + step * i))
            for i in range(1, n + 1)]


def _time(fn) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) of one call."""
    w, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w, time.process_time() - c


def _ms(times: list[tuple[float, float]], digits: int = 2) -> str:
    wall = statistics.median(t[0] for t in times) * 1e3
    cpu = statistics.median(t[1] for t in times) * 1e3
    return f"{wall:.{digits}f} ms [cpu {cpu:.{digits}f} ms]"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--profile", action="store_true", help="cProfile the cold calls")
    args = ap.parse_args()
    print("load average (1, 5, 15 min): " + ", ".join(f"{x:.1f}" for x in os.getloadavg())
          + f" on {os.cpu_count()} cores")
    for name, spec in cases():
        first = _time(lambda: project(spec))
        prof = cProfile.Profile() if args.profile else None
        cold = []
        for s in more_microbatches(spec, args.runs):
            if prof:
                prof.enable()
            cold.append(_time(lambda: project(s)))
            if prof:
                prof.disable()
        colder = [_time(lambda: project(s)) for s in new_microbatches(spec, args.runs)]
        warm = [_time(lambda: project(spec)) for _ in range(args.runs)]
        est = project(spec)
        print(f"{name}: step {est.step_time_s:.2f} s, {est.tokens_per_s_per_gpu:.0f} "
              f"tok/s/GPU | first call {_ms([first], 1)} | cold median {_ms(cold)} "
              f"(a never-seen pipeline shape per call, memory model included) | colder "
              f"median {_ms(colder)} (a new sequence length too) | warm median "
              f"{_ms(warm, 3)}")
        if prof:
            pstats.Stats(prof).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
