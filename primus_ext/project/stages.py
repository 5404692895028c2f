"""Place layer costs on pipeline stages: per (stage, chunk) forward and backward seconds.

A virtual stage's time is the sum of its decoder layers plus its extras: the embedding on
the first virtual stage (stage 0, chunk 0), the output layer with the loss and any MTP
layers on the last (stage pp-1, chunk vpp-1). Exposed in-layer communication is added to
the phase that waits for it. Recompute is in the layer costs: the backend gives the
layers that full recompute selects a kind of their own whose ``recompute_s`` is the whole
forward, and selective recompute is in every decoder kind's ``recompute_s``.

Layers of one kind cost the same, so each virtual stage is summed per kind (count x the
kind's figures), not layer by layer: a 126-layer model costs a handful of additions.

Two clocks (ARCHITECTURE.md): a virtual stage's forward (and backward) of one
microbatch is issued by the host while the device runs it. The host runs ahead through
stretches the device is slow on and the device waits where the host is (a CUDA launch
queue holds a thousand kernels, more than a layer issues), so the phase takes
``max(device, host)``; each host-device synchronisation inside it drains the queue, after
which the device also waits for the next kernel's launch; a forward with
synchronisations runs the two clocks over its layers in issue order (``run_clocks``),
split where each layer synchronises, so the host work after a read-back does not hide
behind device work issued before it; where the backend gives a layer's ops in issue
order (an MoE layer's, ``LayerCost.fwd_issue``) the clocks also run op by op over the
ops' compute, each kernel starting no earlier than the host has issued it, and the
phase takes the longer of the two runs (a stretch of short kernels is host-bound and a
long GEMM issued after it runs on past the host); the backward of such a stage, which
starts with no host lead after its drained forward, likewise (``backward_by_op``: the
experts' host-heavy gradients come before attention's long kernels, and what the host
spends on them cannot hide behind those). Where no synchronisation
separates a stage's phases the host's lead carries over from one to the next and they
stretch together (below). The host's share per stage is kept in ``host_s``: what the
phases take beyond their device time.
"""
from __future__ import annotations

from dataclasses import dataclass

from primus_ext.compute.costs import LayerCost, LayerCosts
from primus_ext.compute.host import schedule_python_per_microbatch
from primus_ext.spec import RunSpec


@dataclass(frozen=True, kw_only=True, slots=True)
class StageTimes:
    """[stage][chunk] seconds per microbatch, and what they are made of."""
    fwd_s: tuple[tuple[float, ...], ...]
    bwd_input_s: tuple[tuple[float, ...], ...]
    bwd_weight_s: tuple[tuple[float, ...], ...]
    # Per stage, summed over its chunks, per microbatch: compute, recompute, and exposed
    # communication per axis.
    compute_s: tuple[float, ...]
    recompute_s: tuple[float, ...]
    comm_s: tuple[dict[str, float], ...]
    # Per stage, summed over its chunks, per microbatch: seconds the host clock adds
    # beyond the device's (host-bound phases, launches after synchronisations).
    host_s: tuple[float, ...] = ()


def _figures(lc: LayerCost) -> tuple:
    """(fwd, bwd_input, bwd_weight, compute, recompute, exposed comm by axis, host fwd,
    host bwd, syncs fwd, syncs bwd) of a kind, as one layer of it adds to its virtual
    stage."""
    r = lc.recompute_s
    return (lc.fwd_total_s, lc.bwd_input_s + r + lc.bwd_comm_s, lc.bwd_weight_s,
            lc.fwd_s + lc.bwd_input_s + lc.bwd_weight_s, r, lc.exposed_comm_by_axis(),
            lc.fwd_host_s, lc.bwd_host_s, lc.fwd_syncs, lc.bwd_syncs)


def two_clocks(device_s: float, host_s: float, syncs: int, launch_s: float) -> float:
    """A phase issued by the host while the device runs it (module docstring)."""
    return max(device_s + syncs * launch_s, host_s)


def run_clocks(blocks, launch_s: float) -> float:
    """A phase as an ordered run of (host seconds, device seconds, synchronises after[,
    kernels]) blocks: the device finishes a block no earlier than its previous work
    allows, nor than the host has issued the block's last kernel and that kernel has run
    (a block's device time spread evenly over its kernels; without a count, many); at a
    synchronisation the host waits for the device, which then waits a launch for the
    next kernel. Without synchronisations and with one block this is ``two_clocks``;
    with them the host work after a synchronisation cannot hide behind the device work
    before it (a captured attention replayed in one launch does not hide the eager MoE
    block that follows its token-count read-back). Op by op (``LayerCost.fwd_issue``) a
    stretch of short kernels is host-bound and a long GEMM issued after it runs on past
    the host."""
    host = dev = 0.0
    for block in blocks:
        h, d, sync = block[:3]
        host += h
        last = d / block[3] if len(block) > 3 else 0.0
        dev = max(dev + d, host + last)
        if sync:
            host = max(host, dev)
            dev = host + launch_s
    return max(host, dev)


