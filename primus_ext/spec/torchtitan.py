"""TorchTitan layouts: its rules, its pipeline split, its schedules.

Axes are torchtitan's (``torchtitan.config.configs.ParallelismConfig``, v0.3.0):
``dp_replicate`` (HSDP replicas), ``dp_shard`` (FSDP2 degree; -1 = the ranks left after
the other axes), ``cp``, ``tp`` (with ``enable_sequence_parallel``), ``pp``, ``ep``.
The data-parallel (batch) degree is ``dp_replicate * dp_shard``, the same number as the
project's ``world / (tp * pp * cp)``; FSDP2 shards parameters over ``dp_shard * cp``
(torchtitan's ``fsdp`` mesh, ``ParallelDims.build_mesh``).

Rules checked here, each named after the torchtitan code that enforces it:

- ``ParallelDims._validate``: every degree >= 1 except ``dp_shard`` (-1 or >= 1), and
  ``dp_replicate * dp_shard * cp * tp * pp == world size``;
- ``ParallelismConfig.expert_parallel_degree``: EP borrows ranks from FSDP and TP, so
  ``ep`` divides ``dp_shard * cp * tp`` (``efsdp = dp_shard * cp * tp / ep``); the
  experts' TP is torchtitan's choice (``expert_tp``), not a setting;
- ``Trainer.__init__`` (batch check): ``global_batch_size`` is a multiple of
  ``local_batch_size * dp_replicate * dp_shard``;
- ``Trainer.Config.__post_init__``: ``local_batch_size`` divisible by
  ``pipeline_parallel_microbatch_size`` under PP;
- ``CompileConfig.__post_init__``: async TP needs ``compile.enable``;
- ``pipeline_parallel._get_num_virtual_stages`` / ``get_pipeline_schedule_stage_ids``:
  single-stage schedules (1F1B, GPipe) run one stage per rank, multi-stage ones at
  least two, V-shaped ones (ZBVZeroBubble) exactly two;
- ``pipeline_parallel._generate_llm_fqn_per_model_part``: decoder layers split over
  ``pp * stages_per_rank`` stages with the embedding and the output counted as one
  layer each; no stage may be empty.
"""
from __future__ import annotations

FRAMEWORKS = ("megatron", "torchtitan")
ACTIVATION_CHECKPOINTS = ("none", "selective", "full")

# torch.distributed.pipelining.schedules.get_schedule_class names (torch 2.13, the map
# torchtitan 0.3.0 uses) -> the project's schedule simulator (project/schedule_order.py).
# GPipe runs as the simulator's fill_drain order (all forwards, then all backwards).
# InterleavedZeroBubble and ZBVZeroBubble split the backward into input and weight
# gradients like ZB-H1; the simulator runs them as ZB-H1 over the rank's stages folded
# into one (the interleaving's smaller bubble is not modelled for them).
SCHEDULE_SIM = {
    "1F1B": "1f1b",
    "GPipe": "fill_drain",
    "Interleaved1F1B": "interleaved",
    "InterleavedZeroBubble": "zb",
    "ZBVZeroBubble": "zb",
}
SINGLE_STAGE_SCHEDULES = ("1F1B", "GPipe")
V_SCHEDULES = ("ZBVZeroBubble",)
NOT_MODELLED_SCHEDULES = ("LoopedBFS", "DualPipeV", "PipelineScheduleSingle",
                          "PipelineScheduleMulti")


def canonical_schedule(name: str) -> str | None:
    """``name`` when it is one of torchtitan's schedule names (spelled as torch's
    get_schedule_class map spells them), else None."""
    return name if name in tuple(SCHEDULE_SIM) + NOT_MODELLED_SCHEDULES else None


def expert_tp(par) -> int:
    """TP degree over the routed experts' weights in torchtitan 0.3.0
    (``models/common/moe_sharding.py``): with EP off they are sharded over the dense TP
    axis (``expert_param_placement_dense``: colwise w1/w3, rowwise w2) and FSDP2 over
    ``fsdp``; with EP on they are split over ``ep`` only (``expert_param_placement_
    sparse``: EP borrows the TP ranks) and FSDP2 over ``efsdp``."""
    return par.tp if par.ep == 1 else 1


