"""A stand-in for the ``torch`` module inside chosen megatron-core modules.

megatron-core writes ``device="cuda"`` literally in tensor factories (the causal mask,
schedules' token counter, optimizer scalars, grad scaler, clip_grads, MoE aux-loss
tracker). Rebinding the name ``torch`` in those modules to this proxy rewrites the device
of a small set of factory functions and of ``torch.autocast``; every other attribute is
torch's own. A TorchFunctionMode would catch every literal but costs a Python call per
op on the whole model, which distorts per-layer timings; this costs nothing elsewhere.
"""
from __future__ import annotations

import functools
import types

import torch

_FACTORIES = ("tensor", "zeros", "ones", "empty", "full", "arange", "randn", "rand",
              "randint", "zeros_like", "ones_like", "empty_like", "full_like", "as_tensor")


def _cpu(device):
    if isinstance(device, str) and device.startswith("cuda"):
        return "cpu"
    if isinstance(device, torch.device) and device.type == "cuda":
        return torch.device("cpu")
    if isinstance(device, int):
        return "cpu"
    return device


def _wrap_factory(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if "device" in kwargs:
            kwargs["device"] = _cpu(kwargs["device"])
        return fn(*args, **kwargs)
    return wrapper


def _autocast(device_type="cuda", *args, **kwargs):
    return torch.autocast(_cpu(device_type) if isinstance(device_type, str) else device_type,
                          *args, **kwargs)


class TorchProxy(types.ModuleType):
    """``torch`` with cuda device literals in factories mapped to the CPU."""

    def __init__(self) -> None:
        super().__init__("torch")
        for name in _FACTORIES:
            setattr(self, name, _wrap_factory(getattr(torch, name)))
        self.autocast = _autocast
        self.__is_primus_proxy__ = True

    def __getattr__(self, name):
        return getattr(torch, name)


PROXY = TorchProxy()


def install(module) -> bool:
    """Rebind ``module.torch`` to the proxy; False if the module has no ``torch``."""
    if getattr(module, "torch", None) is None:
        return False
    if getattr(module.torch, "__is_primus_proxy__", False):
        return True
    module.torch = PROXY
    return True
