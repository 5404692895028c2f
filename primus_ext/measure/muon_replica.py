"""Muon's per-weight step, replayed op for op on this CPU: its ATen ops and host time.

Emerging-Optimizers is not a PyPI package (Megatron-LM pyproject.toml ``no_pypi_wheels``),
so the step is written out here line by line from the sources the projection cites
(project/muon_step.py): Emerging-Optimizers v0.1.0 ``OrthogonalizedOptimizer.step``
(orthogonalized_optimizer.py lines 141-179), ``_apply_weight_decay_inplace`` (mixin.py,
decoupled), ``newton_schulz`` (muon_utils.py lines 108-161, quintic coefficients) and
megatron-core 0.16.1 ``TensorParallelMuon.orthogonalize`` / ``scaled_orthogonalize_fn``
(optimizer/muon.py lines 67-90, 136-161, blockwise TP mode). Used by
``scripts/muon_host_profile.py`` (the reference host's seconds per weight) and by the
tests (the ATen ops that launch a kernel, against ``project/muon_step.weight_kernels``).
"""
from __future__ import annotations

import time

QUINTIC = [(4.0848, -6.8946, 2.9270), (3.9505, -6.3029, 2.6377),
           (3.7418, -5.5913, 2.3037), (2.8769, -3.1427, 1.2046),
           (2.8366, -3.0525, 1.2012)]


def newton_schulz(x, steps: int = 5, eps: float = 1e-7):
    import torch
    transpose = x.size(-2) > x.size(-1)
    if transpose:
        x = x.mT
    X = torch.nn.functional.normalize(x, p=2, dim=(-2, -1), eps=eps)
    if torch.get_float32_matmul_precision() == "medium":
        X = X.to(torch.bfloat16)
    for i in range(steps):
        a, b, c = QUINTIC[i % len(QUINTIC)]
        A = X @ X.mT
        B = torch.addmm(A, A, A, alpha=c, beta=b)
        X = torch.addmm(X, B, X, alpha=1.0, beta=a)
    X = X.to(torch.float32)
    if transpose:
        X = X.mT
    return X


def scaled_orthogonalize(grad, steps: int = 5, extra_scale: float = 1.0):
    orth = newton_schulz(grad, steps)
    scale = max(grad.size(-2), grad.size(-1)) ** 0.5  # get_muon_scale_factor, spectral
    return orth * scale * extra_scale


def orthogonalize(grad, split_shapes=None, steps: int = 5):
    import torch
    if split_shapes is None:
        return scaled_orthogonalize(grad, steps)
    shape = grad.shape
    groups = shape[0] // sum(split_shapes)
    parts = torch.split(grad.view(groups, sum(split_shapes), -1), split_shapes, dim=1)
    parts = [g.reshape(-1, shape[-1]) for g in parts]
    parts = [scaled_orthogonalize(g, steps).view(groups, -1, shape[-1]) for g in parts]
    return torch.cat(parts, dim=1).view(shape)


def weight_step(p, grad, buf, *, split_shapes=None, steps: int = 5, lr: float = 1e-4,
                weight_decay: float = 0.01, momentum: float = 0.95,
                nesterov: bool = False) -> None:
    """One Muon step on one weight ``p`` (fp32 master) with its momentum ``buf``."""
    import torch
    if weight_decay != 0.0:
        p.add_(p, alpha=-weight_decay * lr)
    buf.lerp_(grad, 1 - momentum)
    g = grad.lerp(buf, momentum) if nesterov else buf
    prev = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("medium")
    try:
        g = orthogonalize(g, split_shapes, steps)
    finally:
        torch.set_float32_matmul_precision(prev)
    p.add_(g, alpha=-lr)


def _tensors(rows: int, cols: int):
    import torch
    g = torch.Generator().manual_seed(0)
    return (torch.randn(rows, cols, generator=g), torch.randn(rows, cols, generator=g),
            torch.zeros(rows, cols))


def count_kernels(rows: int, cols: int, **kw) -> int:
    """ATen ops of one weight's step that launch a kernel (views and allocations do
    not: measure/host_profile.py ``NO_KERNEL``)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from primus_ext.measure.host_profile import NO_KERNEL
    # ``reshape`` of a strided slice dispatches ``clone`` then ``_unsafe_view``, which
    # aliases the clone's storage (no kernel) without being flagged a view.
    skip = NO_KERNEL | {"_unsafe_view"}
    n = [0]

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not (func.is_view or func.overloadpacket.__name__ in skip):
                n[0] += 1
            return func(*args, **(kwargs or {}))

    p, grad, buf = _tensors(rows, cols)
    with torch.no_grad(), Count():
        weight_step(p, grad, buf, **kw)
    return n[0]


def seconds_per_weight(rows: int, cols: int, repeats: int = 200, **kw) -> float:
    """Minimum host seconds of one weight's step with tiny tensors (the op work is
    negligible: what remains is Python, dispatch and allocation)."""
    import torch
    p, grad, buf = _tensors(rows, cols)
    best = float("inf")
    with torch.no_grad():
        for _ in range(10):
            weight_step(p, grad, buf, **kw)
        for _ in range(repeats):
            t = time.perf_counter()
            weight_step(p, grad, buf, **kw)
            best = min(best, time.perf_counter() - t)
    return best
