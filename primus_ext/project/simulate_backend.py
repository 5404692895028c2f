"""The simulate backend: ``simulate_layer_costs(spec) -> LayerCosts`` from analytic kernels.

Kinds (seconds per microbatch on one rank):

- ``dense`` / ``moe``: a decoder layer with a dense MLP / an MoE block; ``*_window`` the
  same with sliding-window attention (``model.window_size``);
- ``*_recompute``: the same layer under full recompute (``recompute_granularity=full``),
  for the layers ``recompute_method`` / ``recompute_num_layers`` select in each pipeline
  chunk (``uniform``: every layer; ``block``: the first ``recompute_num_layers`` of each
  chunk). Its ``recompute_s`` is the whole layer forward (less the ops after the last
  saved tensor under torch's early-stopping checkpoint, ``train.recompute_early_stop``)
  and its comms include the re-issued forward collectives (phase ``bwd``, name suffix
  ``.recompute``).
  ``decoder_kinds`` names the variant layer by layer, so the projector needs no fraction;
- selective recompute (``recompute_granularity=selective``) puts the forward time of
  the ``train.recompute_modules`` (default ``core_attn``) into every decoder kind's
  ``recompute_s``, with the collectives those modules issue (CP ring for core_attn);
- ``embedding`` (first stage), ``output`` (final norm, logits, loss; last stage) and
  ``mtp`` (all ``mtp_num_layers`` MTP blocks with their logits and loss; last stage).

``fwd_flops`` / ``bwd_flops`` are executed FLOPs (``bwd_flops`` includes recomputed
forward FLOPs). Results are cached by ``(model, parallel, train, cluster)``.
"""
from __future__ import annotations

from dataclasses import replace

from primus_ext.comm.layer_comm import Tagged, attention_comms, embedding_comms, \
    fsdp_comms, mlp_comms, mtp_glue_comms, output_comms
from primus_ext.comm.step_comm import dp_grad_sync_s, p2p_time_s, param_gather_s
from primus_ext.compute.extra_ops import embedding_ops, mtp_glue_ops, output_ops
from primus_ext.compute.offload_time import offload_op
from primus_ext.compute.host import (HostWork, embedding_work, graphed_parts, layer_parts,
                                     output_work, REPLAY)
from primus_ext.compute.host_moe import (node_work, partial_capture, post_sync_device_s,
                                         post_sync_ops)
from primus_ext.compute.issue import HostRates, backward_issue, forward_issue
from primus_ext.compute.layer_ops import attention_ops, mlp_block_ops
from primus_ext.compute.ops import OpCost, Shapes, sum_ops
from primus_ext.project.optimizer import optimizer_step_s
from primus_ext.compute.rank_params import embedding_params_on_rank, \
    layer_params_on_rank, mtp_params_on_rank, output_params_on_rank
from primus_ext.compute.costs import LayerCost, LayerCosts
from primus_ext.spec.run import RunSpec, uses_te

# Helpers of the step composer, re-exported here: one import for the simulate backend.
__all__ = ["simulate_layer_costs", "full_recompute_layers", "p2p_time_s", "dp_grad_sync_s",
           "param_gather_s", "optimizer_step_s"]

# megatron-core --recompute-modules -> the op modules each recomputes.
SELECTIVE_MODULES = {
    "core_attn": {"core_attn"},
    "layernorm": {"layernorm"},
    "mla_up_proj": {"mla_up_proj"},
    "mlp": {"mlp"},
    "moe_act": {"moe_act"},
    "moe": {"moe", "moe_act", "shared_experts"},
    "shared_experts": {"shared_experts"},
    # torchtitan's op-level SAC (memory/sac_op.py). Its memory is modelled; its recompute
    # time keeps what a torchtitan "selective" row was charged before (core attention's
    # forward) until the compute model separates the ops SAC re-runs (wk, wo, w3 and the
    # elementwise ops).
    "op": {"core_attn"},
    # torchtitan's op-level SAC (distributed/activation_checkpoint.py SelectiveAC): the
    # ops outside its save list (norms, RoPE, residual adds, the SwiGLU activation) and
    # the second of every two mms: wo, and w3 = the second half of the fused [w1 | w3]
    # fc1 ("op:<name>" one op, "op:<name>/2" half of it). Its save list decides per op
    # which forward collectives the recompute re-issues ("comm:<collective>"): it holds
    # reduce_scatter_tensor and all_to_all_single, not all_gather_into_tensor nor
    # all_reduce, so the SP / CP all-gathers and TP's all-reduces run again.
    "torchtitan_sac": {"layernorm", "rope", "bda", "proj", "op:act", "op:fc1/2",
                       "comm:all_gather", "comm:all_reduce"},
}
ALL = None  # full recompute: every module
_CACHE: dict = {}
_CACHE_MAX = 4096


