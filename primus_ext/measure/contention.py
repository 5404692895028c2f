"""Busy neighbours: load the other CPU cores while a single process times its layers.

On a CPU "node" the ranks share memory bandwidth, caches and the power budget, so a rank
computes slower when its neighbours compute too (on this project's 2-core machine a
layer runs about 1.3x slower with both cores busy). A measurement in one process sees
none of that; timing the same steps again while helper processes run a transformer-like
kernel mix of the measured shapes (GEMMs of hidden x ffn, SiLU, softmax over a score
block) gives the slowdown per layer kind, which the projector applies when the target
keeps several ranks of one CPU node busy. GPUs do not share compute: never used there.
"""
from __future__ import annotations

import subprocess
import sys
from contextlib import contextmanager


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


@contextmanager
def busy_neighbours(num: int, shapes: dict):
    """Run ``num`` helper processes loading one core each until the block ends (a fresh
    interpreter each: nothing of the caller's process is inherited)."""
    if num <= 0:
        yield 0
        return
    args = [str(int(shapes.get("tokens", 1024))), str(int(shapes.get("hidden_size", 1024))),
            str(int(shapes.get("ffn", 4096))), str(int(shapes.get("heads", 8))),
            str(min(int(shapes.get("seq_length", 1024)), 2048))]
    procs = [subprocess.Popen([sys.executable, "-m", "primus_ext.measure.contention"] + args,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
             for _ in range(num)]
    try:
        for p in procs:
            p.stdout.readline()  # "ready" (or EOF if it died)
        yield num
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()


if __name__ == "__main__":
    _burn(*(int(a) for a in sys.argv[1:6]))
