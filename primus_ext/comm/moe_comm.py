"""MoE token dispatch and combine: bytes on each link tier and the overlap rules.

Per microbatch and MoE layer a rank holds ``T = sp_tokens`` tokens of width ``h``, each
routed to ``k = moe_router_topk`` experts; the EP group spans ``K`` scale-up domains
(nodes) with ``g`` EP ranks in each (comm/groups.py).

Dispatchers (``parallel.moe_token_dispatcher_type``, megatron-core):

- ``alltoall``: one copy per (token, expert) pair: ``T k h`` bytes, of which
  ``(n - g) / n`` leave the domain and ``(g - 1) / n`` cross the scale-up links
  (``collectives.all_to_all_s``). Combine mirrors dispatch; backward mirrors both.
- ``flex`` (DeepEP / HybridEP kernels, DeepSeek-V3 Sec. 3.2.2; ``flex_dispatch_s``): the
  tokens go unpermuted, once to every EP rank holding one of their experts
  (``routing.ranks_hit``) at the backend's algorithm bandwidth inside the domain
  (published DeepEP / HybridEP figures at the kernels' SM count:
  ``hardware.flex_efficiency`` at ``flex_num_sms``), and at most once per destination
  domain over the network, fanned out over the scale-up links there: the network
  carries ``T h x E[remote domains hit]`` bytes.
  With group-limited routing (``moe_router_num_groups`` / ``moe_router_group_topk``) a
  token reaches few domains: DeepSeek-V3 on EP 64 over 8 nodes, 8 groups of 32 experts,
  top-4 groups, top-8 experts: 3.5 remote nodes instead of 7 remote copies.
  NeMo AutoModel's ``FakeBalancedGate`` (``train.moe_router_exact_balance``) gives each
  token ``k`` consecutive experts (``routing.consecutive_blocks_hit``): on the same
  layout 2 ranks of one node, remote for 7 tokens in 8.
- ``allgather``: the EP group's tokens are all-gathered (``T h ep`` bytes) and the
  expert outputs reduce-scattered; backward mirrors.

Metadata of the ``alltoall`` dispatcher (``METADATA_OPS``, megatron-core 0.14-0.19
``MoEAlltoAllTokenDispatcher``): ``preprocess`` all-gathers every rank's tokens per expert
(``E`` int64 values) over the expert tensor-and-expert group before the dispatch can be
sized, and ``token_dispatch`` sends the routing weights of the routed rows (``T k`` values
of the activation dtype) in a second all-to-all beside the tokens, whose backward sends
their gradients back. Few bytes, but each is one more latency-bound collective per MoE
layer and microbatch (on a CPU over gloo, about a millisecond each). The ``allgather``
dispatcher all-gathers the routing map (``T E`` booleans) and the router probabilities
(``T E`` values; their gradient is reduce-scattered back) beside the tokens.

Expected ranks and domains hit under uniform routing: compute/routing.py
``expected_domains_hit`` (a domain holds ``E / K`` consecutive experts).

Overlap (``exposed`` windows, comm/overlap.py):

- ``overlap_moe_expert_parallel_comm`` (megatron-core >= 0.14, "EP A2A overlap"): in the
  steady state of the 1F1B schedules the forward of one microbatch and the backward of
  another run merged, layer by layer, and each one's dispatch / combine hides behind the
  other's compute (with ``delay_wgrad_compute`` the weight gradients fill the gaps). The
  window of the layer's four collectives is the layer's forward plus backward compute.
  Warm-up forwards and cool-down backwards are not merged: that fraction of microbatches
  keeps its collectives exposed.
- The ``flex`` dispatcher's kernels hold ``flex_num_sms`` SMs while they run (the launch
  line's --moe-deepep-num-sms / --moe-hybridep-num-sms, else megatron-core's defaults:
  ``TransformerConfig.moe_deepep_num_sms = 20``, passed to DeepEP's
  ``Buffer.set_num_sms``; HybridEP ``moe_hybridep_num_sms = 16``): the compute they
  overlap runs on the other SMs, so each second of overlap costs ``20 / sm_count`` of a
  second of compute (H100: 0.15), above the generic ``comm_overlap_penalty`` of NCCL's
  channels (``overlap.sm_share_penalty``).
- ``moe_shared_expert_overlap``: the shared experts run while the routed tokens travel:
  forward collectives hide behind the shared experts' forward, backward behind theirs.
- Otherwise dispatch and combine are exposed.
"""
from __future__ import annotations