def simulate_layer_costs(spec: RunSpec) -> LayerCosts:
    key = (spec.model, spec.parallel, spec.train, spec.cluster)
    hit = _CACHE.get(key)
    if hit is None:
        if len(_CACHE) >= _CACHE_MAX:
            _CACHE.clear()
        hit = _CACHE[key] = _simulate(spec)
    return hit


def full_recompute_layers(spec: RunSpec) -> frozenset[int]:
    """Decoder layers recomputed whole under ``recompute_granularity=full``."""
    tr = spec.train
    if tr.recompute_granularity != "full":
        return frozenset()
    lay = spec.layout
    out = set()
    for chunk in range(lay.vpp):
        for stage in range(lay.pp):
            first, n = lay.first_layer(stage, chunk), lay.num_layers(stage, chunk)
            take = n if tr.recompute_method == "uniform" else min(n, tr.recompute_num_layers)
            out.update(range(first, first + take))
    return frozenset(out)


def _selective(spec: RunSpec) -> set[str] | None:
    """Modules recomputed in every layer, or an empty set."""
    tr = spec.train
    if tr.recompute_granularity != "selective":
        return set()
    mods: set[str] = set()
    for name in tr.recompute_modules:
        mods |= SELECTIVE_MODULES.get(name, set())
    return mods


def early_stop_ops(ops: list[OpCost], hidden_dropout: float) -> list[OpCost]:
    """The ops a full recompute by torch's non-reentrant checkpoint re-runs.

    With early stop (PyTorch >= 2.1, torch/utils/checkpoint.py: ``_recomputation_hook``
    raises ``_StopRecomputationError`` once as many tensors are packed again as the
    forward saved), the recompute ends at the block's last saved tensor. A dense block
    ends with the MLP's second GEMM, whose autograd node packs its inputs before the GEMM
    runs, and a residual add that saves nothing: neither is re-run. With dropout after
    the GEMM its mask is saved after the GEMM, which then runs again; other endings (an
    MoE block's unpermute) are re-run whole. PyTorch's async TP sums the GEMM's partials
    inside the same fused op (``fc2_partials_sum``, compute/torch_async_tp.py): not re-run
    either."""
    names = [o.name for o in ops]
    for tail in (["fc2", "mlp_bda"], ["fc2", "fc2_partials_sum", "mlp_bda"]):
        if names[-len(tail):] == tail and hidden_dropout == 0:
            return ops[:-len(tail)]
    return list(ops)


# The flex dispatcher's combine: DeepEP's / HybridEP's autograd functions keep their
# handle on ``ctx`` and save no tensor (megatron-core fused_a2a.py FusedCombine, the copy
# in NeMo AutoModel components/moe/megatron/fused_a2a.py).
FLEX_COMBINE = "moe.ep_combine"


def _after_last_saved(spec: RunSpec | None, comms: list[Tagged]) -> set[str]:
    """Forward collectives an early-stopping recompute does not reach: under torch's
    non-reentrant checkpoint the recompute ends at the block's last saved tensor. With
    the flex dispatcher the MoE block ends with the combine and the residual add, neither
    of which saves a tensor (the routed experts' unpermute is the last that does; NeMo
    AutoModel's MoE.forward runs the shared experts before the routed ones, layers.py
    @e45812012456), so the combine is not issued again."""
    if spec is None or spec.parallel.moe_token_dispatcher_type != "flex":
        return set()
    return {c.name for c, _ in comms if c.name == FLEX_COMBINE}


def recomputed(ops: list[OpCost], recompute: set[str] | None,
               early_stop_dropout: float | None = None
               ) -> tuple[list[OpCost], float, float]:
    """(the ops recomputed whole, forward seconds and FLOPs of the recompute) of a layer
    (``recompute``: ALL or the selective module set; see ``_assemble``)."""
    if recompute is ALL:
        rec = list(ops) if early_stop_dropout is None else \
            early_stop_ops(ops, early_stop_dropout)
    else:
        rec = [o for o in ops if o.module in recompute or f"op:{o.name}" in recompute]
    rec_s = sum(o.fwd_s for o in rec)
    rec_flops = sum(o.fwd_flops for o in rec)
    if recompute is not ALL:
        half = [o for o in ops if f"op:{o.name}/2" in recompute and o not in rec]
        rec_s += sum(o.fwd_s for o in half) / 2
        rec_flops += sum(o.fwd_flops for o in half) / 2
    return rec, rec_s, rec_flops


