"""The aten ops a forward and its backward run, counted by torch's dispatcher (used to
check what a checkpointed block recomputes against torch itself)."""
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