def forward_blocks(spec: RunSpec, costs: LayerCosts, stage: int, chunk: int,
                   sched_s: float, by_op: bool = False) -> list[tuple]:
    """The forward of one virtual stage as ``run_clocks`` blocks, in issue order: the
    schedule's own work, the embedding, each decoder layer (split at its
    synchronisation where the backend says where that falls; ``by_op``: op by op where
    the backend gives the issue order, ``LayerCost.fwd_issue``), the output layer and
    MTP."""
    out = [(sched_s, 0.0, False)]
    for lc in chunk_layers(spec, costs, stage, chunk):
        dev, host = lc.fwd_total_s, lc.fwd_host_s
        if by_op and lc.fwd_issue:
            out.extend((h, d, sync, k) for h, d, k, sync in lc.fwd_issue)
        elif lc.fwd_syncs and (lc.fwd_post_sync_s or lc.fwd_post_sync_host_s):
            ph, pd = lc.fwd_post_sync_host_s, min(lc.fwd_post_sync_s, dev)
            out.append((host - ph, dev - pd, True))
            out.append((ph, pd, False))
        else:
            out.append((host, dev, bool(lc.fwd_syncs)))
    return out


def chunk_layers(spec: RunSpec, costs: LayerCosts, stage: int, chunk: int
                 ) -> list[LayerCost]:
    """A virtual stage's layers in forward issue order: the embedding (first virtual
    stage), its decoder layers, the output layer and MTP (last virtual stage)."""
    layout = spec.layout
    kinds = costs.kinds
    out = [kinds["embedding"]] if stage == 0 and chunk == 0 and "embedding" in kinds else []
    first = layout.first_layer(stage, chunk)
    out += [costs.decoder_layer(i)
            for i in range(first, first + layout.num_layers(stage, chunk))]
    if stage == layout.pp - 1 and chunk == layout.vpp - 1:
        out += [kinds[name] for name in ("output", "mtp")
                if name in kinds and (name != "mtp" or spec.model.mtp_num_layers)]
    return out


def synced_forward(spec: RunSpec, costs: LayerCosts, stage: int, chunk: int,
                   sched_s: float, by_op: bool) -> float:
    """A virtual stage's forward that synchronises inside its layers: the two clocks
    over its blocks, and where the backend gives a layer's ops in issue order
    (``by_op``), the longer of that and the two clocks over its ops' compute
    (``fwd_issue`` leaves the collectives to the blocks)."""
    launch = spec.cluster.hardware.launch_s
    t = run_clocks(forward_blocks(spec, costs, stage, chunk, sched_s), launch)
    if by_op:
        t = max(t, run_clocks(forward_blocks(spec, costs, stage, chunk, sched_s,
                                             by_op=True), launch))
    return t


def backward_by_op(spec: RunSpec, costs: LayerCosts, stage: int, chunk: int) -> float:
    """A virtual stage's backward after a forward that drained the device queue (a
    synchronising stage): the two clocks op by op from no host lead, in autograd's
    order (the forward's, reversed); a layer without ``bwd_issue`` as one block."""
    blocks = []
    for lc in reversed(chunk_layers(spec, costs, stage, chunk)):
        if lc.bwd_issue:
            blocks.extend((h, d, sync, k) for h, d, k, sync in lc.bwd_issue)
        else:
            blocks.append((lc.bwd_host_s, lc.bwd_total_s, False))
    return run_clocks(blocks, spec.cluster.hardware.launch_s)


def _kind_counts(costs: LayerCosts, first: int, n: int) -> dict[str, int]:
    counts: dict[str, int] = {}
    kinds = costs.decoder_kinds
    for i in range(first, first + n):
        k = kinds[i]
        counts[k] = counts.get(k, 0) + 1
    return counts