def _assemble(kind: str, ops: list[OpCost], comms: list[Tagged], recompute: set[str] | None,
              fsdp: list[Tagged] = (), early_stop_dropout: float | None = None,
              host: tuple[HostWork, HostWork] | None = None, spec: RunSpec | None = None,
              post_sync: tuple[HostWork, float, frozenset[str]] | None = None
              ) -> LayerCost:
    """``early_stop_dropout``: the model's hidden dropout when a full recompute runs
    under torch's early-stopping checkpoint (``train.recompute_early_stop``), else None.
    ``host``: the (forward, backward) host work of the layer besides its kernels and
    collectives (compute/host.py), timed on ``spec``'s hardware. ``post_sync``: the
    forward's (host work, device seconds, ops) after its synchronisation."""
    f, d, w, ff, bf = sum_ops(ops)
    rec, rec_s, rec_flops = recomputed(ops, recompute, early_stop_dropout)
    out = [c for c, _ in comms]
    # An op-level policy names the collectives it re-issues; else a recomputed module
    # re-issues its own.
    by_op = set() if recompute is ALL else {m[5:] for m in recompute if m.startswith("comm:")}
    tail = _after_last_saved(spec, comms) if recompute is ALL and \
        early_stop_dropout is not None else set()
    for c, mod in comms:
        again = recompute is ALL or (c.collective in by_op if by_op else mod in recompute)
        again = again and c.name not in tail
        if c.phase == "fwd" and again:
            out.append(replace(c, name=c.name + ".recompute", phase="bwd"))
    out += [c for c, _ in fsdp]
    fh = bh = ph = pd = 0.0
    fsyncs = bsyncs = 0
    issue = b_issue = ()
    if host is not None and spec is not None:
        fwd, bwd = host  # kernels and the layer's own collectives counted
        # The recomputed forward is issued again (its share of the forward's kernels),
        # with the collectives it re-issues; FSDP's gathers and reduce-scatters too.
        k_f = sum(o.fwd_kernels for o in ops)
        share = 1.0 if recompute is ALL and early_stop_dropout is None else (
            sum(o.fwd_kernels for o in rec) / k_f if k_f else 0.0)
        again = sum(c.calls for c in out if c.name.endswith(".recompute"))
        bwd = bwd + HostWork(fwd.python_s, fwd.kernels, fwd.te_calls, 0.0, fwd.syncs,
                             fwd.expert_gemms).scaled(share) + HostWork(collectives=again)
        fwd = fwd + HostWork(collectives=sum(c.calls for c, _ in fsdp if c.phase == "fwd"))
        bwd = bwd + HostWork(collectives=sum(c.calls for c, _ in fsdp if c.phase == "bwd"))
        te = uses_te(spec)
        fh, bh = fwd.seconds(spec.cluster.hardware, te), bwd.seconds(spec.cluster.hardware, te)
        fsyncs = int(fwd.syncs)
        bsyncs = int(bwd.syncs)
        if post_sync is not None and fsyncs:
            ph = min(post_sync[0].seconds(spec.cluster.hardware, te), fh)
            pd = post_sync[1]
            hw = spec.cluster.hardware
            rates = HostRates(hw.launch_s, hw.te_grouped_gemm_host_s if te else 0.0,
                              _fill(spec))
            issue = forward_issue(ops, post_sync[2], rates, fh, ph, fwd.expert_gemms)
            b_issue = backward_issue(ops, rates, bh, bwd.expert_gemms, rec_s, share)
    return LayerCost(kind=kind, fwd_s=f, bwd_input_s=d, bwd_weight_s=w, recompute_s=rec_s,
                     comms=tuple(out), fwd_flops=ff, bwd_flops=bf + rec_flops,
                     fwd_host_s=fh, bwd_host_s=bh, fwd_syncs=fsyncs, bwd_syncs=bsyncs,
                     fwd_post_sync_s=pd, fwd_post_sync_host_s=ph, fwd_issue=issue,
                     bwd_issue=b_issue)


