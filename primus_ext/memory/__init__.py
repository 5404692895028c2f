"""Analytic per-rank memory of a megatron-core training run (pure: no torch, no Hydra).

``memory_report(spec, options=None) -> MemoryReport`` is the entry point; the pieces:
``params`` (parameter groups), ``rank_params`` (placement and sharding per rank),
``grad_buffer`` (DDP buffers, optimizer shards), ``states`` (param/grad/optimizer bytes),
``act_layer`` and ``activations`` (saved activations per microbatch), ``inflight``
(microbatches alive per schedule), ``overhead`` (non-model memory), ``options``.
"""
import sys
import types

from primus_ext.memory.options import MemoryOptions
from primus_ext.memory.report import MemoryReport, StageMemory, memory_report

__all__ = ["MemoryOptions", "MemoryReport", "StageMemory", "memory_report"]


class _CallableModule(types.ModuleType):
    """``primus_ext.memory(spec)`` is the public API; Python binds this subpackage as the
    attribute ``memory`` of ``primus_ext`` once imported, so the package itself calls
    ``memory_report``."""

    def __call__(self, spec, options=None):
        from primus_ext.spec.run import require_spec
        require_spec("memory", spec)
        return memory_report(spec, options)


sys.modules[__name__].__class__ = _CallableModule