def stage_times(spec: RunSpec, costs: LayerCosts) -> StageTimes:
    layout = spec.layout
    pp, vpp = layout.pp, layout.vpp
    figs = {name: _figures(lc) for name, lc in costs.kinds.items()}
    fwd = [[0.0] * vpp for _ in range(pp)]
    bwd_in = [[0.0] * vpp for _ in range(pp)]
    bwd_w = [[0.0] * vpp for _ in range(pp)]
    compute = [0.0] * pp
    recompute = [0.0] * pp
    comm: list[dict[str, float]] = [{} for _ in range(pp)]
    hw = spec.cluster.hardware
    # The schedule's own Python per microbatch and chunk (forward_step, the batch, the
    # loss function), on every stage.
    sched = schedule_python_per_microbatch(spec.model) / hw.host_speed \
        if hw.host_clock and "full_iteration" not in spec.train.cuda_graph_scope else 0.0
    host_f = [[sched] * vpp for _ in range(pp)]
    host_b = [[0.0] * vpp for _ in range(pp)]
    sync_f = [[0] * vpp for _ in range(pp)]
    sync_b = [[0] * vpp for _ in range(pp)]

    def add(s: int, c: int, name: str, count: int = 1) -> None:
        f, bi, bw, comp, rec, by_axis, hf, hb, nf, nb = figs[name]
        fwd[s][c] += count * f
        bwd_in[s][c] += count * bi
        bwd_w[s][c] += count * bw
        compute[s] += count * comp
        recompute[s] += count * rec
        host_f[s][c] += count * hf
        host_b[s][c] += count * hb
        sync_f[s][c] += count * nf
        sync_b[s][c] += count * nb
        cs = comm[s]
        for axis, x in by_axis.items():
            cs[axis] = cs.get(axis, 0.0) + count * x

    for s in range(pp):
        for c in range(vpp):
            counts = _kind_counts(costs, layout.first_layer(s, c), layout.num_layers(s, c))
            for name, n in counts.items():
                add(s, c, name, n)
    if "embedding" in costs.kinds:
        add(0, 0, "embedding")
    if "output" in costs.kinds:
        add(pp - 1, vpp - 1, "output")
    if spec.model.mtp_num_layers and "mtp" in costs.kinds:
        add(pp - 1, vpp - 1, "mtp")  # the entry covers every MTP layer
    host = [0.0] * pp
    if hw.host_clock:
        # Without a synchronisation between its phases the host carries its lead from
        # one phase to the next: one stage's phases stretch together by its total host
        # over device time; the interleaved schedule's forward and backward of a chunk
        # (no p2p sync) take each other's lead. Non-interleaved PP synchronises after
        # every p2p (host_step.py p2p_host_s) and a sync inside the layers drains the
        # queue: each phase is bounded on its own.
        synced = any(sync_f[s][c] or sync_b[s][c] for s in range(pp) for c in range(vpp))
        by_op = any(lc.fwd_issue for lc in costs.kinds.values())
        # Chunks with the same layers and extras run the same clocks: once each.
        memo: dict = {}

        def by_chunk(fn, s: int, c: int, *extra):
            first = layout.first_layer(s, c)
            key = (fn, costs.decoder_kinds[first:first + layout.num_layers(s, c)],
                   s == 0 and c == 0, s == pp - 1 and c == vpp - 1)
            if key not in memo:
                memo[key] = fn(spec, costs, s, c, *extra)
            return memo[key]

        for s in range(pp):
            dev_b = [bwd_in[s][c] + bwd_w[s][c] for c in range(vpp)]
            if pp == 1 and not synced:
                dev = sum(fwd[s]) + sum(dev_b)
                k = max(sum(host_f[s]) + sum(host_b[s]), dev) / dev if dev > 0 else 1.0
                new_f = [x * k for x in fwd[s]]
                new_b = [x * k for x in dev_b]
            elif vpp > 1 and not synced:
                # Interleaved: a chunk's forward and backward alternate with no sync
                # between them; the lead the host builds in one carries into the next.
                new_f, new_b = [], []
                for c in range(vpp):
                    lead_b = max(dev_b[c] - host_b[s][c], 0.0)
                    lead_f = max(fwd[s][c] - host_f[s][c], 0.0)
                    new_f.append(max(fwd[s][c], host_f[s][c] - lead_b))
                    new_b.append(max(dev_b[c], host_b[s][c] - lead_f))
            else:
                new_f = [by_chunk(synced_forward, s, c, sched, by_op) if sync_f[s][c] else
                         two_clocks(fwd[s][c], host_f[s][c], 0, hw.launch_s)
                         for c in range(vpp)]
                new_b = [two_clocks(dev_b[c], host_b[s][c], sync_b[s][c], hw.launch_s)
                         for c in range(vpp)]
                if by_op:
                    new_b = [max(b, by_chunk(backward_by_op, s, c))
                             for c, b in enumerate(new_b)]
            for c in range(vpp):
                host[s] += new_f[c] - fwd[s][c] + new_b[c] - dev_b[c]
                fwd[s][c] = new_f[c]
                if dev_b[c] > 0:
                    bwd_in[s][c] *= new_b[c] / dev_b[c]
                    bwd_w[s][c] *= new_b[c] / dev_b[c]
                else:
                    bwd_in[s][c] = new_b[c]
    freeze = lambda rows: tuple(tuple(r) for r in rows)  # noqa: E731
    return StageTimes(fwd_s=freeze(fwd), bwd_input_s=freeze(bwd_in),
                      bwd_weight_s=freeze(bwd_w), compute_s=tuple(compute),
                      recompute_s=tuple(recompute), comm_s=tuple(comm),
                      host_s=tuple(host))
