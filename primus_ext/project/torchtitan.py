"""A torchtitan run as the cost model sees it.

The step of a ``framework=torchtitan`` spec is projected by the same kernels, collective
model and schedule simulator as a megatron-core one, on an equivalent layout:

- FSDP2 (``fully_shard`` per block, torchtitan ``apply_fsdp_to_decoder``): the
  per-layer FSDP collectives of ``comm/layer_comm.fsdp_comms`` -- the block's bf16
  parameters all-gathered in forward (issued ahead, overlapping the previous block's
  compute: FSDP2's implicit forward prefetch), again in backward, and its fp32
  gradients reduce-scattered behind the next block's backward (``reduce_dtype``
  float32); no distributed-optimizer all-gather, the AdamW step on the local shard;
- TP with sequence parallelism (torchtitan's default ``enable_sequence_parallel``);
  async TP (``--compile.enable_async_tensor_parallel``) as overlapped TP collectives
  (``parallel.tp_comm_overlap``);
- the routed experts sharded over TP when EP is off and over EP alone when it is on
  (``spec/torchtitan.py expert_tp``: torchtitan 0.3.0's sparse mesh has no expert-TP
  axis, ``models/common/moe_sharding.py``); MoE as torchtitan runs it (``MOE_AS_TORCHTITAN``): the
  ``AllToAllTokenDispatcher`` (``models/common/token_dispatcher.py``: an all-to-all of
  the tokens-per-expert counts, their ``.tolist()`` host sync for the splits, then an
  all-to-all of one row per (token, expert) pair over the EP group and back in
  ``combine``), the local experts as ``torch._grouped_mm`` (``models/common/moe.py
  GroupedExperts``), the permutation by index gathers (``_local_reorder`` / ``_permute``,
  not a fused kernel), an eager top-k router without an auxiliary loss (its expert bias
  is updated in the optimizer hook); EP borrows its ranks from FSDP2 and TP: experts are
  sharded over ``efsdp = dp_shard * cp * tp / ep`` (``ParallelDims.build_mesh``'s sparse
  mesh ``pp x dp_replicate x efsdp x ep``; memory/torchtitan.py);
- pipeline split as torchtitan's ``_generate_llm_fqn_per_model_part`` (embedding and
  output weighted as one layer each), schedules mapped by ``spec/torchtitan.py``
  (GPipe, 1F1B, Interleaved1F1B, and the zero-bubble ones as ZB-H1);
- activation checkpointing: ``full`` = every block recomputed whole; ``selective``
  (torchtitan's op-level SAC) recomputes the ops outside its save list (norms, RoPE,
  residual adds, the SwiGLU activation) and every second mm of the block (wo, and w3 as
  half of the fused fc1), and re-issues the forward collectives its save list does not
  hold (``_get_default_save_ops`` keeps reduce-scatter and all-to-all outputs): the SP
  all-gathers of the norm outputs (and CP's K/V all-gather), or TP's all-reduces
  without SP, run again in the backward;
- ``train.compile``: fused elementwise kernels (RMSNorm, RoPE, SwiGLU, the loss) instead
  of eager chains of single-op kernels (``train.fused_elementwise``);
- attention: PyTorch SDPA's flash backend (FlashAttention-2 kernels,
  ``flash_attn_impl='fa2'``); context parallelism all-gathers K/V (torch's
  ``context_parallel`` rotate method "allgather"; torchtitan
  ``distributed/context_parallel/api.py`` gathers them for FlexAttention too).

Under PP, FSDP2 runs without ``reshard_after_forward`` and syncs gradients on the last
microbatch only: one all-gather and one reduce-scatter per step, charged as megatron-core's
distributed optimizer (the published-run reader's rule for sharded DP next to a pipeline).

HSDP (``dp_replicate > 1``): one replica is costed -- an FSDP2 job on world /
dp_replicate ranks with the same per-rank work and microbatches, so its FSDP collectives
span dp_shard * cp ranks. (pp > 1 with a replica smaller than a node: torchtitan's mesh
puts pp outermost, so a replica is not contiguous; the FSDP collectives then span all
data-parallel ranks.) The replicas' gradient all-reduce is added by
``replica_all_reduce_s``: torchtitan applies ``fully_shard`` with the 2-D mesh
``["dp_replicate", "fsdp"]`` (``distributed/fsdp.py``), and torch's FSDP2
(``torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py``, ``foreach_reduce``)
all-reduces each unit's reduce-scattered gradient shard (``reduce_dtype`` fp32) over
the replicate group on its own stream after the unit's reduce-scatter; the backward's
end waits for them (``FSDPParamGroup._wait_for_post_backward``).
"""
from __future__ import annotations

from dataclasses import replace

