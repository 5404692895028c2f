"""CPU streams and events: no-op ``torch.cuda.Stream/Event/stream/current_stream``.

What it fixes (megatron-core 0.14-0.19, no CUDA): the MoE alltoall dispatcher and shared
experts create ``torch.cuda.Stream`` in ``__init__`` (``torch.cuda.Stream requires CUDA
support``), p2p communication calls ``torch.cuda.synchronize()``, DDP and the schedules
use streams and events for overlap. On a CPU every op is synchronous, so a stream that
does nothing and an event that is always complete are exact stand-ins.
"""
from __future__ import annotations

import contextlib
import time

import torch


class FakeStream:
    def __init__(self, *args, **kwargs) -> None:
        pass

    def wait_stream(self, *args, **kwargs) -> None:
        pass

    def wait_event(self, *args, **kwargs) -> None:
        pass

    def record_event(self, event=None):
        return event or FakeEvent()

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


class FakeEvent:
    def __init__(self, *args, **kwargs) -> None:
        self._t = None

    def record(self, *args, **kwargs) -> None:
        self._t = time.perf_counter()

    def wait(self, *args, **kwargs) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: "FakeEvent") -> float:
        return 1e3 * ((end._t or 0.0) - (self._t or 0.0))


_DEFAULT = FakeStream()


def _stream(stream=None):
    return contextlib.nullcontext()


def apply() -> list[str]:
    torch.cuda.Stream = FakeStream
    torch.cuda.Event = FakeEvent
    torch.cuda.stream = _stream
    torch.cuda.current_stream = lambda *a, **k: _DEFAULT
    torch.cuda.default_stream = lambda *a, **k: _DEFAULT
    torch.cuda.synchronize = lambda *a, **k: None
    torch.Tensor.record_stream = lambda self, stream: None
    return ["torch.cuda.Stream/Event/stream/current_stream/default_stream/synchronize"]
