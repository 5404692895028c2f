"""Busy neighbours for a one-process torchtitan measurement: the same Trainer on the
other cores.

A CPU "node" shares memory bandwidth, caches and (on a VM) possibly the physical cores
behind its virtual ones, so a rank computes slower while its neighbours compute, by an
amount that depends on what they run. As megatron-core's measurement does with its
spec (``frameworks/megatron/contention.py``), each neighbour here is what another rank
of the target runs: torchtitan's Trainer of the same downscaled model and line, in its
own one-process group, training until it is terminated (paused and resumed with
``Neighbours.pause/resume``; spawning, the bounded wait for "ready" and the
teardown are shared with megatron-core's in ``primus_ext.measure.neighbours``). On a machine that other work already loads, the busy
passes share the cores more than two ways and the slowdown reaches the core count
(docs/cpu-proof-torchtitan.md).

    python -m primus_ext.frameworks.torchtitan.measure_contention DIMS_JSON ASSETS ARGV_JSON \
        [PIPELINE_MICROBATCHES]
"""
from __future__ import annotations

import json
import os
import sys
from contextlib import contextmanager


@contextmanager
def titan_neighbours(num: int, dims_json: str, assets: str, argv: list[str],
                     pipeline_microbatches: int = 0):
    """``num`` neighbour processes training the measured model; yields a running
    ``primus_ext.measure.neighbours.Neighbours`` (pause / resume) once each has finished
    a step (a bounded wait; stopped when the block ends)."""
    from primus_ext.measure.neighbours import Neighbours, spawn
    if num <= 0:
        yield Neighbours([])
        return
    cmd = [sys.executable, "-m", __name__, dims_json, assets, json.dumps(argv),
           str(pipeline_microbatches)]
    with spawn([cmd] * num) as nb:
        yield nb


def _train(dims_json: str, assets: str, argv: list[str],
           pipeline_microbatches: int = 0) -> None:
    import torch
    torch.set_num_threads(1)
    from patches.torchtitan_apply import apply_torchtitan_cpu_patches
    apply_torchtitan_cpu_patches()
    from primus_ext.frameworks.torchtitan import build
    from primus_ext.frameworks.torchtitan.step import StepRunner
    build.single_process_env()
    dims = build.ModelDims.from_json(dims_json)
    build.ensure_assets(assets, dims.vocab_size)
    trainer = build.build_trainer(build.trainer_config(argv, dims))
    runner = StepRunner(trainer, pipeline_microbatches=pipeline_microbatches)
    runner.step()
    print("ready", flush=True)
    while True:  # until the parent terminates it
        runner.step()


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))))
    _train(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]),
           int(sys.argv[4]) if len(sys.argv) > 4 else 0)