from primus_ext.comm.collectives import collective_s
from primus_ext.comm.groups import _span, domain_size
from primus_ext.comm.overlap import exposed_s
from primus_ext.spec.run import RunSpec
from primus_ext.spec.torchtitan import (SCHEDULE_SIM, canonical_schedule, expert_tp,
                                        stage_layer_counts)

# megatron-core's MoE switches that cost torchtitan 0.3.0's MoE block (module docstring).
MOE_AS_TORCHTITAN = dict(moe_token_dispatcher_type="alltoall", moe_grouped_gemm=True,
                         moe_permute_fusion=False, moe_router_fusion=False,
                         moe_router_load_balancing_type="none", moe_router_terms=(),
                         overlap_moe_expert_parallel_comm=False,
                         moe_shared_expert_overlap=False)
# compute/'s selective-recompute module set that stands for torchtitan's op-level SAC.
SAC_MODULES = ("torchtitan_sac",)
# torchtitan's llama3 / qwen3 configs wrap the loss in ChunkedLossWrapper, whose
# Config.num_chunks defaults to 8 (torchtitan/components/loss.py): with loss parallelism
# each chunk's cross-entropy all-reduces max, sum-exp and target logit (3 x 8 calls a
# microbatch, seen in a measured TP 2 run).
LOSS_CHUNKS = 8


def view_notes(spec: RunSpec) -> tuple[str, ...]:
    """What the costed layout leaves out for this spec, said with the result."""
    out = ["framework: torchtitan (costed as its equivalent layout, project/torchtitan.py)"]
    if spec.parallel.ep > 1 and not spec.model.is_moe:
        out.append(f"parallel.ep={spec.parallel.ep} has no effect on a dense model "
                   "(torchtitan ParallelismConfig.expert_parallel_degree)")
    if spec.model.is_moe:
        # The switches a user sets on purpose (the others are megatron-core defaults).
        asked = ("moe_token_dispatcher_type", "overlap_moe_expert_parallel_comm",
                 "moe_shared_expert_overlap")
        changed = [f"{k}={getattr(spec.parallel, k)!r}" for k in asked
                   if getattr(spec.parallel, k) != MOE_AS_TORCHTITAN[k]]
        out.append("MoE as torchtitan 0.3.0 runs it: all-to-all token dispatch with a host "
                   "sync for the splits, torch._grouped_mm experts, index permutation, "
                   "eager router" + (f" (megatron-core switches ignored: "
                                     f"{', '.join(changed)})" if changed else ""))
    p = spec.parallel
    if p.pp == 1 and not (p.ep > 1 and spec.model.is_moe):
        out.append("torchtitan 0.3.0 captures forward+backward in a CUDA graph by default "
                   "here (Trainer: wrap_with_cuda_graph unless --training."
                   "disable_cuda_graphs): not modelled, its host launches are costed as "
                   "eager")
    if spec.parallel.tp_comm_overlap and not spec.parallel.sequence_parallel:
        out.append("async TP without sequence parallelism: inductor's micro-pipeline TP "
                   "finds no all-gather / reduce-scatter next to a matmul to overlap")
    if spec.parallel.dp_replicate > 1:
        if _replica_cluster(spec) is not None:
            how = ("one replica costed (its FSDP2 group of dp_shard*cp ranks); the "
                   "replicas' all-reduce of every unit's fp32 gradient shard, behind the "
                   "backward, " + ("once per step (PP: gradient sync on the last "
                                   "microbatch)" if spec.parallel.pp > 1
                                   else "every microbatch"))
        else:
            how = ("FSDP collectives costed over all data-parallel ranks (a replica is "
                   "not a whole number of nodes): their reduce-scatter stands for the "
                   "replicas' all-reduce too")
        out.append(f"HSDP (dp_replicate={spec.parallel.dp_replicate}): {how}")
    return tuple(out)


