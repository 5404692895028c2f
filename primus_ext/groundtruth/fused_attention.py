"""What a fused (flash) attention kernel keeps for backward, measured on real tensors.

The memory model's Transformer Engine stack (``memory/te_layer.py``) counts, per layer,
what TE's ``FusedAttnFunc`` saves: q, k, v (GQA: k and v at the KV-group count, not
expanded), the output and the fp32 softmax log-sum-exp, one per query and head; no
s x s tensor. TE has no CPU build, but PyTorch's CPU flash kernel
(``aten::_scaled_dot_product_flash_attention_for_cpu``, what
``F.scaled_dot_product_attention`` runs on a CPU for causal bf16 inputs) follows the
same save contract, so this measures it: every tensor autograd saves, deduplicated by
storage, with its bytes.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def fused_attention_saved(b: int, heads: int, groups: int, s: int, head_dim: int,
                          dtype: torch.dtype = torch.bfloat16) -> dict:
    """Bytes saved by one causal SDPA call on CPU, by role (q, k, v, out, lse, other),
    and the name of the autograd node that saved them."""
    torch.manual_seed(0)
    q = torch.randn(b, heads, s, head_dim, dtype=dtype, requires_grad=True)
    k = torch.randn(b, groups, s, head_dim, dtype=dtype, requires_grad=True)
    v = torch.randn(b, groups, s, head_dim, dtype=dtype, requires_grad=True)
    saved: dict[int, torch.Tensor] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.setdefault(t.untyped_storage().data_ptr(), t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                             enable_gqa=groups != heads)
    roles = {q.untyped_storage().data_ptr(): "q", k.untyped_storage().data_ptr(): "k",
             v.untyped_storage().data_ptr(): "v", out.untyped_storage().data_ptr(): "out"}
    by_role: dict[str, int] = {}
    for ptr, t in saved.items():
        role = roles.get(ptr)
        if role is None:
            role = "lse" if t.dtype == torch.float32 and t.dim() == 3 else "other"
        by_role[role] = by_role.get(role, 0) + t.untyped_storage().nbytes()
    return {"bytes": by_role, "node": type(out.grad_fn).__name__}
