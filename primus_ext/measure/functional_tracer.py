"""Functional collectives (``torch.ops._c10d_functional.*``) into the collective tracer.

DTensor-based tensor parallelism (torchtitan's ``parallelize`` with
``spmd_backend=partial_dtensor``) redistributes through the functional collectives, which
call no ``torch.distributed`` Python function: wrapping ``dist.*`` (``tracer.py``) never
sees them. They are ATen ops, so a ``TorchDispatchMode`` sees each call: the op, its input
and output tensors and its group name, resolved to ranks by
``distributed_c10d._resolve_process_group``. A functional collective returns at once and
completes at its ``wait_tensor``, which the output's ``AsyncCollectiveTensor`` wrapper
calls below the mode (unseen); the mode therefore waits right after the issue and the
record's seconds are the collective's own (DTensor's redistribution uses the output next
in any case; async TP, which overlaps it, is a GPU path). The calling thread is held for
all of them (the issue, then the ``wait_tensor`` of that call's own output), so the
record's ``blocked_s`` is the same time: what ``project.from_profile`` costs a modelled
collective at when it matches one the measured run issued (its in-situ path).

A dispatch mode costs a Python call per ATen op, so a measurement enables it only where
functional collectives can occur (a measured layout with TP or CP > 1).
"""
from __future__ import annotations

import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from primus_ext.measure.tracer import CollectiveRecord, CollectiveTracer

# _c10d_functional op name -> (collective kind, index of the group-name argument).
FUNCTIONAL = {
    "all_reduce": ("all_reduce", 2),
    "all_reduce_coalesced": ("all_reduce", 2),
    "all_gather_into_tensor": ("all_gather", 2),
    "all_gather_into_tensor_coalesced": ("all_gather", 2),
    "reduce_scatter_tensor": ("reduce_scatter", 3),
    "reduce_scatter_tensor_coalesced": ("reduce_scatter", 3),
    "all_to_all_single": ("all_to_all", 3),
    "broadcast": ("broadcast", 2),
}


def _nbytes(x) -> int:
    if torch.is_tensor(x):
        return x.numel() * x.element_size()
    if isinstance(x, (list, tuple)):
        return sum(_nbytes(t) for t in x)
    return 0


def _first_tensor(x):
    if torch.is_tensor(x):
        return x
    if isinstance(x, (list, tuple)) and x and torch.is_tensor(x[0]):
        return x[0]
    return None


def _ranks(group_name) -> tuple[int, ...]:
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d
    try:
        return tuple(dist.get_process_group_ranks(c10d._resolve_process_group(group_name)))
    except Exception:  # noqa: BLE001 - an unknown name: record without ranks
        return ()


class FunctionalCollectiveMode(TorchDispatchMode):
    """Records ``_c10d_functional`` collectives into ``tracer.records`` while active and
    ``tracer.enabled``; the axis comes from the tracer's registered groups (by ranks)."""

    def __init__(self, tracer: CollectiveTracer) -> None:
        super().__init__()
        self.tracer = tracer

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        kind = FUNCTIONAL.get(getattr(func, "_opname", "")) \
            if getattr(func, "namespace", "") == "_c10d_functional" else None
        if kind is None or not self.tracer.enabled:
            return func(*args, **kwargs)
        collective, gi = kind
        ranks = _ranks(args[gi]) if len(args) > gi else ()
        axis = self.tracer._axes_by_ranks.get(ranks, "?")
        scope, phase = self.tracer.scope_fn()
        t0 = time.perf_counter()
        out = func(*args, **kwargs)
        # Completed here: the wrapper's own wait runs below this mode, unseen, and the
        # DTensor redistribution that issued the op uses its output next anyway.
        for t in (out if isinstance(out, (list, tuple)) else [out]):
            if torch.is_tensor(t):
                torch.ops._c10d_functional.wait_tensor(t)
        t1 = time.perf_counter()
        x = _first_tensor(args[0])
        self.tracer.records.append(CollectiveRecord(
            op=f"_c10d_functional.{func._opname}", collective=collective,
            in_bytes=_nbytes(args[0]), out_bytes=_nbytes(out), group_ranks=ranks, axis=axis,
            seconds=t1 - t0, blocked_s=t1 - t0, scope=scope, phase=phase, async_op=True,
            dtype=str(x.dtype).replace("torch.", "") if x is not None else ""))
        return out