def _replica_cluster(spec: RunSpec):
    """The cluster of one HSDP replica (torchtitan's dp_replicate axis is outermost but
    for pp: a replica is world / dp_replicate consecutive ranks), or None when it is
    not whole nodes nor part of one node."""
    c, r = spec.cluster, spec.parallel.dp_replicate
    ranks = spec.world_size // r
    if c.num_nodes % r == 0:
        return replace(c, num_nodes=c.num_nodes // r)
    if spec.parallel.pp == 1 and ranks < c.node_size and c.node_size % ranks == 0:
        return replace(c, num_nodes=1, gpus_per_node=ranks)
    return None


def simulated_view(spec: RunSpec) -> RunSpec:
    """The megatron-equivalent RunSpec whose costs are a torchtitan run's."""
    if spec.framework != "torchtitan":
        return spec
    p, t, m = spec.parallel, spec.train, spec.model
    sched = "auto"
    layout = None
    if p.pp > 1:
        sched = SCHEDULE_SIM[canonical_schedule(p.schedule)]
        layout = stage_layer_counts(p.pp * p.vpp, m.num_layers)
    # Under PP FSDP2 keeps the stage gathered from the first forward to the last
    # backward and reduce-scatters once (reshard_after_forward off, gradient sync on the
    # last microbatch): one gather and one reduce-scatter per step, as megatron-core's
    # distributed optimizer communicates.
    fsdp = p.pp == 1
    par = replace(p, fsdp=fsdp, use_distributed_optimizer=not fsdp,
                  grad_reduce_in_fp32=True,
                  etp=expert_tp(p) if m.is_moe else None, ep=p.ep if m.is_moe else 1,
                  schedule=sched, pipeline_layout=layout, dp_shard=-1, dp_replicate=1,
                  cp_comm_type="allgather" if p.cp > 1 else p.cp_comm_type,
                  sequence_parallel=p.sequence_parallel or (m.is_moe and p.tp > 1),
                  **(MOE_AS_TORCHTITAN if m.is_moe else {}))
    ac = t.activation_checkpoint
    # Full AC wraps each block in torch's non-reentrant checkpoint (torchtitan
    # parallelize_llama.py _apply_ac_to_transformer_block: ptd_checkpoint_wrapper, whose
    # default is CheckpointImpl.NO_REENTRANT), which stops recomputing once the block's
    # last saved tensor is rebuilt (train.recompute_early_stop).
    rec = {"none": dict(recompute_granularity=None),
           "full": dict(recompute_granularity="full", recompute_method="uniform",
                        recompute_num_layers=1, recompute_early_stop=True),
           "selective": dict(recompute_granularity="selective",
                             recompute_modules=SAC_MODULES)}[ac]
    # torchtitan builds PyTorch modules, never Transformer Engine's.
    train = replace(t, activation_checkpoint="none", compile=False, te=False,
                    fused_elementwise=t.compile, cross_entropy_loss_fusion=t.compile,
                    attention_backend="flash", flash_attn_impl="fa2",
                    loss_chunks=t.loss_chunks or LOSS_CHUNKS, **rec)
    cluster = spec.cluster
    if p.dp_replicate > 1 and _replica_cluster(spec) is not None:
        # HSDP: each replica is an FSDP2 job on its own ranks (same per-rank work, same
        # microbatches); its gradients are all-reduced across replicas (not costed).
        cluster = _replica_cluster(spec)
        train = replace(train, global_batch_size=t.global_batch_size // p.dp_replicate)
    return RunSpec(model=m, parallel=par, train=train, cluster=cluster,
                   framework="megatron")


def replica_all_reduce_s(spec: RunSpec, bwd_s: tuple[float, ...]
                         ) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """HSDP's replica all-reduce per stage and step: (seconds, exposed seconds).

    ``spec`` is the torchtitan spec, ``bwd_s`` each stage's backward compute of one
    microbatch. Per FSDP unit, the fp32 gradient shard (FSDP2 ``reduce_dtype``) is
    all-reduced over the ``dp_replicate`` ranks, which torchtitan's mesh (``pp,
    dp_replicate, dp_shard, cp, tp``, tp fastest) places ``dp_shard * cp * tp`` ranks
    apart. The all-reduces run one after another on FSDP2's all-reduce stream behind the
    rest of the backward; the last unit's (the first in execution order) starts after
    the backward's compute and is exposed whole. Without PP every microbatch syncs;
    under PP only the last (torch.distributed.pipelining ``stage.py`` turns gradient
    sync off for the others). Zero when the costed layout already spreads the FSDP
    collectives over all data-parallel ranks (``simulated_view``: a replica that is not
    whole nodes), whose reduce-scatter then reduces across the replicas too.
    """
    from primus_ext.memory.torchtitan import fsdp_sizes, fsdp_units
    p, c = spec.parallel, spec.cluster
    n = len(bwd_s)
    if p.dp_replicate == 1 or _replica_cluster(spec) is None:
        return (0.0,) * n, (0.0,) * n
    fsdp, efsdp = fsdp_sizes(spec)
    layout = (("tp", p.tp), ("cp", p.cp), ("dp_shard", fsdp // p.cp),
              ("dp_replicate", p.dp_replicate), ("pp", p.pp))
    span = _span(layout, ("dp_replicate",), c.node_size, domain_size(c), "dp_replicate")
    hw = c.hardware
    syncs = 1 if p.pp > 1 else spec.num_microbatches
    secs, exposed = [], []
    for stage in range(n):
        units = fsdp_units(spec, stage)
        each = [collective_s(hw, span, "all_reduce",
                             4 * (-(-d // fsdp) + -(-e // efsdp))) for d, e in units]
        total = sum(each)
        one = exposed_s(hw, total, bwd_s[stage], tail_s=each[0] if each else 0.0)
        secs.append(syncs * total)
        exposed.append(syncs * one)
    return tuple(secs), tuple(exposed)