from primus_ext.comm.collectives import _mesh_share, all_gather_s, network_and_link_s, \
    out_tier_s, reduce_scatter_s
from primus_ext.comm.groups import group_span
from primus_ext.comm.overlap import exposed_s, sm_share_penalty
from primus_ext.compute.costs import CommOp
from primus_ext.compute.routing import consecutive_blocks_hit, expected_domains_hit, \
    ranks_hit
from primus_ext.spec.run import RunSpec

_EP_OPS = (("dispatch", "fwd"), ("combine", "fwd"), ("combine_bwd", "bwd"),
           ("dispatch_bwd", "bwd"))
# SMs the flex dispatcher's DeepEP kernels take (megatron-core transformer_config.py
# moe_deepep_num_sms, default 20; the DeepEP backend is megatron-core's default for flex).
DEEPEP_NUM_SMS = 20
# HybridEP's (transformer_config.py moe_hybridep_num_sms, default 16).
HYBRIDEP_NUM_SMS = 16
# The dispatchers' metadata collectives (op names; see the module docstring).
METADATA_OPS = ("moe.ep_token_counts", "moe.ep_dispatch_probs", "moe.ep_dispatch_probs_bwd",
                "moe.ep_gather_routing_map", "moe.ep_gather_probs", "moe.ep_gather_probs_bwd")
# HybridEP's routing-map all-gather ahead of its token-count read-back.
HYBRIDEP_ROUTING_MAP = "moe.ep_hybridep_routing_map"


def flex_num_sms(par) -> int:
    """SMs of the flex dispatcher's kernels (``par``: ParallelSpec): the launch line's, else
    the backend's megatron-core default."""
    if par.moe_flex_num_sms is not None:
        return par.moe_flex_num_sms
    return HYBRIDEP_NUM_SMS if par.moe_flex_dispatcher_backend == "hybridep" else \
        DEEPEP_NUM_SMS


def _ep_bytes(spec: RunSpec, tokens: float, width_bytes: float) -> tuple[float, float]:
    """(scale-up bytes, network bytes) of one all-to-all dispatch on one rank."""
    m = spec.model
    span = group_span(spec, "ep")
    n, g = span.size, span.ranks_per_domain
    copies = tokens * m.moe_router_topk * width_bytes
    return copies * (g - 1) / n, copies * (n - g) / n


def flex_dispatch_s(spec: RunSpec, span, tokens: float, width_bytes: float) -> float:
    """One DeepEP / HybridEP dispatch (or combine) of ``tokens`` tokens on one rank.

    The kernels send a token once to every EP rank that holds one of its experts
    (``routing.ranks_hit``; megatron-core ``_DeepepManager.dispatch`` passes the token
    indices, not permuted copies) at the backend's algorithm bandwidth inside the
    scale-up domain (``hardware.flex_efficiency`` at ``flex_num_sms``: published
    figures that count every (token, rank) copy), and once to every other domain that
    holds one over the NIC (``expected_domains_hit``), forwarded over the scale-up links
    there; the two tiers run concurrently. The network tier runs at the kernels' published
    RDMA rate where the preset has one (``hardware.flex_network_efficiency``: a token
    once per domain hit, its own included, as DeepEP's ``test_internode.py`` and
    HybridEP's ``count_rdma_send_from_routing_map`` count it), else the remote domains'
    copies at the NIC's all-to-all efficiency."""
    m, hw = spec.model, spec.cluster.hardware
    n, kd = span.size, span.num_domains
    backend = spec.parallel.moe_flex_dispatcher_backend
    eff = hw.flex_efficiency(backend, flex_num_sms(spec.parallel))
    eff = eff or hw.scale_up_a2a_efficiency
    share = _mesh_share(hw, span, span.ranks_per_domain)
    consecutive = spec.train.moe_router_exact_balance
    per_rank = ranks_hit(m, n, consecutive)
    t_up = tokens * width_bytes * per_rank / (hw.scale_up_gbps * 1e9 * eff * share)
    t_out = 0.0
    if kd > 1:
        dom = (consecutive_blocks_hit(m.num_moe_experts, m.moe_router_topk, kd)
               if consecutive else
               expected_domains_hit(m.num_moe_experts, m.moe_router_topk, kd,
                                    m.moe_router_num_groups, m.moe_router_group_topk))
        net = hw.flex_network_efficiency(backend, kd)
        t_out = (tokens * width_bytes * dom / (hw.scale_out_gbps * 1e9 * net) if net
                 else out_tier_s(hw, tokens * width_bytes * dom * (kd - 1) / kd))
    base = hw.scale_up_latency_s if kd == 1 else hw.scale_out_latency_s
    return base + max(t_up, t_out)


