"""CPU RNG: megatron-core's CUDA RNG tracker backed by the CPU generator.

What it fixes (megatron-core 0.14-0.19, no CUDA): ``model_parallel_cuda_manual_seed``
calls ``torch.cuda.manual_seed`` / ``get_rng_state`` and the tracker's
``_get_cuda_rng_state`` / ``_set_cuda_rng_state``, which raise ``Torch not compiled with
CUDA enabled``. Skipping the seed call instead fails later with ``cuda rng state
model-parallel-rng is not added`` (``dot_product_attention.py``). Here the tracker's
states are CPU generator states, so TP-rank-specific dropout streams still differ per rank
and fork/restore behave as on GPU.

``torch.cuda.manual_seed_all`` is left alone: ``torch.manual_seed`` calls it, and routing
it to ``torch.manual_seed`` recurses forever.
"""
from __future__ import annotations

import logging

import torch


def _get_state(*args, **kwargs) -> torch.Tensor:
    return torch.get_rng_state()


def _set_state(new_state, *args, **kwargs) -> None:
    torch.set_rng_state(new_state)


def _manual_seed(seed: int) -> None:
    torch.default_generator.manual_seed(int(seed))


def apply() -> list[str]:
    torch.cuda.get_rng_state = _get_state
    torch.cuda.set_rng_state = _set_state
    torch.cuda.manual_seed = _manual_seed
    patched = ["torch.cuda.get/set_rng_state", "torch.cuda.manual_seed"]
    try:
        from megatron.core.tensor_parallel import random as mrandom
    except ImportError:
        return patched
    mrandom._get_cuda_rng_state = _get_state
    mrandom._set_cuda_rng_state = _set_state
    # The tracker warns when the CPU state changes inside a fork; on CPU it always does,
    # since the forked "CUDA" state is the CPU generator.
    logging.getLogger(mrandom.__name__).setLevel(logging.ERROR)
    patched.append("tensor_parallel.random._get/_set_cuda_rng_state")
    return patched
