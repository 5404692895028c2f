"""Functional collectives (``torch.distributed._functional_collectives``) into the tracer.

DTensor-based tensor parallelism (torchtitan's ``parallelize`` with
``spmd_backend=partial_dtensor``) redistributes through the functional collectives, which
call no ``torch.distributed`` Python function: wrapping ``dist.*`` (``tracer.py``) never
sees them. Their callers (DTensor's placements and redistribution,
torch/distributed/tensor/placement_types.py and _collective_utils.py; torchtitan's
vocab-parallel loss, torchtitan/components/loss.py) call them as attributes of the
``funcol`` module, so wrapping those attributes sees every call: its input and output
tensors and its group, resolved to ranks. A functional collective returns an
``AsyncCollectiveTensor`` at once and completes at its ``wait_tensor``, which eager
DTensor runs at the next op on the output; the wrapper runs that wait right after the
issue (``trigger_wait``: the output is then marked complete and later ops do not wait
again), so the record's seconds are the collective's own, and the calling thread is held
for all of them: its ``blocked_s`` (what ``project.from_profile`` costs a modelled
collective at when it matches one the measured run issued, its in-situ path) is the same
time. Async TP, which would overlap the wait with a GEMM, is a GPU path.

Unlike a ``TorchDispatchMode`` (a Python call per ATen op, which made a measured TP 2
step 27% slower than the real one), the wrappers add Python only per collective, so the
measured blocks keep the cost DTensor's own dispatch adds to a real step and little more.
"""
from __future__ import annotations

import functools
import threading
import time

import torch

from primus_ext.measure.tracer import CollectiveRecord, CollectiveTracer

# funcol function -> (collective kind, position of the group argument, ATen op recorded).
# all_gather_tensor / reduce_scatter_tensor call the *_single ones (recorded there).
FUNCTIONAL = {
    "all_reduce": ("all_reduce", 2, "all_reduce"),
    "all_reduce_coalesced": ("all_reduce", 2, "all_reduce_coalesced"),
    "all_gather_single": ("all_gather", 2, "all_gather_into_tensor"),
    "all_gather_single_coalesced": ("all_gather", 2, "all_gather_into_tensor_coalesced"),
    "reduce_scatter_single": ("reduce_scatter", 3, "reduce_scatter_tensor"),
    "reduce_scatter_single_coalesced": ("reduce_scatter", 4,
                                        "reduce_scatter_tensor_coalesced"),
    "all_to_all_single": ("all_to_all", 3, "all_to_all_single"),
    "broadcast": ("broadcast", 2, "broadcast"),
}


def _nbytes(x) -> int:
    x = getattr(x, "elem", x)  # an AsyncCollectiveTensor's own tensor
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


def _ranks(group) -> tuple[int, ...]:
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    from torch.distributed import distributed_c10d as c10d
    try:
        name = funcol._resolve_group_name(group)
        return tuple(dist.get_process_group_ranks(c10d._resolve_process_group(name)))
    except Exception:  # noqa: BLE001 - an unknown group: record without ranks
        return ()


def _wait(out) -> None:
    for t in (out if isinstance(out, (list, tuple)) else [out]):
        trigger = getattr(t, "trigger_wait", None)
        if trigger is not None:
            trigger()
        elif torch.is_tensor(t):
            torch.ops._c10d_functional.wait_tensor(t)


class FunctionalCollectiveMode:
    """While entered, records the functional collectives into ``tracer.records`` when
    ``tracer.enabled``; the axis comes from the tracer's registered groups (by ranks)."""

    def __init__(self, tracer: CollectiveTracer) -> None:
        self.tracer = tracer
        self._saved: dict[str, object] = {}
        self._local = threading.local()

    def _wrap(self, name: str, orig):
        collective, gi, opname = FUNCTIONAL[name]
        tracer = self.tracer

        @functools.wraps(orig)
        def traced(*args, **kwargs):
            if not tracer.enabled or getattr(self._local, "busy", False):
                return orig(*args, **kwargs)
            group = args[gi] if len(args) > gi else kwargs.get("group")
            ranks = _ranks(group)
            axis = tracer._axes_by_ranks.get(ranks, "?")
            scope, phase = tracer.scope_fn()
            self._local.busy = True
            try:
                t0 = time.perf_counter()
                out = orig(*args, **kwargs)
                _wait(out)  # the issue, then this call's own wait_tensor
                t1 = time.perf_counter()
            finally:
                self._local.busy = False
            x = _first_tensor(args[0])
            tracer.records.append(CollectiveRecord(
                op=f"_c10d_functional.{opname}", collective=collective,
                in_bytes=_nbytes(args[0]), out_bytes=_nbytes(out), group_ranks=ranks,
                axis=axis, seconds=t1 - t0, blocked_s=t1 - t0, scope=scope, phase=phase,
                async_op=True,
                dtype=str(x.dtype).replace("torch.", "") if x is not None else ""))
            return out
        return traced

    def __enter__(self) -> "FunctionalCollectiveMode":
        import torch.distributed._functional_collectives as funcol
        for name in FUNCTIONAL:
            orig = getattr(funcol, name, None)
            if orig is not None:
                self._saved[name] = orig
                setattr(funcol, name, self._wrap(name, orig))
        return self

    def __exit__(self, *exc) -> None:
        import torch.distributed._functional_collectives as funcol
        for name, orig in self._saved.items():
            setattr(funcol, name, orig)
        self._saved.clear()
