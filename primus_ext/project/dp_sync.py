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
- **Buckets**: only the first model chunk of the first pipeline stage is split into
  buckets (``parallel.ddp_bucket_params``); every other chunk is one bucket
  (megatron-core ``DistributedDataParallel.__init__``: ``bucket_size = None`` when
  ``pp_rank > 0`` or ``disable_bucketing``, which Megatron-LM ``training.py get_model``
  and NeMo 2.0 ``megatron_parallel.py init_ddp`` pass as ``model_chunk_idx > 0``), so
  its collective starts when the chunk's whole backward is done and moves the chunk's
  parameters in one message. The bucketed chunk has the bucket boundaries of the real
  buffer (a bucket closes once it holds ``bucket_size`` elements of whole parameters:
  ``memory/grad_buffer.chunk_buffers``). torchtitan runs (FSDP2 units per block) keep
  even buckets in every chunk.
- **Parameter gather** (``overlap_param_gather``, distributed optimizer): the updated
  parameters are all-gathered bucket by bucket in forward order; a bucket's gather is
  launched when the previous bucket is needed (the forward pre-hook: core_r0.8.0
  ``DistributedOptimizer._finish_param_sync_helper``, >= 0.9 ``_ParamAndGradBucketGroup.
  finish_param_sync`` dispatching the next bucket group), and the forward stalls when
  a bucket is not there yet. The first bucket is always exposed. Chunk c's first
  forward starts ``group * sum(fwd of chunks < c)`` into the step. With
  ``align_param_gather`` and interleaving, the schedule dispatches whole chunks instead
  (megatron-core >= 0.9 ``schedules.py forward_backward_pipelining_with_interleaving``:
  ``param_sync_func`` = ``DistributedDataParallel.start_param_sync``, every bucket group
  of the chunk): chunks 0 and 1 at the start of the step, chunk c + 1 when the forward
  of chunk c's first microbatch is launched, so the gathers queue back to back instead
  of waiting for the forward to reach the previous bucket.
- Without the switches the whole collective is exposed. Hidden communication is charged
  ``hardware.comm_overlap_penalty`` (SMs the collective kernels take from compute).

