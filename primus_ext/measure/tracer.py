"""Collective tracer: every torch.distributed collective megatron-core issues.

Install it BEFORE ``import megatron.core``: ``tensor_parallel/mappings.py`` and
``distributed/param_and_grad_buffer.py`` bind ``dist_all_gather_func`` /
``dist_reduce_scatter_func`` at import time, so a wrapper installed later is never
called (reference/megatron-on-cpu.md, Sec. 3). ``isend``/``irecv`` are not wrapped:
``P2POp`` checks them by identity; ``batch_isend_irecv`` is wrapped instead, and each
p2p op inside it is recorded.

Each record carries op, bytes (input and output as torch sees them), the group (ranks,
size, and the parallel axis it was registered under), wall seconds, and the scope
(layer, phase) the timing hooks say is running. Async ops are timed to their ``wait()``;
``blocked_s`` is the part of that the calling thread spent inside the call and the
``wait()`` (all of it for a synchronous op): megatron-core overlaps the async ones with
a GEMM (the SP input all-gather for wgrad and the dgrad reduce-scatter in
``tensor_parallel/layers.py``, ``LinearWithGradAccumulationAndAsyncCommunication``), so
only the blocked part sits on the rank's critical path.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.distributed as dist

# torch.distributed name -> the collective kind of primus_ext.compute.costs.COLLECTIVES.
WRAPPED = {
    "all_reduce": "all_reduce",
    "all_gather_into_tensor": "all_gather",
    "_all_gather_base": "all_gather",
    "all_gather_single": "all_gather",
    "all_gather": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_single": "reduce_scatter",
    "reduce_scatter": "reduce_scatter",
    "all_to_all_single": "all_to_all",
    "all_to_all": "all_to_all",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "batch_isend_irecv": "p2p",
}


@dataclass(frozen=True, slots=True)
class CollectiveRecord:
    op: str  # torch.distributed function name
    collective: str  # all_reduce | all_gather | reduce_scatter | all_to_all | p2p | ...
    in_bytes: int  # bytes this rank passes in (send side for p2p)
    out_bytes: int  # bytes this rank gets back (recv side for p2p)
    group_ranks: tuple[int, ...]
    axis: str  # tp | cp | ep | etp | dp | edp | pp | tp_ep | world | ? (see register_axes)
    seconds: float
    scope: str  # e.g. "layer.3", "embedding", "output", "step"
    phase: str  # fwd | bwd | step
    async_op: bool
    dtype: str = ""  # of the payload ("bfloat16"; fp32 routing weights, int64 counts)
    blocked_s: float | None = None  # the caller held in the call + wait (None: unknown)

    @property
    def group_size(self) -> int:
        return len(self.group_ranks)


def _nbytes(x) -> int:
    if torch.is_tensor(x):
        return x.numel() * x.element_size()
    if isinstance(x, (list, tuple)):
        return sum(_nbytes(t) for t in x)
    return 0


def _dtype_of(args, kwargs) -> str:
    for x in list(args) + list(kwargs.values()):
        if torch.is_tensor(x):
            return str(x.dtype).replace("torch.", "")
        if isinstance(x, (list, tuple)) and x and torch.is_tensor(x[0]):
            return str(x[0].dtype).replace("torch.", "")
    return ""


def _bytes_of(op: str, args, kwargs) -> tuple[int, int]:
    """(in_bytes, out_bytes) of one call, as torch sees the tensors."""
    def arg(i, name):
        return kwargs[name] if name in kwargs else (args[i] if len(args) > i else None)

    if op == "all_reduce" or op == "broadcast" or op == "reduce":
        n = _nbytes(arg(0, "tensor"))
        return n, n
    if op in ("all_gather_into_tensor", "_all_gather_base", "all_gather_single",
              "reduce_scatter_tensor", "_reduce_scatter_base", "reduce_scatter_single",
              "all_to_all_single"):
        return _nbytes(arg(1, "input")), _nbytes(arg(0, "output"))
    if op == "all_gather":
        return _nbytes(arg(1, "tensor")), _nbytes(arg(0, "tensor_list"))
    if op == "reduce_scatter":
        return _nbytes(arg(1, "input_list")), _nbytes(arg(0, "output"))
    if op == "all_to_all":
        return _nbytes(arg(1, "input_tensor_list")), _nbytes(arg(0, "output_tensor_list"))
    return 0, 0


class _TimedWork:
    """A Work handle whose ``wait()`` closes the record of an async collective."""

    def __init__(self, work, on_done: Callable[[], None]) -> None:
        self._work = work
        self._on_done = on_done
        self._done = False

    def wait(self, *args, **kwargs):
        t0 = time.perf_counter()
        out = self._work.wait(*args, **kwargs)
        if not self._done:
            self._done = True
            self._on_done(time.perf_counter() - t0)
        return out

    def __getattr__(self, name):
        return getattr(self._work, name)


@dataclass
class CollectiveTracer:
    """Wraps torch.distributed collectives; one per process (see ``install``)."""

    records: list[CollectiveRecord] = field(default_factory=list)
    enabled: bool = False
    # () -> (scope, phase); set by the layer timer.
    scope_fn: Callable[[], tuple[str, str]] = lambda: ("step", "step")
    # Called before/after each synchronous collective (the layer timer pauses its clock
    # there on CUDA; on CPU it is a plain function call).
    sync_fn: Callable[[], None] = lambda: None
    _axes: dict[int, str] = field(default_factory=dict)  # id(group) -> axis
    _axes_by_ranks: dict[tuple[int, ...], str] = field(default_factory=dict)
    _originals: dict[str, Callable] = field(default_factory=dict)

    # ---- groups -------------------------------------------------------------------
    def register_axes(self, groups: dict[str, object]) -> None:
        """Name process groups by parallel axis (identity first, rank set as fallback)."""
        for axis, group in groups.items():
            if group is None:
                continue
            self._axes.setdefault(id(group), axis)
            try:
                ranks = tuple(dist.get_process_group_ranks(group))
            except Exception:  # noqa: BLE001 - a group this rank is not in
                continue
            self._axes_by_ranks.setdefault(ranks, axis)

    def _group_info(self, group) -> tuple[tuple[int, ...], str]:
        if group is None:
            group = dist.group.WORLD
        try:
            ranks = tuple(dist.get_process_group_ranks(group))
        except Exception:  # noqa: BLE001
            ranks = ()
        axis = self._axes.get(id(group))
        if axis is None:
            axis = "world" if group is dist.group.WORLD else \
                self._axes_by_ranks.get(ranks, "?")
        return ranks, axis

    # ---- wrappers -----------------------------------------------------------------
    def _wrap(self, op: str, fn: Callable) -> Callable:
        tracer = self

        def wrapper(*args, **kwargs):
            if not tracer.enabled:
                return fn(*args, **kwargs)
            if op == "batch_isend_irecv":
                return tracer._p2p(fn, *args, **kwargs)
            in_b, out_b = _bytes_of(op, args, kwargs)
            group = kwargs.get("group")
            ranks, axis = tracer._group_info(group)
            scope, phase = tracer.scope_fn()
            async_op = bool(kwargs.get("async_op", False))
            tracer.sync_fn()
            t0 = time.perf_counter()
            work = fn(*args, **kwargs)
            issue_s = time.perf_counter() - t0
            # Recorded at issue (an async op inside a coalescing manager is never waited
            # on by itself); the time is filled in when the op completes.
            idx = len(tracer.records)
            tracer.records.append(CollectiveRecord(
                op=op, collective=WRAPPED[op], in_bytes=in_b, out_bytes=out_b,
                group_ranks=ranks, axis=axis, seconds=0.0, scope=scope, phase=phase,
                async_op=async_op, dtype=_dtype_of(args, kwargs)))

            def done(wait_s: float | None = None):
                tracer.sync_fn()
                secs = time.perf_counter() - t0
                tracer._set_seconds(idx, secs, secs if wait_s is None else issue_s + wait_s)

            if async_op and work is not None:
                return _TimedWork(work, done)
            done()
            return work

        wrapper.__wrapped__ = fn
        wrapper.__primus_traced__ = True
        return wrapper

    def _p2p(self, fn, p2p_op_list, *args, **kwargs):
        scope, phase = self.scope_fn()
        t0 = time.perf_counter()
        works = fn(p2p_op_list, *args, **kwargs)
        sends = [p for p in p2p_op_list if getattr(p.op, "__name__", "") == "isend"]
        recvs = [p for p in p2p_op_list if getattr(p.op, "__name__", "") != "isend"]
        ranks, axis = self._group_info(p2p_op_list[0].group if p2p_op_list else None)
        in_b = sum(_nbytes(p.tensor) for p in sends)
        out_b = sum(_nbytes(p.tensor) for p in recvs)
        pending = [len(works)]
        blocked = [time.perf_counter() - t0]  # the issue, then each wait
        idx = len(self.records)
        self.records.append(CollectiveRecord(
            op="batch_isend_irecv", collective="p2p", in_bytes=in_b, out_bytes=out_b,
            group_ranks=ranks, axis=axis, seconds=0.0, scope=scope, phase=phase,
            async_op=True,
            dtype=str(p2p_op_list[0].tensor.dtype).replace("torch.", "") if p2p_op_list
            else ""))

        def done(wait_s: float = 0.0):
            pending[0] -= 1
            blocked[0] += wait_s
            if pending[0] == 0:
                self._set_seconds(idx, time.perf_counter() - t0, blocked[0])
        if not works:
            return works
        return [_TimedWork(w, done) for w in works]

    def _set_seconds(self, idx: int, seconds: float, blocked_s: float) -> None:
        if idx < len(self.records):  # the list may have been cleared in between
            self.records[idx] = dataclasses.replace(self.records[idx], seconds=seconds,
                                                    blocked_s=min(blocked_s, seconds))

    def install(self) -> list[str]:
        """Wrap the torch.distributed functions (idempotent). Returns the names."""
        for name in WRAPPED:
            fn = getattr(dist, name, None)
            if fn is None or getattr(fn, "__primus_traced__", False):
                continue
            self._originals[name] = fn
            setattr(dist, name, self._wrap(name, fn))
        return sorted(self._originals)

    def uninstall(self) -> None:
        for name, fn in self._originals.items():
            setattr(dist, name, fn)
        self._originals.clear()

    def clear(self) -> None:
        self.records.clear()


_TRACER: CollectiveTracer | None = None


# megatron-core modules that bind collectives at import (0.14-0.19).
_BOUND = {
    "megatron.core.tensor_parallel.mappings": ("dist_all_gather_func",
                                               "dist_reduce_scatter_func"),
    "megatron.core.distributed.param_and_grad_buffer": ("dist_all_gather_func",
                                                        "dist_reduce_scatter_func"),
    "megatron.core.transformer.multi_token_prediction": ("dist_all_gather_func",),
}


def _rebind_imported() -> list[str]:
    """Point names megatron-core already bound at the wrappers (when the tracer was
    installed after ``import megatron.core``, e.g. in a test process)."""
    import sys
    rebound = []
    for mod_name, names in _BOUND.items():
        mod = sys.modules.get(mod_name)
        if mod is None:
            continue
        for name in names:
            fn = getattr(mod, name, None)
            if fn is None or getattr(fn, "__primus_traced__", False):
                continue
            wrapped = getattr(dist, getattr(fn, "__name__", ""), None)
            if getattr(wrapped, "__primus_traced__", False):
                setattr(mod, name, wrapped)
                rebound.append(f"{mod_name}.{name}")
    return rebound


def install_tracer() -> CollectiveTracer:
    """The process's tracer, installed (an explicit registry of one: the wrappers are
    process-global because torch.distributed's functions are). Call it before
    ``import megatron.core``; names megatron-core already bound are rebound."""
    global _TRACER
    if _TRACER is None:
        _TRACER = CollectiveTracer()
        _TRACER.install()
    _rebind_imported()
    return _TRACER


def get_tracer() -> CollectiveTracer | None:
    return _TRACER
