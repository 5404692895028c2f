"""The host time of megatron-core's combined-1F1B schedule nodes on this CPU.

With ``--overlap-moe-expert-parallel-comm`` megatron-core (>= 0.14) runs every decoder
layer of every microbatch as a ``TransformerLayerSchedulePlan`` of schedule nodes
(models/common/model_chunk_schedule_plan.py: attn, moe_dispatch, mlp, moe_combine; a
dense layer attn and mlp), each a ``TransformerLayerNode``
(models/gpt/fine_grained_callables.py) built anew for the microbatch, whose forward
detaches its inputs and outputs (``make_viewless(e).detach()``) and whose backward is one
autograd engine call of its own (``ScheduleNode.default_backward_func`` ->
``Variable._execution_engine.run_backward``), the grads of its inputs read back
(``get_grad``) and its state released (pipeline_parallel/utils.py). What a node costs the
host beyond the work it wraps is measured here with the real classes: a chain of nodes
each wrapping one elementwise op against the same ops chained plainly and differentiated
by one ``backward``. The CUDA parts of a node (``stream_acquire_context``'s
``event.wait`` / ``event.record``, the ``torch.cuda.stream`` switch, NVTX ranges,
``record_stream``) have no CPU counterpart: they are stubbed here, and the host clock
counts the two CUDA API calls per node and phase as launches (compute/host.py
``NODE_API_CALLS``).
"""
from __future__ import annotations

import contextlib
import time
from types import SimpleNamespace

NODES = 64
REPEATS = 60


class _Stub:
    """A stream or event: every CUDA call a no-op."""

    def wait(self, *a) -> None:
        pass

    def record(self, *a) -> None:
        pass


@contextlib.contextmanager
def _cuda_stubbed():
    import torch
    saved = (torch.cuda.stream, torch.cuda.nvtx.range_push, torch.cuda.nvtx.range_pop,
             torch.Tensor.record_stream)
    torch.cuda.stream = lambda s: contextlib.nullcontext()
    torch.cuda.nvtx.range_push = lambda *a, **k: None
    torch.cuda.nvtx.range_pop = lambda *a, **k: None
    torch.Tensor.record_stream = lambda self, s: None
    try:
        yield
    finally:
        (torch.cuda.stream, torch.cuda.nvtx.range_push, torch.cuda.nvtx.range_pop,
         torch.Tensor.record_stream) = saved


def _config():
    return SimpleNamespace(moe_token_dispatcher_type="alltoall",
                           moe_flex_dispatcher_backend="deepep", cuda_graph_scope=[])


def _plain(x, n: int) -> tuple[float, float]:
    t0 = time.perf_counter()
    y = x
    for _ in range(n):
        y = y * 2.0
    t1 = time.perf_counter()
    y.sum().backward()
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1


def _nodes(x, n: int) -> tuple[float, float]:
    import torch
    from megatron.core.models.gpt.fine_grained_callables import TransformerLayerNode
    stub = _Stub()
    cfg = _config()
    t0 = time.perf_counter()
    nodes = []
    y = x
    for i in range(n):
        node = TransformerLayerNode(stub, stub, SimpleNamespace(), SimpleNamespace(),
                                    lambda node, t: t * 2.0, name="attn",
                                    extra_args={"config": cfg, "is_moe": True})
        y = node.forward(y)
        nodes.append(node)
    t1 = time.perf_counter()
    g = torch.ones_like(y)
    for node in reversed(nodes):
        g = node.backward(g)
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1


def measure(nodes: int = NODES, repeats: int = REPEATS) -> dict:
    """Reference-host seconds one schedule node adds beyond the op it wraps, per phase:
    the minimum over ``repeats`` of (node chain - plain chain) / ``nodes``."""
    import torch
    torch.manual_seed(0)
    best_p = [float("inf"), float("inf")]
    best_n = [float("inf"), float("inf")]
    with _cuda_stubbed():
        for _ in range(repeats):
            x = torch.randn(4, 8, requires_grad=True)
            p = _plain(x, nodes)
            x = torch.randn(4, 8, requires_grad=True)
            q = _nodes(x, nodes)
            best_p = [min(a, b) for a, b in zip(best_p, p)]
            best_n = [min(a, b) for a, b in zip(best_n, q)]
    return {"node_fwd_s": max(best_n[0] - best_p[0], 0.0) / nodes,
            "node_bwd_s": max(best_n[1] - best_p[1], 0.0) / nodes,
            "plain_op_fwd_s": best_p[0] / nodes, "plain_op_bwd_s": best_p[1] / nodes}