Pipeline stage s > 0 finishes its last backward while the stages before it still run
theirs (1F1B / interleaved cool-down: the last microbatch's gradient travels from the last
stage to the first), so its gradient sync may run ``sum(bwd of chunk 0 on stages < s)``
past its own compute before it delays the step; megatron-core relies on this when it
leaves those stages unbucketed ("data-parallel communication on these stages is not on
the critical path", DistributedDataParallel.__init__). With ``align_param_gather`` the
gathers are dispatched at the start of the step on every stage, and stage s's first
forward comes ``sum(fwd of chunk 0 on stages < s)`` later (the warm-up). Other idle
time (pipeline bubbles, p2p waits) is not counted, so the exposed part stays an upper
bound of the real one under this ordering.

**Aligned gradient sync** (``parallel.align_grad_reduce``, on by default as in
Megatron-LM, NeMo and Megatron-Bridge): under the interleaved schedule the training loop
sets ``config.grad_sync_func`` (core_v0.16.1 megatron/training/training.py:2557-2560
``if args.align_grad_reduce``; core_r0.8.0 training.py:1001-1004 ``if
args.delay_grad_reduce``), so the backward hooks launch nothing and each chunk's buckets
go out together when stage 0 finishes that chunk's last backward, or when the stage's
loop ends (``aligned_launch_s``). Chunk 0, the last one backwarded, is launched after
the final backward: on stage 0 its bucketed sync no longer overlaps its own backward.
Without virtual stages the schedule keeps the bucket-by-bucket launch on stage 0
(schedules.py 1F1B: ``if config.grad_sync_func is None or rank == 0:
enable_grad_sync()`` before the last backward) and later stages launch at their end, as
above; with PP = 1 (``forward_backward_no_pipelining``) only ``no_sync`` is used.
"""
from __future__ import annotations

from dataclasses import dataclass

from primus_ext.comm.step_comm import SyncCost, dp_grad_sync, param_gather
from primus_ext.project.optimizer import optimizer_step_s
from primus_ext.compute.rank_params import chunk_param_counts, stage_param_counts
from primus_ext.memory.grad_buffer import chunk_buffers
from primus_ext.spec import RunSpec
from primus_ext.spec.run import uses_te


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


def _layout_buckets(spec: RunSpec, layout, fn, expert: bool, forward: bool
                    ) -> list[tuple[float, float]]:
    """(end position in the chunk's pass, seconds) of the buckets of a real DDP buffer
    layout, each moved as one collective of its padded size. The buffer holds the
    parameters in reverse order, so its bucket 0 is the first one the backward fills
    and the last one the forward needs."""
    sizes = [b.end - b.start for b in layout.buckets]
    total = sum(sizes)
    if total <= 0:
        return []
    if forward:
        sizes.reverse()
    out, done, secs = [], 0, {}  # buckets of one size cost the same
    for n in sizes:
        done += n
        if n not in secs:
            secs[n] = fn(spec, (0.0, float(n)) if expert else (float(n), 0.0),
                         bucketed=False).total_s
        out.append((done / total, secs[n]))
    return out


def _chunk_syncs(spec: RunSpec, chunks, fn, first_bucketed: bool = True,
                 all_bucketed: bool = False, stage: int = 0
                 ) -> list[list[tuple[float, float]]]:
    """Per chunk, its buckets: dense (data x context group) and expert (expert-data group)
    buckets interleaved by their position in the chunk's parameters. Only chunk 0 is
    bucketed, and only when ``first_bucketed`` (the first pipeline stage), with the
    bucket boundaries of megatron-core's buffer (``memory/grad_buffer.chunk_buffers``:
    a bucket closes once it holds ``bucket_size`` elements of whole parameters);
    ``all_bucketed``: every chunk in even buckets (see the module docstring)."""
    out = []
    forward = fn is param_gather
    for c, (d, e) in enumerate(chunks):
        if not all_bucketed and first_bucketed and c == 0 and spec.parallel.overlap_grad_reduce:
            lay = chunk_buffers(spec.model, spec.parallel, stage, c,
                                spec.dp * spec.parallel.cp, spec.expert_dp,
                                local_spec=not uses_te(spec))
            b = _layout_buckets(spec, lay.dense, fn, False, forward) if d > 0 else []
            if e > 0:
                b = sorted(b + _layout_buckets(spec, lay.expert, fn, True, forward))
            out.append(b)
            continue
        b = _buckets(fn(spec, (d, 0.0), bucketed=all_bucketed))
        if e > 0:
            b = sorted(b + _buckets(fn(spec, (0.0, e), bucketed=all_bucketed)))
        out.append(b)
    return out


def grad_sync_exposed_s(spec: RunSpec, buckets, bwd_s: list[float], group: int,
                        slack_s: float = 0.0, aligned: bool = False) -> float:
    """Exposed gradient-sync seconds of one stage (see the module docstring).

    ``buckets[c]``: (position, seconds) of chunk c's buckets; ``bwd_s[c]``: one
    microbatch's backward of chunk c; ``group``: microbatches per interleaving group;
    ``slack_s``: idle time between the stage's last backward and the end of the
    pipeline's (the cool-down of the stages before it); ``aligned``: the interleaved
    schedule launches each chunk's sync whole at ``aligned_launch_s`` (the module
    docstring) instead of bucket by bucket as the backward fills them."""
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
            ready = (aligned_launch_s(end_c, slack_s) if aligned
                     else start_c + pos * bwd_s[c])
            free = max(free, ready) + t
    exposed = max(free - slack_s, 0.0)
    return exposed + hw.comm_overlap_penalty * (total - min(exposed, total))


def aligned_launch_s(chunk_end_s: float, slack_s: float) -> float:
    """When a stage launches a chunk's gradient sync under megatron-core's interleaved
    schedule with ``config.grad_sync_func`` set (Megatron-LM ``align_grad_reduce`` /
    core_r0.8.0 ``delay_grad_reduce``), on the stage's clock (0 = its last backward ends).

    Every backward runs under ``no_sync`` (``disable_grad_sync()`` after each one), so no
    bucket is launched from the backward hooks; after the backward of virtual microbatch
    ``k`` the stage calls ``grad_sync_func`` (``start_grad_sync``: every bucket of the
    chunk) for the chunk whose last microbatch is ``k - pp_rank``, and the chunks left
    over are launched once its loop ends (core_v0.16.1 schedules.py
    ``backward_step_helper_postprocess``: ``grad_sync_virtual_microbatch_id =
    virtual_microbatch_id - pipeline_parallel_rank``, and "Launch any remaining grad
    reductions"; core_r0.8.0 schedules.py ``backward_step_helper``, same rule). In the
    cool-down stage ``r`` runs backward ``k + r`` when stage 0 runs ``k``, so every stage
    launches chunk c when stage 0 finishes chunk c's last backward: ``slack_s`` (the
    time from this stage's end to the pipeline's) plus ``chunk_end_s`` (where chunk c's
    last backward ends, counted back from the end), and no later than this stage's end.
    """
    return min(slack_s + chunk_end_s, 0.0)


def param_gather_exposed_s(spec: RunSpec, buckets, fwd_s: list[float], group: int,
                           lead_s: float = 0.0) -> float:
    """Forward stall from the distributed optimizer's parameter all-gather of one stage;
    ``lead_s``: time from the dispatch of the first gathers to the stage's first forward
    (the warm-up of the stages before it, when the schedule dispatches at the step's
    start)."""
    hw = spec.cluster.hardware
    total = sum(t for chunk in buckets for _, t in chunk)
    if total <= 0:
        return 0.0
    if not spec.parallel.overlap_param_gather:
        return total
    aligned = spec.parallel.align_param_gather and len(buckets) > 1
    stall = 0.0
    free = 0.0
    prev_need = 0.0
    chunk_start: list[float] = []  # when each chunk's first forward is launched
    for c, chunk in enumerate(buckets):
        first_fwd = lead_s + group * sum(fwd_s[:c])
        chunk_start.append(first_fwd + stall)
        begin = 0.0  # where the bucket's first parameter sits in the chunk's forward
        for pos, t in chunk:
            # Bucket needed when the forward reaches its first layer; launched when the
            # previous bucket was needed, or (aligned) with its whole chunk.
            need = first_fwd + begin * fwd_s[c] + stall
            begin = pos
            if aligned:
                launch = 0.0 if c < 2 else chunk_start[c - 1]
            else:
                launch = prev_need
            done = max(free, launch) + t
            if done > need:
                stall += done - need
                need = done
            free, prev_need = done, need
    return stall + hw.comm_overlap_penalty * (total - min(stall, total))


def dp_sync(spec: RunSpec, st, *, megatron_buckets: bool = True) -> DpSync:
    """``megatron_buckets=False``: every chunk of every stage bucketed (torchtitan's FSDP2
    units reduce block by block)."""
    par = spec.parallel
    group = par.pp if par.vpp > 1 else 1
    if par.vpp > 1 and spec.num_microbatches % par.pp:
        group = spec.num_microbatches  # one group (see project/estimate.py)
    exposed, opt, grads, gathers = [], [], [], []
    # Stages with the same parameters share their buckets (only the first stage's first
    # chunk is laid out apart) and their optimizer step; the exposure depends on each
    # stage's times and its place in the pipeline.
    buckets: dict = {}
    steps: dict = {}
    slack = lead = 0.0  # cool-down / warm-up of the stages before s (module docstring)
    # megatron-core's interleaved schedule with grad_sync_func (Megatron-LM, NeMo and
    # Megatron-Bridge set it by default); torchtitan reduces block by block.
    aligned = megatron_buckets and par.vpp > 1 and par.align_grad_reduce
    for s, (chunks, stage_counts) in enumerate(_param_counts(spec)):
        bwd = [a + b for a, b in zip(st.bwd_input_s[s], st.bwd_weight_s[s])]
        fwd = list(st.fwd_s[s])
        if s > 0:
            slack += st.bwd_input_s[s - 1][0] + st.bwd_weight_s[s - 1][0]
            lead += st.fwd_s[s - 1][0]
        lead_s = lead if par.align_param_gather and par.vpp > 1 else 0.0
        key = (chunks, s == 0)
        if key not in buckets:
            g_b = _chunk_syncs(spec, chunks, dp_grad_sync, s == 0, not megatron_buckets, s)
            p_b = _chunk_syncs(spec, chunks, param_gather, s == 0, not megatron_buckets, s)
            buckets[key] = (g_b, p_b, sum(t for ch in g_b for _, t in ch),
                            sum(t for ch in p_b for _, t in ch))
        g_b, p_b, g, p = buckets[key]
        if stage_counts not in steps:
            steps[stage_counts] = optimizer_step_s(spec, stage_counts, stage=s)
        exposed.append(grad_sync_exposed_s(spec, g_b, bwd, group, slack, aligned)
                       + param_gather_exposed_s(spec, p_b, fwd, group, lead_s))
        opt.append(steps[stage_counts])
        grads.append(g)
        gathers.append(p)
    how = ("FSDP (per-layer traffic in the layer costs)" if par.fsdp else
           "distributed optimizer" if par.use_distributed_optimizer else "DDP all-reduce")
    notes = (f"data-parallel sync: {how}, overlap_grad_reduce={par.overlap_grad_reduce}, "
             f"overlap_param_gather={par.overlap_param_gather}, grad_reduce_in_fp32="
             f"{par.grad_reduce_in_fp32}, align_param_gather={par.align_param_gather}; "
             "chunk-wise bucket timing (buckets only in the first chunk of stage 0)",)
    return DpSync(exposed_s=tuple(exposed), optimizer_s=tuple(opt), notes=notes,
                  grad_sync_s=tuple(grads), param_gather_s=tuple(gathers))