def _decoder_parts(spec: RunSpec, sh: Shapes, moe: bool, window: int | None,
                   mtp: bool = False) -> tuple[list[OpCost], list[Tagged],
                                               tuple[HostWork, HostWork], tuple | None]:
    """The layer's ops, collectives and (forward, backward) host work: per part its
    launches and Python, a graphed part one replay, an MoE block under a router /
    preprocess graph its eager rest (compute/host_moe.py), and under the combined 1F1B
    schedule the layer's schedule nodes (``mtp``: an MTP layer's fifth node); last, for
    an MoE layer whose forward synchronises, the (host work, device seconds, op names)
    of the forward after the synchronisation, else None."""
    a_ops = attention_ops(sh, window)
    m_ops = mlp_block_ops(sh, moe)
    a_by = {o.name: o for o in a_ops}
    m_by = {o.name: o for o in m_ops}
    f, d, w, _, _ = sum_ops(a_ops + m_ops)
    a_comms = attention_comms(spec, sh, a_by)
    m_comms = mlp_comms(spec, sh, m_by, moe, f + d + w)
    copy = offload_op(spec, moe, f, d + w)
    if copy is not None:
        m_ops = m_ops + [copy]
    graphed = graphed_parts(spec, moe)
    works = layer_parts(spec, moe)
    fwd, bwd = HostWork(), HostWork()
    post = None
    for part, ops, comms in (("attn", a_ops, a_comms), ("mlp", m_ops, m_comms)):
        pf, pb = with_launches(spec, works[part], ops, comms)
        if part in graphed:
            pf, pb = REPLAY, REPLAY
        elif part == "mlp" and moe:
            (pf, pb), post_host = partial_capture(spec, (pf, pb), ops, comms, _fill(spec),
                                                  "attn" in graphed)
            if pf.syncs:
                post = [post_host, post_sync_device_s(spec, ops, comms),
                        post_sync_ops(spec, ops)]
        fwd, bwd = fwd + pf, bwd + pb
    nf, nb = node_work(spec, moe, mtp)
    if post is not None:
        # three of an MoE layer's four schedule nodes run after the dispatch's sync
        post[0] = post[0] + nf.scaled(0.75)
    return a_ops + m_ops, a_comms + m_comms, (fwd + nf, bwd + nb), \
        (tuple(post) if post is not None else None)


def _fill(spec: RunSpec) -> int:
    """Kernels each op launch costs: one, and its fills under deterministic mode."""
    return 1 + DETERMINISTIC_FILLS if spec.train.deterministic_mode else 1


# ``at::empty`` calls per kernel in Transformer Engine's extensions (NVIDIA/
# TransformerEngine pytorch/csrc/extensions/normalization.cpp: the norm forward allocates
# its output, mu, rsigma and a workspace, the backward dx, dgamma, dbeta and a workspace;
# gemm.cpp: the output D, and bias_grad / pre_gelu_out where the epilogue makes them;
# quantizer.cpp create_tensor: the data and its scale_inv): about three.
DETERMINISTIC_FILLS = 3


def with_launches(spec: RunSpec, work: tuple[HostWork, HostWork], ops: list[OpCost],
                  comms: list[Tagged]) -> tuple[HostWork, HostWork]:
    """(forward, backward) host work plus the ops' kernels and the collectives' calls.
    Under ``train.deterministic_mode`` (Megatron-LM --deterministic-mode:
    ``torch.use_deterministic_algorithms(True)``, whose
    ``torch.utils.deterministic.fill_uninitialized_memory`` makes every ``at::empty``
    launch a fill) each kernel comes with ``DETERMINISTIC_FILLS`` fills."""
    f, b = work
    fill = _fill(spec)
    return (f + HostWork(kernels=fill * sum(o.fwd_kernels for o in ops), collectives=sum(
                c.calls for c, _ in comms if c.phase == "fwd")),
            b + HostWork(kernels=fill * sum(o.bwd_kernels for o in ops), collectives=sum(
                c.calls for c, _ in comms if c.phase == "bwd")))


def _fsdp(spec: RunSpec, ops: list[OpCost], dense: float, expert: float, prefix: str,
          comms: list[Tagged] = (), recompute_s: float = 0.0) -> list[Tagged]:
    """FSDP traffic hides behind the layer's compute of each phase, less what the
    layer's other collectives already hide there: one stretch of compute cannot hide two
    transfers (without this, faster compute could expose more than it saves). The
    backward phase's compute includes the layer's recompute (``recompute_s``): the
    backward gather is issued before the recomputed forward runs (Megatron-FSDP's
    pre-forward hook in the ``PRE_BACKWARD`` state, or the previous layer's backward
    prefetch) and the reduce-scatter runs on behind the next layer's recompute."""
    if not spec.parallel.fsdp:
        return []
    f, d, w, _, _ = sum_ops(ops)
    busy = {"fwd": 0.0, "bwd": 0.0}
    for c, _ in comms:
        busy[c.phase] += c.seconds - c.exposed_s
    return fsdp_comms(spec, dense, expert, max(f - busy["fwd"], 0.0),
                      max(d + w + recompute_s - busy["bwd"], 0.0), prefix)


