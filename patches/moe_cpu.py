"""MoE on CPU: a missing TE name and the alltoall split sizes.

What it fixes:

- megatron-core 0.16.x without Transformer Engine: ``moe_utils.py`` binds
  ``te_general_gemm`` only inside ``try: from ...transformer_engine import ...``, but the
  router GEMM tests ``if te_general_gemm is not None`` unconditionally, so every MoE
  forward raises ``NameError: name 'te_general_gemm' is not defined``. Defining it as None
  takes the torch path, as mcore intends without TE. (0.14 and 0.19 define it; harmless.)
- megatron-core 0.14-0.19, EP > 1 with the alltoall dispatcher: split sizes are turned
  into numpy only ``if tensor.is_cuda`` (``maybe_move_tensor_to_cpu``); a CPU tensor then
  reaches ``all_to_all_single`` and gloo raises ``TypeError: all_to_all_single():
  incompatible function arguments``. Here CPU tensors asked for ``as_numpy`` become numpy.
"""
from __future__ import annotations

import torch


def _maybe_move_tensor_to_cpu(tensor, as_numpy: bool = False, record_stream: bool = False):
    if torch.is_tensor(tensor) and as_numpy:
        return tensor.detach().cpu().numpy()
    return tensor


def apply() -> list[str]:
    patched = []
    try:
        from megatron.core.transformer.moe import moe_utils
    except ImportError:
        return patched
    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
        patched.append("moe_utils.te_general_gemm=None")
    if hasattr(moe_utils, "maybe_move_tensor_to_cpu"):
        moe_utils.maybe_move_tensor_to_cpu = _maybe_move_tensor_to_cpu
        try:
            from megatron.core.transformer.moe import token_dispatcher
            if hasattr(token_dispatcher, "maybe_move_tensor_to_cpu"):
                token_dispatcher.maybe_move_tensor_to_cpu = _maybe_move_tensor_to_cpu
        except ImportError:
            pass
        patched.append("moe split sizes -> numpy")
    return patched
