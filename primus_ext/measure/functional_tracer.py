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
DTensor runs when an op first uses the output (``AsyncCollectiveTensor.trigger_wait``,
through the module's ``wait_tensor``, wrapped too): gloo runs the collective on its own
thread meanwhile, so whatever the rank computes before that use overlaps it. The record
is written at the issue and completed at that wait, as ``tracer.py`` does for an async
``torch.distributed`` call: ``seconds`` from the issue to the end of the wait,
``blocked_s`` the issue plus the wait (the time the rank was held, on its critical path;
what ``project.from_profile`` costs a modelled collective at when it matches one the
measured run issued, its in-situ path).

Unlike a ``TorchDispatchMode`` (a Python call per ATen op, which made a measured TP 2
step 27% slower than the real one), the wrappers add Python only per collective, so the
measured blocks keep the cost DTensor's own dispatch adds to a real step and little more.
"""
from __future__ import annotations

import dataclasses
import functools
import threading
import time
import weakref

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


def _pending(out) -> list:
    """The tensors of ``out`` still to be waited for (an AsyncCollectiveTensor's own)."""
    outs = out if isinstance(out, (list, tuple)) else [out]
    return [t.elem for t in outs if getattr(t, "elem", None) is not None
            and not getattr(t, "completed", True)]


class FunctionalCollectiveMode:
    """While entered, records the functional collectives into ``tracer.records`` when
    ``tracer.enabled``; the axis comes from the tracer's registered groups (by ranks)."""

    def __init__(self, tracer: CollectiveTracer) -> None:
        self.tracer = tracer
        self._saved: dict[str, object] = {}
        self._local = threading.local()
        # id(output tensor) -> [weakref to it, record, record index, issue start, blocked
        # so far]: the wait of an output completes its record.
        self._open: dict[int, list] = {}

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
            self._local.nested_s = 0.0
            try:
                t0 = time.perf_counter()
                out = orig(*args, **kwargs)
                # An input still in flight (an earlier call's output) is waited for
                # inside this call: that wait is the earlier call's, not this one's.
                issue_s = max(time.perf_counter() - t0 - self._local.nested_s, 0.0)
            finally:
                self._local.busy = False
            x = _first_tensor(args[0])
            rec = CollectiveRecord(
                op=f"_c10d_functional.{opname}", collective=collective,
                in_bytes=_nbytes(args[0]), out_bytes=_nbytes(out), group_ranks=ranks,
                axis=axis, seconds=issue_s, blocked_s=issue_s, scope=scope, phase=phase,
                async_op=True,
                dtype=str(x.dtype).replace("torch.", "") if x is not None else "")
            tracer.records.append(rec)
            pending = _pending(out)
            entry = [None, rec, len(tracer.records) - 1, t0, issue_s]
            for t in pending:
                self._open[id(t)] = [weakref.ref(t)] + entry[1:]
            return out
        return traced

    def _wrap_wait(self, orig):
        tracer, open_ = self.tracer, self._open

        @functools.wraps(orig)
        def wait_tensor(tensor):
            entry = open_.pop(id(tensor), None)
            if entry is None or entry[0]() is not tensor:
                return orig(tensor)
            t0 = time.perf_counter()
            out = orig(tensor)
            end = time.perf_counter()
            _, rec, idx, start, blocked = entry
            blocked += end - t0
            if getattr(self._local, "busy", False):
                self._local.nested_s += end - t0
            # A coalesced call completes at its last output's wait.
            siblings = [e for e in open_.values() if e[1] is rec]
            for e in siblings:
                e[4] = blocked
            if not siblings and idx < len(tracer.records) and tracer.records[idx] is rec:
                tracer.records[idx] = dataclasses.replace(
                    rec, seconds=end - start, blocked_s=min(blocked, end - start))
            return out
        return wait_tensor

    def __enter__(self) -> "FunctionalCollectiveMode":
        import torch.distributed._functional_collectives as funcol
        self._saved["wait_tensor"] = funcol.wait_tensor
        funcol.wait_tensor = self._wrap_wait(funcol.wait_tensor)
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
        self._open.clear()