def resolved_dp_shard(dp_shard: int, dp_replicate: int, cp: int, tp: int, pp: int,
                      world: int) -> int:
    """ParallelDims._validate: dp_shard=-1 takes the ranks the other axes leave."""
    if dp_shard == -1:
        return world // (dp_replicate * cp * tp * pp)
    return dp_shard


def stage_layer_counts(num_stages: int, num_layers: int, input_weight: int = 1,
                       output_weight: int = 1) -> tuple[int, ...]:
    """Decoder layers per pipeline stage (virtual stages in order), as
    torchtitan's _generate_llm_fqn_per_model_part splits them; ValueError where it
    raises."""
    if num_stages == 1:
        return (num_layers,)
    effective = num_layers + input_weight + output_weight
    if num_stages > effective:
        raise ValueError(f"parallel: {num_stages} pipeline stages exceed the "
                         f"{effective} effective layers (num_layers + embedding + output; "
                         "torchtitan _generate_llm_fqn_per_model_part)")
    per, extra = divmod(effective, num_stages)
    if per == 0 or input_weight > per or output_weight > per:
        raise ValueError(f"parallel: {num_stages} pipeline stages leave {per} effective "
                         f"layers per stage; torchtitan (_generate_llm_fqn_per_model_part) "
                         "needs at least one beside the embedding / output")
    counts, left = [], num_layers
    for s in range(num_stages):
        eff = per + (1 if s < extra else 0)
        if s == 0:
            eff -= input_weight
        elif s == num_stages - 1:
            eff -= output_weight
        take = min(eff, left)
        counts.append(take)
        left -= take
    return tuple(counts)


