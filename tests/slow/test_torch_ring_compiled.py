"""torch.compile of PyTorch's context_parallel ring: where Inductor puts the waits.

torchtitan compiles each TransformerBlock (``apply_compile``, fullgraph) with the CP ring
inside it. Traced, every functional collective is followed by its ``wait_tensor``
(``_functional_collectives._maybe_wrap_tensor``); Inductor's post-grad
``reorder_for_locality`` sinks a wait to its first use, but only ``if is_inference``, and
its compute/communication reordering (``config.reorder_for_compute_comm_overlap``) is off
by default. Here torch's own ring loops (installed torch,
``_context_parallel/_attention.py``; the same loops as the Dec 2024 ``_attention.py``)
are compiled by Inductor on the CPU over a fake process group and the generated code is
read: in a training graph the K/V all-gather is waited before the first flash call and
each dK/dV rotation before the next flash backward, the order
``comm/layer_comm.torch_ring_comms`` costs as exposed when compiled. An inference graph
is the contrast: there the gather's wait moves behind the local flash call.
"""
from __future__ import annotations

import re

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.slow

CP = 4


def _compiled_order(fn, *args) -> list[str]:
    """Collectives, waits and flash calls in the code Inductor generated for ``fn``."""
    from torch._inductor.utils import fresh_inductor_cache, run_and_get_code
    with fresh_inductor_cache():
        _, codes = run_and_get_code(torch.compile(fn, fullgraph=True), *args)
    pat = re.compile(r"torch\.ops\.(?:_c10d_functional|aten)\.(\w+)\.default\(")
    out = []
    for code in codes:
        for line in code.splitlines():
            s = line.strip()
            m = pat.search(s)
            if m and not s.startswith(("#", "assert")) and (
                    "c10d" in s or "flash_attention" in s):
                out.append(m.group(1))
    return out


@pytest.fixture
def ring():
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    mod = pytest.importorskip(
        "torch.distributed.tensor.experimental._context_parallel._attention")
    dist.init_process_group("fake", store=FakeStore(), rank=CP - 1, world_size=CP)
    try:
        yield mod, dist.group.WORLD
    finally:
        dist.destroy_process_group()


def _fwd(mod, g):
    def op(q, k, v, is_causal=False, **kw):
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, is_causal=is_causal)
    return lambda q, k, v: mod._templated_ring_attention(g, 2, op, q, k, v,
                                                         is_causal=True)[:2]


def _waits_at_once(order: list[str]) -> bool:
    return all(order[i + 1] == "wait_tensor" for i, n in enumerate(order)
               if n in ("all_gather_into_tensor", "all_to_all_single"))


def test_compiled_training_ring_waits_each_collective_at_once(ring):
    mod, g = ring
    q, k, v = (torch.randn(1, 2, 64, 16) for _ in range(3))
    fwd = _compiled_order(_fwd(mod, g), q.requires_grad_(True), k, v)
    assert fwd[:3] == ["all_gather_into_tensor", "wait_tensor",
                       "_scaled_dot_product_flash_attention_for_cpu"]
    assert fwd.count("_scaled_dot_product_flash_attention_for_cpu") == CP

    def op_bwd(grad_out, query, key, value, out, logsumexp, is_causal=False, **kw):
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad_out, query, key, value, out, logsumexp, 0.0, is_causal)

    def bwd(do, q, k, v, o, lse, x):
        g_q, g_k, g_v = mod._templated_ring_attention_backward(
            g, 2, op_bwd, grad_out=do, grad_out_name="grad_out", query=q, key=k,
            value=v, out=o, logsumexp=lse, is_causal=True)[:3]
        return g_q, g_k, g_v, x * 2  # x requires grad: a training graph

    t = [torch.randn(1, 2, 64, 16) for _ in range(5)]
    order = _compiled_order(bwd, *t, torch.randn(1, 2, 64), torch.randn(4, requires_grad=True))
    assert order.count("all_to_all_single") == CP
    assert order.count("_scaled_dot_product_flash_attention_for_cpu_backward") == CP
    assert _waits_at_once(fwd) and _waits_at_once(order)


def test_compiled_inference_ring_overlaps_the_gather(ring):
    mod, g = ring
    q, k, v = (torch.randn(1, 2, 64, 16) for _ in range(3))
    order = _compiled_order(_fwd(mod, g), q, k, v)
    assert order[:3] == ["all_gather_into_tensor",
                         "_scaled_dot_product_flash_attention_for_cpu", "wait_tensor"]