def _simulate(spec: RunSpec) -> LayerCosts:
    model, par = spec.model, spec.parallel
    sh = Shapes(spec)
    selective = _selective(spec)
    full = full_recompute_layers(spec)
    kinds: dict[str, LayerCost] = {}
    parts: dict[tuple[bool, int | None], tuple] = {}
    decoder_kinds = []
    for i in range(model.num_layers):
        moe = model.is_moe_layer(i)
        window = model.window_size if model.uses_window(i) else None
        base = ("moe" if moe else "dense") + ("_window" if window is not None else "")
        name = base + ("_recompute" if i in full else "")
        decoder_kinds.append(name)
        if name in kinds:
            continue
        if (moe, window) not in parts:
            parts[(moe, window)] = (*_decoder_parts(spec, sh, moe, window),
                                    layer_params_on_rank(model, par, i))
        ops, comms, host, post, (dense_p, expert_p) = parts[(moe, window)]
        stop = model.hidden_dropout if spec.train.recompute_early_stop else None
        rec = ALL if i in full else selective
        fs = _fsdp(spec, ops, dense_p, expert_p, base, comms,
                   recomputed(ops, rec, stop)[1] if spec.parallel.fsdp else 0.0)
        kinds[name] = _assemble(name, ops, comms, rec, fs,
                                early_stop_dropout=stop, host=host, spec=spec,
                                post_sync=post)

    e_ops = embedding_ops(sh)
    e_comms = embedding_comms(spec, sh)
    kinds["embedding"] = _assemble(
        "embedding", e_ops, e_comms, set(),
        _fsdp(spec, e_ops, embedding_params_on_rank(model, par), 0.0, "embedding", e_comms),
        host=_outside_host(spec, embedding_work(), e_ops, e_comms), spec=spec)
    o_ops = output_ops(sh)
    o_comms = output_comms(spec, sh, {o.name: o for o in o_ops})
    kinds["output"] = _assemble(
        "output", o_ops, o_comms, set(),
        _fsdp(spec, o_ops, output_params_on_rank(model, par), 0.0, "output", o_comms),
        host=_outside_host(spec, output_work(model), o_ops, o_comms), spec=spec)
    if model.mtp_num_layers:
        kinds["mtp"] = _mtp(spec, sh, o_ops, o_comms)
    notes = ("simulate: analytic kernels on " + spec.cluster.hardware.name,
             "full recompute: '<kind>_recompute' kinds; selective: recompute_s of every "
             "decoder kind; bwd_flops include recomputed forward FLOPs",
             "mtp: all mtp_num_layers blocks, each with its logits and loss")
    return LayerCosts(kinds=kinds, decoder_kinds=tuple(decoder_kinds), source="simulate",
                      notes=notes)


def _mtp(spec: RunSpec, sh: Shapes, o_ops: list[OpCost], o_comms: list[Tagged]
         ) -> LayerCost:
    """All MTP blocks: glue (lookup, norms, eh_proj) + a layer of the last layer's kind +
    the output layer and loss, each comm named per block."""
    model = spec.model
    last = model.num_layers - 1
    moe = model.is_moe_layer(last)
    window = model.window_size if model.uses_window(last) else None
    l_ops, l_comms, l_host, _ = _decoder_parts(spec, sh, moe, window, mtp=True)
    g_ops = mtp_glue_ops(sh)
    block_ops = g_ops + l_ops + o_ops
    block_comms = mtp_glue_comms(spec, sh) + l_comms + o_comms
    n = model.mtp_num_layers
    ops, comms = [], []
    for k in range(n):
        ops += block_ops
        comms += [(replace(c, name=f"mtp{k}.{c.name}"), mod) for c, mod in block_comms]
    dense_p, expert_p = mtp_params_on_rank(model, spec.parallel)
    fs = _fsdp(spec, ops, dense_p, expert_p, "mtp", comms)
    gf, gb = with_launches(spec, output_work(model), g_ops + o_ops,
                           mtp_glue_comms(spec, sh) + o_comms)
    host = ((l_host[0] + gf).scaled(n), (l_host[1] + gb).scaled(n))
    return _assemble("mtp", ops, comms, set(), fs, host=host, spec=spec)


def _outside_host(spec: RunSpec, work, ops, comms) -> tuple[HostWork, HostWork]:
    """The embedding's or output layer's host work; none left under a full-iteration
    CUDA graph."""
    if "full_iteration" in spec.train.cuda_graph_scope:
        return HostWork(), HostWork()
    return with_launches(spec, work, ops, comms)
