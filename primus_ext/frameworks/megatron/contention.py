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
import select
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager

# The launcher's process-group settings a neighbour must not inherit: under torchrun the
# rank's env says "join the agent's store" (TORCHELASTIC_USE_AGENT_STORE=True, the agent's
# MASTER_ADDR/PORT); a neighbour that inherits it waits in init_process_group as a client
# of a store nobody serves for it. It starts its own one-process group instead.
_DIST_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
             "MASTER_PORT", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_NAME",
             "ROLE_WORLD_SIZE", "LOCAL_ADDR")
_DIST_PREFIXES = ("TORCHELASTIC_", "TORCH_ELASTIC_")
# How long a neighbour may take to print "ready" (interpreter start, megatron-core import,
# model build and one training step on a busy 2-core machine take about a minute).
READY_TIMEOUT_S = 600.0


def neighbour_env(environ=None) -> dict[str, str]:
    """The environment of a neighbour: the caller's, without process-group settings,
    one thread."""
    environ = os.environ if environ is None else environ
    env = {k: v for k, v in environ.items()
           if k not in _DIST_ENV and not k.startswith(_DIST_PREFIXES)}
    env["OMP_NUM_THREADS"] = "1"
    return env


def wait_ready(procs: list, timeout_s: float = READY_TIMEOUT_S) -> None:
    """Wait for every neighbour's "ready" line, at most ``timeout_s`` in all; a neighbour
    that exits first or stays silent is an error (never a silent hang)."""
    deadline = time.monotonic() + timeout_s
    for p in procs:
        left = deadline - time.monotonic()
        ready, _, _ = select.select([p.stdout], [], [], max(left, 0.0))
        if not ready:
            raise TimeoutError(f"contention probe: a neighbour process (pid {p.pid}) did "
                               f"not start within {timeout_s:.0f} s")
        line = p.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"contention probe: a neighbour process (pid {p.pid}) "
                               f"exited before it was ready (exit code {p.poll()})")


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


class Neighbours:
    """The helper processes of ``busy_neighbours``: ``pause()`` stops them (SIGSTOP),
    ``resume()`` lets them run again (SIGCONT), so busy and quiet passes can alternate
    without paying their start-up each time."""

    def __init__(self, procs: list) -> None:
        self.procs = procs

    def __len__(self) -> int:
        return len(self.procs)

    def _signal(self, sig) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.kill(p.pid, sig)

    def pause(self) -> None:
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)


@contextmanager
def busy_neighbours(num: int, shapes: dict, spec=None):
    """Run ``num`` helper processes loading one core each until the block ends (a fresh
    interpreter each, outside any process group of the caller). With ``spec`` (a
    one-process RunSpec) each trains that model; otherwise a kernel mix of ``shapes``.
    Yields a ``Neighbours`` (running)."""
    if num <= 0:
        yield Neighbours([])
        return
    env = neighbour_env()
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
    procs = [subprocess.Popen([sys.executable, "-m",
                               "primus_ext.frameworks.megatron.contention"] + args,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                              env=env)
             for _ in range(num)]
    try:
        wait_ready(procs)
        yield Neighbours(procs)
    finally:
        for p in procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGCONT)  # a stopped process cannot act on TERM
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        if tmp is not None:
            os.unlink(tmp.name)


if __name__ == "__main__":
    if sys.argv[1] == "--train":
        _train(sys.argv[2])
    else:
        _burn(*(int(a) for a in sys.argv[1:6]))