def ep_comm_ops(spec: RunSpec, tokens: float, width_bytes: float, *,
                layer_compute_s: float, shared_fwd_s: float, shared_bwd_s: float,
                busiest: float = 1.0) -> list[CommOp]:
    """The EP collectives of one MoE layer for one microbatch, with their exposure.

    ``layer_compute_s``: the layer's forward + backward compute (the merged-schedule
    window); ``shared_*_s``: the shared experts' compute of each phase; ``busiest``: the
    busiest EP rank's routed rows over the mean (``layer_ops.routing_spread_factor``):
    every rank sends ``T k`` rows, but a token all-to-all ends when the busiest rank has
    received (dispatch) or sent back (combine) its rows, so its time scales by it;
    ``num_bytes`` stays the mean rank's."""
    par = spec.parallel
    hw = spec.cluster.hardware
    span = group_span(spec, "ep")
    if span.size <= 1:
        return []
    if par.moe_token_dispatcher_type == "allgather":
        nbytes = tokens * width_bytes * span.size
        one = {"dispatch": all_gather_s(hw, span, nbytes),
               "combine": reduce_scatter_s(hw, span, nbytes)}
        secs = {n: one[n.split("_")[0]] for n, _ in _EP_OPS}
        coll = {"dispatch": "all_gather", "combine": "reduce_scatter",
                "combine_bwd": "all_gather", "dispatch_bwd": "reduce_scatter"}
        size = nbytes
    elif par.moe_token_dispatcher_type == "flex":
        t = flex_dispatch_s(spec, span, tokens * busiest, width_bytes)
        secs = {n: t for n, _ in _EP_OPS}
        coll = {n: "all_to_all" for n, _ in _EP_OPS}
        size = tokens * ranks_hit(spec.model, span.size,
                                  spec.train.moe_router_exact_balance) * width_bytes
    else:
        up, out = _ep_bytes(spec, tokens * busiest, width_bytes)
        t = network_and_link_s(hw, span, up, out, a2a=True)
        secs = {n: t for n, _ in _EP_OPS}
        coll = {n: "all_to_all" for n, _ in _EP_OPS}
        size = tokens * spec.model.moe_router_topk * width_bytes
    total = sum(secs.values())
    merged = merged_fraction(spec) if par.overlap_moe_expert_parallel_comm else 0.0
    pen = (sm_share_penalty(hw, flex_num_sms(par))
           if par.moe_token_dispatcher_type == "flex" else None)
    ops = []
    for name, phase in _EP_OPS:
        s = secs[name]
        if merged > 0:
            window = layer_compute_s * s / total
            exp = merged * exposed_s(hw, s, window, penalty=pen) + (1 - merged) * s
        elif par.moe_shared_expert_overlap and (shared_fwd_s or shared_bwd_s):
            w = shared_fwd_s if phase == "fwd" else shared_bwd_s
            # two collectives per phase share the window
            exp = exposed_s(hw, s, w / 2, penalty=pen)
        else:
            exp = s
        ops.append(CommOp(name=f"moe.ep_{name}", axis="ep", collective=coll[name],
                          num_bytes=int(size), group_size=span.size, phase=phase,
                          seconds=s, exposed_s=exp))
    if par.moe_token_dispatcher_type == "alltoall":
        share = {op.phase: op.exposed_s / op.seconds for op in ops
                 if op.name in ("moe.ep_dispatch", "moe.ep_dispatch_bwd") and op.seconds > 0}
        ops += _metadata_ops(spec, span, tokens, width_bytes / spec.model.hidden_size,
                             share)
    elif par.moe_token_dispatcher_type == "allgather":
        ops += _allgather_metadata_ops(spec, span, tokens,
                                       width_bytes / spec.model.hidden_size)
    elif (par.moe_token_dispatcher_type == "flex"
          and par.moe_flex_dispatcher_backend == "hybridep"):
        ops.append(hybridep_routing_map_op(spec, span, tokens))
    return ops


