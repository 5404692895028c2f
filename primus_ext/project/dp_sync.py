"""Data-parallel synchronisation and the optimizer step, per pipeline stage.

The collectives live in ``comm.step_comm`` (gradient reduce-scatter or all-reduce in
buckets, the distributed optimizer's parameter all-gather; FSDP's per-layer traffic is in
the layer costs). Here they are timed against the stage's compute with megatron-core's
rules, chunk by chunk (every model chunk is its own DDP instance with its own buckets):

- **Gradient sync** (``overlap_grad_reduce``): gradients are reduced only in the last
  microbatch (earlier ones accumulate under ``no_sync``). A chunk's buckets become ready
  one after another during that chunk's final backward, last layer first; each bucket's
  collective is issued when it is ready and the buckets run back to back on the
  communication stream. With interleaving (``vpp > 1``) the final backwards of the chunks
  are spread over the last microbatch group: in megatron-core's interleaved order the
  last ``group`` (= pp) microbatches run backward through chunk vpp-1, then vpp-2, ...,
  chunk 0, so chunk c's reduction can start ``group * sum(bwd of chunks < c)`` before the
  stage's backward ends and overlaps the remaining backward of the lower chunks. What
  the stream still has to do when the stage's compute ends is exposed.
- **Parameter gather** (``overlap_param_gather``, distributed optimizer): the updated
  parameters are all-gathered bucket by bucket in forward order; a bucket's gather is
  launched when the previous bucket is needed (the forward pre-hook), and the forward
  stalls when a bucket is not there yet. The first bucket is always exposed. Chunk c's
  first forward starts ``group * sum(fwd of chunks < c)`` into the step.
- Without the switches the whole collective is exposed. Hidden communication is charged
  ``hardware.comm_overlap_penalty`` (SMs the collective kernels take from compute).

Windows count compute only (idle time in the pipeline's cool-down would hide more), so
the exposed part is an upper bound of the real one under this ordering.
"""
from __future__ import annotations

from dataclasses import dataclass

from primus_ext.comm.step_comm import SyncCost, dp_grad_sync, param_gather
from primus_ext.project.optimizer import optimizer_step_s
from primus_ext.compute.rank_params import chunk_param_counts, stage_param_counts
from primus_ext.spec import RunSpec


@dataclass(frozen=True, slots=True)
class DpSync:
    exposed_s: tuple[float, ...]  # per stage
    optimizer_s: tuple[float, ...]
    notes: tuple[str, ...]
    grad_sync_s: tuple[float, ...] = ()  # per stage, all buckets (before overlap)
    param_gather_s: tuple[float, ...] = ()


def _buckets(sync: SyncCost) -> list[tuple[float, float]]:
    """(position in the chunk's pass in (0, 1], seconds) of every bucket, in order."""
    n = sync.num_buckets
    if n <= 0 or sync.total_s <= 0:
        return []
    each = sync.total_s / n
    return [((j + 1) / n, each) for j in range(n)]


_COUNTS: dict = {}


def _param_counts(spec: RunSpec) -> tuple:
    """Per stage: ((dense, expert) per chunk, (dense, expert) of the stage), memoised on
    the model and layout (they do not depend on the hardware a fit varies)."""
    key = (spec.model, spec.parallel)
    hit = _COUNTS.get(key)
    if hit is None:
        if len(_COUNTS) > 4096:
            _COUNTS.clear()
        hit = _COUNTS[key] = tuple(
            (tuple(chunk_param_counts(spec, s, c) for c in range(spec.parallel.vpp)),
             stage_param_counts(spec, s)) for s in range(spec.parallel.pp))
    return hit


def _chunk_syncs(spec: RunSpec, chunks, fn) -> list[list[tuple[float, float]]]:
    """Per chunk, its buckets: dense (data x context group) and expert (expert-data group)
    buckets interleaved by their position in the chunk's parameters."""
    out = []
    for d, e in chunks:
        b = _buckets(fn(spec, (d, 0.0)))
        if e > 0:
            b = sorted(b + _buckets(fn(spec, (0.0, e))))
        out.append(b)
    return out


