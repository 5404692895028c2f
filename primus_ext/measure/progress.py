"""Progress of a measurement on stderr, with the time since it started and each step's.

One ``Progress`` per measurement, passed to the passes that report (no global state).
Only rank 0 prints. ``layer_hooks`` reports "layer k of n" as the first step's forward
and backward reach each decoder layer (a forward hook, and a gradient hook on the
layer's output: nothing is wrapped, the autograd graph is megatron-core's own).
"""
from __future__ import annotations

import sys
import time
from contextlib import contextmanager


class Progress:
    def __init__(self, enabled: bool = True, stream=None, prefix: str = "primus-ext") -> None:
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stderr
        self.prefix = prefix
        self.t0 = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def say(self, what: str) -> None:
        if self.enabled:
            print(f"{self.prefix} [{self.elapsed():7.1f} s] {what}", file=self.stream,
                  flush=True)

    @contextmanager
    def step(self, name: str):
        """``name ...`` then ``name: done in X s``."""
        t = time.perf_counter()
        self.say(f"{name} ...")
        yield
        self.say(f"{name}: done in {time.perf_counter() - t:.1f} s")


def layer_hooks(layers, progress: Progress, label: str):
    """Hooks that say when each of ``layers`` runs its forward and its backward; returns
    a function that removes them (call it after the step)."""
    n = len(layers)
    handles = []
    t_last = [time.perf_counter()]

    def _dt() -> float:
        now = time.perf_counter()
        dt, t_last[0] = now - t_last[0], now
        return dt

    for k, layer in enumerate(layers, start=1):
        def fwd(_mod, _inp, out, k=k):
            progress.say(f"{label}: layer {k} of {n} forward ({_dt():.1f} s)")
            t = out[0] if isinstance(out, tuple) else out
            if getattr(t, "requires_grad", False):
                t.register_hook(lambda g, k=k: progress.say(
                    f"{label}: layer {k} of {n} backward begins ({_dt():.1f} s)") or None)
        handles.append(layer.register_forward_hook(fwd))

    def remove() -> None:
        for h in handles:
            h.remove()
    return remove