def hybridep_routing_map_op(spec: RunSpec, span, tokens: float) -> CommOp:
    """HybridEP's routing-map all-gather (``HYBRIDEP_ROUTING_MAP``): before its metadata
    kernel, every dispatch that is not handed a cached handle gathers each EP rank's
    ``T x E`` boolean routing map over the EP group (DeepEP hybrid-ep
    ``csrc/hybrid_ep/hybrid_ep.cu`` ``metadata_preprocessing`` ->
    ``csrc/hybrid_ep/executor/executor.cu`` ``Executor::allgather_routing_map``: NCCL
    ``all_gather_into_tensor`` when the group spans nodes, a custom NVLink all-gather
    kernel inside one; the Python ``HybridEPBuffer.dispatch`` of deep_ep/hybrid_ep_buffer.py
    @098da2a6 calls ``torch.distributed.all_gather_into_tensor`` on it whenever no handle
    is passed). Forward only: the backward dispatch and combine reuse the forward's
    handle (megatron-core 0.16 fused_a2a.py ``HybridEPCombine.backward``). Exposed: the
    token counts the host then waits for (``cudaStreamSynchronize`` in
    ``dispatch_preprocess``) depend on it."""
    hw = spec.cluster.hardware
    nbytes = tokens * spec.model.num_moe_experts * span.size
    t = all_gather_s(hw, span, nbytes)
    return CommOp(name=HYBRIDEP_ROUTING_MAP, axis="ep", collective="all_gather",
                  num_bytes=int(nbytes), group_size=span.size, phase="fwd", seconds=t,
                  exposed_s=t)


def _allgather_metadata_ops(spec: RunSpec, span, tokens: float, value_bytes: float
                            ) -> list[CommOp]:
    """The routing map and the probabilities gathered beside the tokens (forward); the
    probabilities' gradient reduce-scattered (backward). Exposed, as the tokens' are."""
    hw = spec.cluster.hardware
    rows = tokens * spec.model.num_moe_experts * span.size
    out = []
    for name, coll, phase, nbytes in (
            (METADATA_OPS[3], "all_gather", "fwd", rows),
            (METADATA_OPS[4], "all_gather", "fwd", rows * value_bytes),
            (METADATA_OPS[5], "reduce_scatter", "bwd", rows * value_bytes)):
        t = (all_gather_s if coll == "all_gather" else reduce_scatter_s)(hw, span, nbytes)
        out.append(CommOp(name=name, axis="ep", collective=coll, num_bytes=int(nbytes),
                          group_size=span.size, phase=phase, seconds=t, exposed_s=t))
    return out


def _metadata_ops(spec: RunSpec, span, tokens: float, value_bytes: float,
                  exposed_share: dict[str, float]) -> list[CommOp]:
    """Token counts (all-gather, forward) and the routing weights' all-to-all (forward
    and backward) of the ``alltoall`` dispatcher. The counts gather is followed by a
    device-to-host sync that no schedule hides; the weights travel with the tokens and
    share their overlap."""
    hw = spec.cluster.hardware
    m, par = spec.model, spec.parallel
    group = span.size * par.expert_tp
    counts = m.num_moe_experts * 8 * group
    t = all_gather_s(hw, span, counts)
    ops = [CommOp(name=METADATA_OPS[0], axis="ep", collective="all_gather",
                  num_bytes=int(counts), group_size=span.size, phase="fwd", seconds=t,
                  exposed_s=t)]
    up, out = _ep_bytes(spec, tokens, value_bytes)
    t = network_and_link_s(hw, span, up, out, a2a=True)
    size = tokens * m.moe_router_topk * value_bytes
    for name, phase in zip(METADATA_OPS[1:], ("fwd", "bwd")):
        ops.append(CommOp(name=name, axis="ep", collective="all_to_all", num_bytes=int(size),
                          group_size=span.size, phase=phase, seconds=t,
                          exposed_s=exposed_share.get(phase, 1.0) * t))
    return ops


def merged_fraction(spec: RunSpec) -> float:
    """Share of a stage's forward passes that run merged with another microbatch's
    backward (megatron-core's combined 1F1B): all but the warm-up forwards. For the
    interleaved schedule the first stage warms up with ``(pp - 1) * 2 + (vpp - 1) *
    group`` chunk forwards out of ``m * vpp``, and one more with the overlap ("we
    schedule one extra micro-batch forward step before the 1f1b stages",
    ``get_pp_rank_microbatches``, megatron-core 0.16 schedules.py); without a pipeline
    one forward runs alone (``combined_1f1b_schedule_for_no_pipelining``)."""
    par = spec.parallel
    m = spec.num_microbatches
    total = m * par.vpp
    if par.pp == 1:
        warm = 1
    else:
        group = par.pp if m % par.pp == 0 else m
        warm = min((par.pp - 1) * 2 + (par.vpp - 1) * group + 1, total)
    return max(total - warm, 0) / total
