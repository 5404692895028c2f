"""Apply every CPU compatibility patch (megatron-core 0.14-0.19, local spec, gloo).

Call ``apply_cpu_patches()`` after ``import torch`` and before building models or
process groups. It imports the megatron-core modules it patches. It is a no-op on a
machine where CUDA is available, and idempotent.
"""
from __future__ import annotations

import torch

_APPLIED: list[str] = []


def apply_cpu_patches() -> list[str]:
    """Patch torch.cuda and megatron-core for CPU; returns what was patched."""
    if torch.cuda.is_available():
        return []
    if _APPLIED:
        return list(_APPLIED)
    from patches import (checkpoint_no_te, cpu_device, cpu_rng, cpu_streams, eager_fusions,
                         mla_local, moe_cpu, sp_norm, tensor_type)
    # eager_fusions first: megatron's fusion modules bind jit_fuser when imported.
    for mod in (eager_fusions, cpu_streams, cpu_rng, cpu_device, tensor_type, sp_norm,
                moe_cpu, mla_local, checkpoint_no_te):
        _APPLIED.extend(mod.apply())
    return list(_APPLIED)
