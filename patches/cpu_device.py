"""CPU device: ``torch.cuda.current_device()`` and ``device="cuda"`` literals.

What it fixes (megatron-core 0.14-0.19, local spec, no CUDA):

- ``torch.cuda.current_device()`` is the device of nearly every tensor megatron-core
  allocates (``GlobalMemoryBuffer.get_tensor``, weight init without
  ``use_cpu_initialization``, p2p buffers, DDP grad buffers, MoE router). On a CPU build
  it raises ``AssertionError: Torch not compiled with CUDA enabled``; here it returns
  ``"cpu"``, which every ``device=`` argument accepts.
- ``Tensor.cuda()`` (``language_module.py`` moves the tied embedding copy to the GPU
  before the embedding-group all-reduce, pp > 1): returns the tensor itself.
- ``device="cuda"`` literals in a few modules (causal mask in ``transformer/utils.py``,
  ``total_num_tokens`` in ``pipeline_parallel/schedules.py``, optimizer ``found_inf`` /
  ``_scale``, ``clip_grads``, ``grad_scaler``, the MoE aux-loss tracker, the rerun state
  machine): those modules get the torch proxy of ``patches/_proxy.py``.
"""
from __future__ import annotations

import importlib

import torch

from patches import _proxy

# Modules with device="cuda" literals (0.14-0.19). Missing ones are skipped: the list is
# the union over versions.
LITERAL_MODULES = (
    "megatron.core.transformer.utils",
    "megatron.core.pipeline_parallel.schedules",
    "megatron.core.optimizer.optimizer",
    "megatron.core.optimizer.grad_scaler",
    "megatron.core.optimizer.clip_grads",
    "megatron.core.optimizer.distrib_optimizer",
    "megatron.core.transformer.moe.moe_utils",
    "megatron.core.rerun_state_machine",
    "megatron.core.distributed.param_and_grad_buffer",
    "megatron.core.pipeline_parallel.p2p_communication",
    "megatron.core.utils",  # local_multi_tensor_l2_norm (grad norm without Apex)
)


def _current_device() -> str:
    return "cpu"


def _tensor_cuda(self, device=None, non_blocking=False, **kwargs):
    return self


def apply() -> list[str]:
    torch.cuda.current_device = _current_device
    torch.Tensor.cuda = _tensor_cuda
    patched = ["torch.cuda.current_device", "Tensor.cuda()"]
    for name in LITERAL_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if _proxy.install(module):
            patched.append(f"{name}.torch")
    return patched
