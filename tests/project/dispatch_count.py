"""The aten ops a forward and its backward run, counted by torch's dispatcher (used to
check what a checkpointed block recomputes, and what elementwise chains move, against
torch itself)."""
from __future__ import annotations


def forward_backward_ops(forward) -> tuple[list[str], list[str]]:
    """(op names of ``forward()``, op names of ``forward().sum().backward()``)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    c = Count()
    with c:
        y = forward()
        n_fwd = len(c.ops)
        y.sum().backward()
    return c.ops[:n_fwd], c.ops[n_fwd:]


def forward_backward_traffic(forward) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """([(op, bytes)] of ``forward()``, the same of its backward from a ones seed): every
    non-view op is one kernel moving the bytes of its tensor inputs and outputs."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    ops: list[tuple[str, int]] = []

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if not func.is_view and "_unsafe_view" not in str(func):
                tensors = tree_flatten((args, kwargs))[0] + tree_flatten(out)[0]
                ops.append((func.overloadpacket.__name__,
                            sum(t.numel() * t.element_size() for t in tensors
                                if isinstance(t, torch.Tensor))))
            return out

    seed = torch.ones_like(forward())
    with Count():
        y = forward()
        n = len(ops)
        y.backward(seed)
    return ops[:n], ops[n:]
