"""Host work the MoE schedule and the scoped CUDA graphs add to, or take from, a layer.

**Combined 1F1B** (``parallel.overlap_moe_expert_parallel_comm``, megatron-core 0.16
pipeline_parallel/combined_1f1b.py, models/common/model_chunk_schedule_plan.py,
models/gpt/fine_grained_callables.py). Every microbatch's model chunk is built into a
schedule plan and every decoder layer into schedule nodes: an MoE layer four (``attn``:
attention, pre-MLP norm, router and dispatch preprocess; ``moe_dispatch``; ``mlp``: the
experts; ``moe_combine``), a dense layer two (``attn``, ``mlp``), an MTP layer a fifth
(``mtp_post_process``). Each node, forward and backward alike, waits on the chunk's CUDA
event on its stream and records it after (``stream_acquire_context``: two CUDA API
calls, ``NODE_API_CALLS``), detaches its inputs and outputs, and runs its backward as an
autograd engine call of its own; the Python of a node beyond the op it wraps is measured
on the reference host (``data/host/schedule_node.json``, scripts/schedule_node_profile.py).
The warm-up forwards and cool-down backwards run as plans too (a plan with one side
empty), so every microbatch pays it. ``--delay-wgrad-compute`` moves the weight
gradients into ``backward_dw`` calls of the same nodes: the same kernels, issued later.

**Scoped CUDA graphs of the MoE layer** (``train.cuda_graph_scope`` 'moe_router',
'moe_preprocess'; megatron-core transformer_layer.py ``_te_cuda_graph_capture`` /
``_forward_mlp_router``, moe_layer.py ``MoELayer.forward``): 'moe_router' captures the
pre-MLP norm, the shared experts and the router with its loss terms
(``route``, ``shared_experts_compute``), forward and backward; 'moe_preprocess' also the
dispatcher's ``dispatch_preprocess``: the token-count all-gather, the split metadata
and the first permutation (megatron-core moves the device-to-host copy of the counts to
``before_ep_alltoall``, after the graph: the host still waits once, outside it). The
all-to-alls, the experts, the later permutations and the combine run eagerly. With
``transformer_engine`` the router part is the tail of the layer's graph when 'attn' is in
scope too (one replay), else a graph of its own (one more replay); ``local``
(``CudaGraphManager`` per function: ``_forward_mlp_router`` and ``_forward_mlp_postprocess``)
is costed the same (the spec does not carry the implementation).
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from primus_ext.compute.host import (REPLAY, ROUTER_TERM_KERNELS, HostWork,
                                     dense_mlp_python, moe_base_kernels, moe_base_python)

NODE_PATH = Path(__file__).resolve().parent.parent / "data" / "host" / "schedule_node.json"
# CUDA API calls of one node per phase: the event's wait on the node's stream before and
# its record after (pipeline_parallel/utils.py stream_acquire_context).
NODE_API_CALLS = 2
# Ops the router scope captures (compute/layer_ops.py names), and the preprocess scope.
ROUTER_OPS = frozenset({"pre_mlp_layernorm", "router", "router_topk"})
PREPROCESS_OPS = frozenset({"permute"})
# The dispatcher's metadata collective inside dispatch_preprocess (comm/moe_comm.py).
PREPROCESS_COMMS = frozenset({"moe.ep_token_counts"})
# Collectives the host's token-count wait follows (comm/moe_comm.py): the counts gather
# and HybridEP's routing-map all-gather.
PRE_SYNC_COMMS = PREPROCESS_COMMS | {"moe.ep_hybridep_routing_map"}
# Share of the unfused permutation's host work (compute/host.py moe_base_python's
# permutation half: metadata, permute, sort, unsort, unpermute) that dispatch_preprocess
# issues: the metadata and the first permutation, about half.
PREPROCESS_SHARE = 0.5


@lru_cache(maxsize=1)
def node_profile() -> dict:
    return json.loads(NODE_PATH.read_text())


def schedule_nodes(moe: bool, mtp: bool = False) -> int:
    """Schedule nodes of one layer (model_chunk_schedule_plan.py)."""
    return (4 if moe else 2) + (1 if mtp else 0)


def node_work(spec, moe: bool, mtp: bool = False) -> tuple[HostWork, HostWork]:
    """(forward, backward) host work of a layer's schedule nodes under the combined
    1F1B schedule; none without it."""
    if not spec.parallel.overlap_moe_expert_parallel_comm:
        return HostWork(), HostWork()
    n = schedule_nodes(moe, mtp)
    p = node_profile()
    return (HostWork(n * p["node_fwd_s"], n * NODE_API_CALLS),
            HostWork(n * p["node_bwd_s"], n * NODE_API_CALLS))


def moe_scopes(spec) -> frozenset[str]:
    """The partial MoE capture the scope asks for: 'router', with 'preprocess' (which
    megatron-core accepts only beside moe_router)."""
    scope = set(spec.train.cuda_graph_scope)
    if "moe_router" not in scope:
        return frozenset()
    return frozenset({"router"} | ({"preprocess"} if "moe_preprocess" in scope else set()))


def captured_ops(spec) -> frozenset[str]:
    return _scope_ops(spec, moe_scopes(spec))


def pre_sync_scopes(spec) -> frozenset[str]:
    """The MoE block's parts issued before its synchronisation: the router part, and
    with the ``alltoall`` dispatcher its ``dispatch_preprocess`` (megatron-core 0.16
    token_dispatcher.py: the counts are copied to the host before permutation 1 and
    waited for before the all-to-all, ``cuda_sync_point = "before_ep_alltoall"``); the
    ``allgather`` and ``flex`` dispatchers read them back after their gather /
    dispatch."""
    if spec.parallel.moe_token_dispatcher_type == "alltoall":
        return frozenset({"router", "preprocess"})
    return frozenset({"router"})


def _scope_ops(spec, scopes: frozenset[str]) -> frozenset[str]:
    out = set(ROUTER_OPS) if "router" in scopes else set()
    if "preprocess" in scopes and spec.parallel.moe_token_dispatcher_type != "flex":
        out |= PREPROCESS_OPS
    return frozenset(out)


def post_sync_device_s(spec, ops, comms) -> float:
    """Device seconds of an MoE block's forward after its synchronisation: its ops past
    the pre-sync part and its exposed forward collectives but the token-count gather."""
    post = post_sync_ops(spec, ops)
    return sum(o.fwd_s for o in ops if o.name in post) + sum(
        c.exposed_s for c, mod in comms if c.phase == "fwd" and mod == "moe"
        and c.name not in PRE_SYNC_COMMS)


def post_sync_ops(spec, ops) -> frozenset[str]:
    """The MoE block's ops issued after its synchronisation (``post_sync_device_s``'s)."""
    pre = _scope_ops(spec, pre_sync_scopes(spec))
    return frozenset(o.name for o in ops if o.name not in pre
                     and o.module != "shared_experts")


def captured_moe_work(spec, ops, comms, fill: int,
                      scopes: frozenset[str] | None = None) -> tuple[HostWork, HostWork]:
    """(forward, backward) host work of an MoE block that its router (and preprocess)
    graph replaces (``scopes``: those parts instead of the spec's graph scope): the
    captured ops' kernels (``fill`` per kernel: deterministic fills), the router half of
    the block's own Python and kernels with the router terms, the shared experts
    (Python, TE calls; their ops are ``shared_experts``), and with the preprocess its
    share of the permutation half and the token-count gather."""
    s = moe_scopes(spec) if scopes is None else scopes
    if not s:
        return HostWork(), HostWork()
    p, m = spec.parallel, spec.model
    names = _scope_ops(spec, s)
    mine = [o for o in ops if o.name in names or o.module == "shared_experts"]
    base = moe_base_python()
    kb = moe_base_kernels(p.moe_router_fusion, p.moe_permute_fusion, split=True)
    out = []
    for i, ph in enumerate(("fwd", "bwd")):
        py = base[i] / 2 * (0.0 if p.moe_router_fusion else 1.0)
        kern = kb[i][0]
        te = 1 if p.moe_router_fusion else 0
        for term in p.moe_router_terms:
            kern += ROUTER_TERM_KERNELS[term][1 if p.moe_router_fusion else 0][i]
        if m.moe_shared_expert_intermediate_size:
            py += dense_mlp_python(m)[i]
            te += 2
        colls = 0
        if "preprocess" in s:
            py += base[i] / 2 * (0.0 if p.moe_permute_fusion else PREPROCESS_SHARE)
            kern += kb[i][1] * (1.0 if p.moe_permute_fusion else PREPROCESS_SHARE)
            te += 1 if p.moe_permute_fusion else 0
            colls = sum(c.calls for c, _ in comms if c.name in PREPROCESS_COMMS
                        and c.phase == ph)
        kern += fill * sum(o.fwd_kernels if i == 0 else o.bwd_kernels for o in mine)
        out.append(HostWork(py, kern, te, colls))
    return out[0], out[1]


def partial_capture(spec, work: tuple[HostWork, HostWork], ops, comms, fill: int,
                    attn_graphed: bool) -> tuple[tuple[HostWork, HostWork], HostWork]:
    """The MoE block's (forward, backward) host work under a router / preprocess graph:
    what is left eager, plus one replay unless the layer's attention graph holds it;
    and the forward's host work after the block's synchronisation (never captured)."""
    f, b = work
    post = f.minus(captured_moe_work(spec, ops, comms, fill, pre_sync_scopes(spec))[0])
    cf, cb = captured_moe_work(spec, ops, comms, fill)
    if cf == HostWork() and cb == HostWork():
        return work, post
    f, b = f.minus(cf), b.minus(cb)
    if not attn_graphed:
        f, b = f + REPLAY, b + REPLAY
    return (f, b), post

