"""Busy-neighbour processes of a one-process CPU measurement (framework-neutral).

A CPU "node" shares memory bandwidth, caches and (on a VM) possibly the physical cores
behind its virtual ones, so a rank computes slower while its neighbours compute. The
megatron-core and torchtitan measurements (``frameworks/megatron/contention.py``,
``frameworks/torchtitan/measure_contention.py``) each start, on every free core, a
process that runs what another rank of the target runs, and time their blocks again.
What they share lives here: the neighbour's environment, the bounded wait for its
"ready" line, pause / resume between passes and the teardown.
"""
from __future__ import annotations

import os
import select
import signal
import subprocess
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
# How long a neighbour may take to print "ready" (interpreter start, framework import,
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
    that exits first or stays silent is an error (never a silent hang). Lines before
    "ready" (a framework's own prints) are skipped."""
    deadline = time.monotonic() + timeout_s
    for p in procs:
        while True:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([p.stdout], [], [], max(left, 0.0))
            if not ready:
                raise TimeoutError(f"contention probe: a neighbour process (pid {p.pid}) "
                                   f"did not start within {timeout_s:.0f} s")
            line = p.stdout.readline()
            if not line:
                raise RuntimeError(f"contention probe: a neighbour process (pid {p.pid}) "
                                   f"exited before it was ready (exit code {p.poll()})")
            if line.strip() == "ready":
                break


class Neighbours:
    """The helper processes of ``spawn``: ``pause()`` stops them (SIGSTOP), ``resume()``
    lets them run again (SIGCONT), so busy and quiet passes can alternate without paying
    their start-up each time."""

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


def stop(procs: list) -> None:
    """Terminate the neighbours (resumed first: a stopped process cannot act on TERM),
    killing any that has not exited 30 s later."""
    for p in procs:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGCONT)
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=30)
        if p.stdout is not None:
            p.stdout.close()


@contextmanager
def spawn(cmds: list[list[str]], timeout_s: float = READY_TIMEOUT_S):
    """Start one neighbour per command (a fresh interpreter each, outside any process
    group of the caller, stdout read for "ready"), wait for all of them and yield a
    running ``Neighbours``; stopped when the block ends, also on an error."""
    env = neighbour_env()
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True, env=env) for cmd in cmds]
    try:
        wait_ready(procs, timeout_s)
        yield Neighbours(procs)
    finally:
        stop(procs)


class PassClock:
    """Wall and CPU seconds of one timed pass (this process).

    A busy pass shares the cores with the neighbours; if other work also runs on the
    machine, more processes are runnable than there are cores and the scheduler takes
    turns, so the pass's wall time grows while this process is not running at all. The
    target's ranks (one per core) do not take turns, and the other work is not the
    target's. ``sliced`` is wall / CPU seconds: 1 when the process ran throughout, above
    1 by the share of time it waited for a core; dividing a busy/quiet ratio by the
    passes' ``sliced`` ratio keeps what the neighbours cost a running rank (shared
    caches, memory bandwidth, a vCPU's sibling) and drops the turns."""

    def __init__(self) -> None:
        self.wall_s = self.cpu_s = 0.0

    def __enter__(self) -> "PassClock":
        self._w0, self._c0 = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc) -> None:
        self.wall_s = time.perf_counter() - self._w0
        self.cpu_s = time.process_time() - self._c0

    @property
    def sliced(self) -> float:
        return max(self.wall_s / self.cpu_s, 1.0) if self.cpu_s > 0 else 1.0
