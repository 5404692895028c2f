"""``Tensor.type()`` names CPU float tensors as CUDA ones.

What it fixes (megatron-core 0.14-0.19): the optimizer checks dtypes by type string --
``clip_grads.py`` asserts ``param.grad.type() == 'torch.cuda.FloatTensor'``,
``DistributedOptimizer`` / ``Float16OptimizerWithFloat16Params`` raise ``TypeError:
Wrapped parameters must be one of torch.cuda.FloatTensor, torch.cuda.HalfTensor, or
torch.cuda.BFloat16Tensor``. Only the argument-less form is changed, and only for CPU
tensors: ``t.type(dtype)`` (a cast) is untouched.
"""
from __future__ import annotations

import torch

_original_type = torch.Tensor.type


def _type(self, dtype=None, non_blocking=False, **kwargs):
    if dtype is None and not kwargs:
        name = _original_type(self)
        if self.device.type == "cpu" and name.startswith("torch.") \
                and not name.startswith("torch.cuda."):
            return "torch.cuda." + name[len("torch."):]
        return name
    return _original_type(self, dtype, non_blocking, **kwargs)


def apply() -> list[str]:
    if torch.Tensor.type is not _type:
        torch.Tensor.type = _type
    return ["Tensor.type() -> torch.cuda.*"]
