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
- experts not sharded over TP (``etp=1``: torchtitan 0.3.0's sparse mesh has no
  expert-TP axis);
- pipeline split as torchtitan's ``_generate_llm_fqn_per_model_part`` (embedding and
  output weighted as one layer each), schedules mapped by ``spec/torchtitan.py``
  (GPipe, 1F1B, Interleaved1F1B, and the zero-bubble ones as ZB-H1);
- activation checkpointing: ``full`` = every block recomputed whole; ``selective``
  (torchtitan's op-level SAC) recomputes the ops outside its save list (norms, RoPE,
  residual adds, the SwiGLU activation) and every second mm of the block (wo, and w3 as
  half of the fused fc1); the SP all-gathers it re-issues under TP are not counted;
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
span dp_shard * cp ranks; the replicas' gradient all-reduce is not added. (pp > 1 with
a replica smaller than a node: torchtitan's mesh puts pp outermost, so a replica is not
contiguous; the FSDP collectives then span all data-parallel ranks.)
"""
from __future__ import annotations

from dataclasses import replace

from primus_ext.spec.run import RunSpec
from primus_ext.spec.torchtitan import SCHEDULE_SIM, canonical_schedule, stage_layer_counts

# compute/'s selective-recompute module set that stands for torchtitan's op-level SAC.
SAC_MODULES = ("torchtitan_sac",)


def view_notes(spec: RunSpec) -> tuple[str, ...]:
    """What the costed layout leaves out for this spec, said with the result."""
    out = ["framework: torchtitan (costed as its equivalent layout, project/torchtitan.py)"]
    if spec.parallel.ep > 1 and not spec.model.is_moe:
        out.append(f"parallel.ep={spec.parallel.ep} has no effect on a dense model "
                   "(torchtitan ParallelismConfig.expert_parallel_degree)")
    if spec.parallel.tp_comm_overlap and not spec.parallel.sequence_parallel:
        out.append("async TP without sequence parallelism: inductor's micro-pipeline TP "
                   "finds no all-gather / reduce-scatter next to a matmul to overlap")
    if spec.parallel.dp_replicate > 1:
        how = ("one replica costed (its FSDP2 group of dp_shard*cp ranks); the replicas' "
               "gradient all-reduce is not modelled" if _replica_cluster(spec) is not None
               else "FSDP collectives costed over all data-parallel ranks (a replica is "
               "not a whole number of nodes); the replicas' all-reduce is not modelled")
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
                  etp=1 if m.is_moe else None, ep=p.ep if m.is_moe else 1,
                  schedule=sched, pipeline_layout=layout, dp_shard=-1, dp_replicate=1,
                  cp_comm_type="allgather" if p.cp > 1 else p.cp_comm_type,
                  sequence_parallel=p.sequence_parallel or (m.is_moe and p.tp > 1))
    ac = t.activation_checkpoint
    rec = {"none": dict(recompute_granularity=None),
           "full": dict(recompute_granularity="full", recompute_method="uniform",
                        recompute_num_layers=1),
           "selective": dict(recompute_granularity="selective",
                             recompute_modules=SAC_MODULES)}[ac]
    train = replace(t, activation_checkpoint="none", compile=False,
                    fused_elementwise=t.compile, cross_entropy_loss_fusion=t.compile,
                    attention_backend="flash", flash_attn_impl="fa2", **rec)
    cluster = spec.cluster
    if p.dp_replicate > 1 and _replica_cluster(spec) is not None:
        # HSDP: each replica is an FSDP2 job on its own ranks (same per-rank work, same
        # microbatches); its gradients are all-reduced across replicas (not costed).
        cluster = _replica_cluster(spec)
        train = replace(train, global_batch_size=t.global_batch_size // p.dp_replicate)
    return RunSpec(model=m, parallel=par, train=train, cluster=cluster,
                   framework="megatron")