def grad_sync_exposed_s(spec: RunSpec, buckets, bwd_s: list[float], group: int) -> float:
    """Exposed gradient-sync seconds of one stage (see the module docstring).

    ``buckets[c]``: (position, seconds) of chunk c's buckets; ``bwd_s[c]``: one
    microbatch's backward of chunk c; ``group``: microbatches per interleaving group."""
    hw = spec.cluster.hardware
    total = sum(t for chunk in buckets for _, t in chunk)
    if total <= 0:
        return 0.0
    if not spec.parallel.overlap_grad_reduce:
        return total
    vpp = len(buckets)
    free = float("-inf")
    for c in range(vpp - 1, -1, -1):
        end_c = -group * sum(bwd_s[:c])  # chunk c's final backward ends here (0 = end)
        start_c = end_c - bwd_s[c]
        for pos, t in buckets[c]:
            free = max(free, start_c + pos * bwd_s[c]) + t
    exposed = max(free, 0.0)
    return exposed + hw.comm_overlap_penalty * (total - min(exposed, total))


def param_gather_exposed_s(spec: RunSpec, buckets, fwd_s: list[float], group: int) -> float:
    """Forward stall from the distributed optimizer's parameter all-gather of one stage."""
    hw = spec.cluster.hardware
    total = sum(t for chunk in buckets for _, t in chunk)
    if total <= 0:
        return 0.0
    if not spec.parallel.overlap_param_gather:
        return total
    stall = 0.0
    free = 0.0
    prev_need = 0.0
    for c, chunk in enumerate(buckets):
        first_fwd = group * sum(fwd_s[:c])
        for pos, t in chunk:
            # Bucket needed when the forward reaches its first layer; launched when the
            # previous bucket was needed.
            need = first_fwd + (pos - 1.0 / max(len(chunk), 1)) * fwd_s[c] + stall
            done = max(free, prev_need) + t
            if done > need:
                stall += done - need
                need = done
            free, prev_need = done, need
    return stall + hw.comm_overlap_penalty * (total - min(stall, total))


def dp_sync(spec: RunSpec, st) -> DpSync:
    par = spec.parallel
    group = par.pp if par.vpp > 1 else 1
    if par.vpp > 1 and spec.num_microbatches % par.pp:
        group = spec.num_microbatches  # one group (see project/estimate.py)
    exposed, opt, grads, gathers = [], [], [], []
    memo: dict = {}  # stages with the same parameters and times cost the same
    for s, (chunks, stage_counts) in enumerate(_param_counts(spec)):
        bwd = [a + b for a, b in zip(st.bwd_input_s[s], st.bwd_weight_s[s])]
        fwd = list(st.fwd_s[s])
        key = (chunks, tuple(bwd), tuple(fwd))
        if key not in memo:
            g_b = _chunk_syncs(spec, chunks, dp_grad_sync)
            p_b = _chunk_syncs(spec, chunks, param_gather)
            memo[key] = (grad_sync_exposed_s(spec, g_b, bwd, group)
                         + param_gather_exposed_s(spec, p_b, fwd, group),
                         optimizer_step_s(spec, stage_counts),
                         sum(t for ch in g_b for _, t in ch),
                         sum(t for ch in p_b for _, t in ch))
        e, o, g, p = memo[key]
        exposed.append(e)
        opt.append(o)
        grads.append(g)
        gathers.append(p)
    how = ("FSDP (per-layer traffic in the layer costs)" if par.fsdp else
           "distributed optimizer" if par.use_distributed_optimizer else "DDP all-reduce")
    notes = (f"data-parallel sync: {how}, overlap_grad_reduce={par.overlap_grad_reduce}, "
             f"overlap_param_gather={par.overlap_param_gather}, grad_reduce_in_fp32="
             f"{par.grad_reduce_in_fp32}; chunk-wise bucket timing",)
    return DpSync(exposed_s=tuple(exposed), optimizer_s=tuple(opt), notes=notes,
                  grad_sync_s=tuple(grads), param_gather_s=tuple(gathers))