def layers_per_stage_for(num_layers: int, num_stages: int) -> int | None:
    """pipeline_parallel_layers_per_stage giving ``num_stages`` virtual stages
    (torchtitan: ceil((num_layers + 2) / layers_per_stage)), or None."""
    for lps in range(1, num_layers + 3):
        if -(-(num_layers + 2) // lps) == num_stages:
            return lps
    return None


def check_torchtitan(model, par, train, cluster) -> None:
    """torchtitan's own legality rules (see the module docstring); ValueError naming
    the field, the value and the rule."""
    world = cluster.world_size
    if par.dp_shard != -1 and par.dp_shard < 1:
        raise ValueError(f"parallel.dp_shard={par.dp_shard} must be -1 or >= 1 "
                         "(torchtitan ParallelDims._validate)")
    rest = par.dp_replicate * par.cp * par.tp * par.pp
    dp_shard = resolved_dp_shard(par.dp_shard, par.dp_replicate, par.cp, par.tp, par.pp,
                                 world)
    if dp_shard < 1 or par.dp_replicate * dp_shard * par.cp * par.tp * par.pp != world:
        raise ValueError(
            f"parallel: dp_replicate({par.dp_replicate}) * dp_shard({par.dp_shard}) * "
            f"cp({par.cp}) * tp({par.tp}) * pp({par.pp}) != world size({world}) "
            f"(torchtitan ParallelDims._validate; the other axes take {rest} ranks)")
    if (dp_shard * par.cp * par.tp) % par.ep != 0:
        raise ValueError(
            f"parallel.ep={par.ep} does not divide dp_shard*cp*tp={dp_shard}*{par.cp}*"
            f"{par.tp}: torchtitan's EP borrows ranks from FSDP and TP "
            "(ParallelismConfig.expert_parallel_degree, efsdp = dp_shard*cp*tp/ep)")
    if model.is_moe and par.ep > 1 and model.num_moe_experts % par.ep != 0:
        raise ValueError(f"model.num_moe_experts={model.num_moe_experts} is not divisible "
                         f"by parallel.ep={par.ep}")
    if par.etp is not None and par.etp != expert_tp(par):
        raise ValueError(f"parallel.etp={par.etp}: torchtitan 0.3.0 decides the experts' TP "
                         f"itself (here {expert_tp(par)}): TP shards them when EP is off, "
                         "and EP borrows the TP ranks when it is on (models/common/"
                         "moe_sharding.py); leave parallel.etp unset")
    dp = par.dp_replicate * dp_shard
    per_step = train.micro_batch_size * dp
    if train.global_batch_size % per_step != 0:
        raise ValueError(
            f"train.global_batch_size={train.global_batch_size} is not a multiple of "
            f"local batch * data-parallel degree = {train.micro_batch_size}*{dp} "
            "(torchtitan Trainer: global batch size must be multiple of local batch size "
            "times data-parallel degree)")
    if par.tp_comm_overlap and not train.compile:
        raise ValueError("parallel.tp_comm_overlap=True (async TP) requires "
                         "train.compile=True (torchtitan CompileConfig: Async TP requires "
                         "'model' in --compile.components and --compile.enable)")
    if par.tp_comm_overlap and par.tp == 1:
        raise ValueError("parallel.tp_comm_overlap=True (async TP) requires tp > 1")
    if par.fsdp or par.use_distributed_optimizer:
        raise ValueError("parallel.fsdp / parallel.use_distributed_optimizer are "
                         "megatron-core switches; torchtitan always applies FSDP2 "
                         "(set parallel.dp_shard / dp_replicate)")
    if train.recompute_granularity is not None:
        raise ValueError(f"train.recompute_granularity={train.recompute_granularity!r} is "
                         "megatron-core's; with framework=torchtitan use "
                         "train.activation_checkpoint=none|selective|full")
    if par.cp > 1 and train.seq_length % (2 * par.cp) != 0:
        raise ValueError(f"train.seq_length={train.seq_length} is not divisible by "
                         f"2*cp=2*{par.cp} (torchtitan's headtail load balancer splits the "
                         "sequence in 2*cp chunks)")
    if par.sequence_parallel and (train.seq_length // par.cp) % par.tp != 0:
        raise ValueError(f"train.seq_length/cp={train.seq_length // par.cp} is not "
                         f"divisible by tp={par.tp} (sequence parallelism)")
    check_schedule(model, par)
    m = train.global_batch_size // per_step
    if par.pp > 1 and SCHEDULE_SIM.get(par.schedule) == "interleaved" and m < par.pp:
        raise ValueError(
            f"parallel.schedule={par.schedule} with {m} microbatches < pp={par.pp}: "
            "torchtitan runs it (with a bubble warning), but the schedule simulator "
            "follows megatron-core's interleaved order, which needs num_microbatches >= pp "
            "(raise train.global_batch_size or lower micro_batch_size)")


def check_schedule(model, par) -> None:
    name = par.schedule
    if par.pp == 1:
        if par.vpp != 1:
            raise ValueError(f"parallel.vpp={par.vpp} requires pp > 1 (pp=1)")
        return
    canon = canonical_schedule(name)
    if canon is None:
        raise ValueError(f"parallel.schedule={name!r} must be one of torchtitan's "
                         f"schedules {', '.join(SCHEDULE_SIM)} with framework=torchtitan")
    if canon in NOT_MODELLED_SCHEDULES:
        raise ValueError(f"parallel.schedule={name!r} is a torchtitan schedule the "
                         f"simulator does not model; use one of {', '.join(SCHEDULE_SIM)}")
    if canon in SINGLE_STAGE_SCHEDULES and par.vpp != 1:
        raise ValueError(f"parallel.schedule={canon} with vpp={par.vpp}: single stage "
                         "schedule requires exactly 1 stage per rank (torchtitan "
                         "pipeline_parallel._get_num_virtual_stages)")
    if canon not in SINGLE_STAGE_SCHEDULES and par.vpp < 2:
        raise ValueError(f"parallel.schedule={canon} with vpp={par.vpp}: multi-stage "
                         "schedule requires at least 2 stages per rank (torchtitan "
                         "pipeline_parallel._get_num_virtual_stages)")
    if canon not in SINGLE_STAGE_SCHEDULES and par.vpp != 2 and layers_per_stage_for(
            model.num_layers, par.pp * par.vpp) is None:
        raise ValueError(f"parallel.vpp={par.vpp}: torchtitan sets more than 2 stages per "
                         "rank through pipeline_parallel_layers_per_stage, and no value "
                         f"gives pp*vpp={par.pp * par.vpp} stages for {model.num_layers} "
                         "layers (ceil((layers + 2) / layers_per_stage); torchtitan "
                         "pipeline_parallel._get_num_virtual_stages)")
    if canon in V_SCHEDULES and par.vpp != 2:
        raise ValueError(f"parallel.schedule={canon} with vpp={par.vpp}: v schedules "
                         "assume 2 stages per rank (torchtitan "
                         "get_pipeline_schedule_stage_ids)")
    stage_layer_counts(par.pp * par.vpp, model.num_layers)
