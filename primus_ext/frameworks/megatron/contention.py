"""Busy neighbours: load the other CPU cores while a single process times its layers.

On a CPU "node" the ranks share memory bandwidth, caches and the power budget, so a rank
computes slower when its neighbours compute too (on this project's 2-core machine a
layer runs about 1.3-1.5x slower with both cores busy). A measurement in one process
sees none of that. Here each other core gets a neighbour that trains the *same*
downscaled megatron-core model in its own one-process group (what another rank of the
target does, minus the collectives), and the same steps are timed again; the slowdown
per layer kind is applied by the projector when the target keeps several ranks of one
CPU node busy. Without a spec the neighbour runs a transformer-like kernel mix of the
measured shapes instead. GPUs do not share compute: never used there.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
from contextlib import contextmanager

from primus_ext.measure.neighbours import READY_TIMEOUT_S, Neighbours, \
    neighbour_env, spawn, wait_ready  # noqa: F401 - re-exported


def _burn(tokens: int, hidden: int, ffn: int, heads: int, seq: int) -> None:
    import torch
    torch.set_num_threads(1)
    dt = torch.bfloat16
    x = torch.randn(tokens, hidden, dtype=dt)
    w1 = torch.randn(hidden, ffn, dtype=dt)
    w2 = torch.randn(ffn, hidden, dtype=dt)
    s = torch.randn(max(heads, 1), seq, seq)
    print("ready", flush=True)
    while True:  # until the parent terminates it
        y = torch.nn.functional.silu(x @ w1) @ w2
        z = torch.softmax(s, dim=-1)
        del y, z


def _train(overrides_path: str) -> None:
    """Train the downscaled model on synthetic data until terminated."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))))
    from primus_ext.frameworks.megatron.build import build, init_distributed, prepare_runtime
    prepare_runtime(1)
    from primus_ext.presets.overrides import spec_from_overrides
    from primus_ext.frameworks.megatron.step import data_iterators, train_step
    with open(overrides_path) as f:
        spec = spec_from_overrides(json.load(f))
    init_distributed()
    built = build(spec)
    iters = data_iterators(built, seed=4321)
    train_step(built, iters, spec.num_microbatches)
    print("ready", flush=True)
    while True:
        train_step(built, iters, spec.num_microbatches)


@contextmanager
def busy_neighbours(num: int, shapes: dict, spec=None):
    """Run ``num`` helper processes loading one core each until the block ends (a fresh
    interpreter each, outside any process group of the caller). With ``spec`` (a
    one-process RunSpec) each trains that model; otherwise a kernel mix of ``shapes``.
    Yields a ``Neighbours`` (running)."""
    if num <= 0:
        yield Neighbours([])
        return
    tmp = None
    if spec is not None and spec.world_size == 1:
        from primus_ext.presets.overrides import spec_overrides
        tmp = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
        json.dump(spec_overrides(spec), tmp)
        tmp.close()
        args = ["--train", tmp.name]
    else:
        args = [str(int(shapes.get("tokens", 1024))), str(int(shapes.get("hidden_size", 1024))),
                str(int(shapes.get("ffn", 4096))), str(int(shapes.get("heads", 8))),
                str(min(int(shapes.get("seq_length", 1024)), 2048))]
    cmd = [sys.executable, "-m", "primus_ext.frameworks.megatron.contention"] + args
    try:
        with spawn([cmd] * num) as nb:
            yield nb
    finally:
        if tmp is not None:
            os.unlink(tmp.name)


if __name__ == "__main__":
    if sys.argv[1] == "--train":
        _train(sys.argv[2])
    else:
        _burn(*(int(a) for a in sys.argv[1:6]))
