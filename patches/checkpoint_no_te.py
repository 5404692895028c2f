"""``CheckpointWithoutOutput`` (selective ``layernorm`` / ``mla_up_proj`` / ``moe_act``
recompute) without Transformer Engine.

What it fixes (megatron-core 0.16.x; harmless where TE is present or the code differs):
``CheckpointWithoutOutput.__init__`` sets ``self.fp8 = fp8 is not None``, so ``fp8=False``
counts as FP8, and its forward then calls ``FP8GlobalStateManager.is_fp8_enabled()`` and
``activation_recompute_forward``, names ``tensor_parallel/random.py`` binds only when TE
imports: ``NameError: name 'FP8GlobalStateManager' is not defined``. Without TE no FP8
can be active, so stand-ins that say so (and no-op contexts) restore the intended path.
"""
from __future__ import annotations

import contextlib


class _NoFP8:
    @staticmethod
    def is_fp8_enabled() -> bool:
        return False

    @staticmethod
    def get_fp8_recipe():
        return None


def _null_context(*args, **kwargs):
    return contextlib.nullcontext()


def apply() -> list[str]:
    try:
        from megatron.core.tensor_parallel import random as mrandom
    except ImportError:
        return []
    if getattr(mrandom, "HAVE_TE", True):
        return []
    for name, value in (("FP8GlobalStateManager", _NoFP8),
                        ("activation_recompute_forward", _null_context),
                        ("fp8_autocast", _null_context)):
        if not hasattr(mrandom, name):
            setattr(mrandom, name, value)
    return ["tensor_parallel.random FP8 stand-ins (CheckpointWithoutOutput without TE)"]
