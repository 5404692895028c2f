"""CPU gaps the shared patches (``patches/``) do not cover yet, for the measured backend.

Each entry says what breaks without it. They reuse ``patches._proxy`` (device literals)
and are a no-op on CUDA. When ``patches/`` covers one, it is skipped here.

- ``megatron.core.utils.local_multi_tensor_l2_norm`` (0.16.1, no apex): the gradient
  norm of ``optimizer.step()`` does ``torch.tensor(..., device="cuda")`` and raises
  ``Torch not compiled with CUDA enabled``.
"""
from __future__ import annotations

import importlib

import torch

EXTRA_LITERAL_MODULES = ("megatron.core.utils",)


def apply_measure_compat() -> list[str]:
    if torch.cuda.is_available():
        return []
    from patches import _proxy
    done = []
    for name in EXTRA_LITERAL_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        already = getattr(getattr(module, "torch", None), "__is_primus_proxy__", False)
        if not already and _proxy.install(module):
            done.append(f"{name}.torch (primus_ext.measure.compat)")
    return done
