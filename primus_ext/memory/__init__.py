"""Analytic per-rank memory of a megatron-core training run (pure: no torch, no Hydra).

``memory_report(spec, options=None) -> MemoryReport`` is the entry point; the pieces:
``params`` (parameter groups), ``rank_params`` (placement and sharding per rank),
``grad_buffer`` (DDP buffers, optimizer shards), ``states`` (param/grad/optimizer bytes),
``act_layer`` and ``activations`` (saved activations per microbatch), ``inflight``
(microbatches alive per schedule), ``overhead`` (non-model memory), ``options``.
"""
from primus_ext.memory.options import MemoryOptions
from primus_ext.memory.report import MemoryReport, StageMemory, memory_report

__all__ = ["MemoryOptions", "MemoryReport", "StageMemory", "memory_report"]
