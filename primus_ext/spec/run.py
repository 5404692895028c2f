"""RunSpec: one training configuration (model x layout x training x cluster).

Cross-field rules are checked here, each as one ValueError naming fields, values, rule.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from primus_ext.spec._check import check_types
from primus_ext.spec.cluster import ClusterSpec
from primus_ext.spec.legal_megatron import check_spec
from primus_ext.spec.layout import PipelineLayout, pipeline_layout
from primus_ext.spec.model import ModelSpec
from primus_ext.spec.parallel import TORCHTITAN_SCHEDULES, ParallelSpec
from primus_ext.spec.torchtitan import FRAMEWORKS, check_torchtitan, stage_layer_counts
from primus_ext.spec.train import TrainSpec


@dataclass(frozen=True, kw_only=True, slots=True)
class RunSpec:
    model: ModelSpec
    parallel: ParallelSpec
    train: TrainSpec
    cluster: ClusterSpec
    # Which training framework runs the job: megatron (megatron-core) or torchtitan.
    framework: str = "megatron"
    layout: PipelineLayout = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_types(self, "spec")
        if self.framework not in FRAMEWORKS:
            raise ValueError(f"framework={self.framework!r} must be one of "
                             f"{', '.join(FRAMEWORKS)}")
        if self.framework == "torchtitan":
            check_torchtitan(self.model, self.parallel, self.train, self.cluster)
        else:
            check_megatron_only(self.parallel, self.train)
        check_run(self.model, self.parallel, self.train, self.cluster,
                  self.framework)
        if self.framework != "torchtitan":
            # Megatron-LM's own argument checks on the line the recipe writes.
            check_spec(self.model, self.parallel, self.train)
        object.__setattr__(self, "layout", pipeline_layout(
            self.model.num_layers, layout_parallel(self.model, self.parallel,
                                                   self.framework)))

    # ---- derived sizes -------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return self.cluster.world_size

    @property
    def dp(self) -> int:
        return self.world_size // self.parallel.model_parallel_size

    @property
    def expert_dp(self) -> int:
        p = self.parallel
        return self.world_size // (p.ep * p.expert_tp * p.pp)

    @property
    def num_microbatches(self) -> int:
        return self.train.global_batch_size // (self.train.micro_batch_size * self.dp)

    @property
    def tokens_per_step(self) -> int:
        return self.train.global_batch_size * self.train.seq_length


def require_spec(fn: str, spec) -> None:
    """The public API's entry check: ``fn(spec)`` was given something else than a RunSpec
    (a string, None, a dict): one TypeError saying what it takes."""
    if not isinstance(spec, RunSpec):
        raise TypeError(f"{fn}(spec={spec!r}): spec must be a RunSpec, e.g. "
                        f"{fn}(primus_ext.compose(['model=llama3_70b']))")


def layout_parallel(model: ModelSpec, par: ParallelSpec, framework: str) -> ParallelSpec:
    """The ParallelSpec whose pipeline layout is the framework's: torchtitan splits the
    layers as _generate_llm_fqn_per_model_part (embedding and output weigh one layer)."""
    if framework != "torchtitan" or par.pp == 1:
        return par
    return replace(par, pipeline_layout=stage_layer_counts(par.pp * par.vpp,
                                                           model.num_layers))


def check_megatron_only(par: ParallelSpec, train: TrainSpec) -> None:
    """Fields and names that only torchtitan has."""
    for name, value, default in (("parallel.dp_shard", par.dp_shard, -1),
                                 ("parallel.dp_replicate", par.dp_replicate, 1),
                                 ("train.activation_checkpoint",
                                  train.activation_checkpoint, "none"),
                                 ("train.compile", train.compile, False)):
        if value != default:
            raise ValueError(f"{name}={value!r} applies to framework=torchtitan only "
                             f"(framework=megatron; default {default!r})")
    if train.cpu_offloading_num_layers and par.pp > 1:
        # megatron-core TransformerConfig.__post_init__: no pipeline parallelism with CPU
        # offloading.
        raise ValueError(f"train.cpu_offloading_num_layers="
                         f"{train.cpu_offloading_num_layers} requires parallel.pp=1 "
                         f"(pp={par.pp}; megatron-core has no CPU offloading under PP)")
    if par.schedule in TORCHTITAN_SCHEDULES:
        raise ValueError(f"parallel.schedule={par.schedule!r} is a torchtitan schedule "
                         "(framework=torchtitan); megatron-core's are auto, 1f1b, "
                         "interleaved, zb")


def check_run(model: ModelSpec, par: ParallelSpec, train: TrainSpec,
              cluster: ClusterSpec, framework: str = "megatron") -> None:
    """Legality of a layout for a model on a cluster (shared by specs and the tuner).
    torchtitan's own rules are ``spec/torchtitan.check_torchtitan``; the megatron-core
    ones that torchtitan does not share are skipped for it."""
    titan = framework == "torchtitan"
    world = cluster.world_size
    mp = par.tp * par.pp * par.cp
    if world % mp != 0:
        raise ValueError(
            f"world size {world} (cluster.num_nodes={cluster.num_nodes} x "
            f"{cluster.node_size} GPUs) is not divisible by tp*pp*cp="
            f"{par.tp}*{par.pp}*{par.cp}={mp}")
    dp = world // mp
    if model.num_attention_heads % par.tp != 0:
        raise ValueError(f"model.num_attention_heads={model.num_attention_heads} is not "
                         f"divisible by parallel.tp={par.tp}")
    if not model.multi_latent_attention and model.num_groups % par.tp != 0:
        raise ValueError(f"model.num_query_groups={model.num_groups} is not divisible by "
                         f"parallel.tp={par.tp}")
    if titan:
        pass  # EP borrows from dp_shard*cp*tp (check_torchtitan); no expert TP
    elif model.is_moe:
        etp = par.expert_tp
        if model.num_moe_experts % par.ep != 0:
            raise ValueError(f"model.num_moe_experts={model.num_moe_experts} is not "
                             f"divisible by parallel.ep={par.ep}")
        if (world // par.pp) % (par.ep * etp) != 0:
            raise ValueError(
                f"parallel.ep*etp={par.ep}*{etp}={par.ep * etp} does not divide the "
                f"expert-parallel world world/pp={world}/{par.pp}={world // par.pp}")
        if par.tp > 1 and not par.sequence_parallel:
            # megatron-core 0.16.1 transformer/moe/moe_layer.py:379 raises it in training.
            raise ValueError(f"MoE with parallel.tp={par.tp} > 1 requires "
                             "parallel.sequence_parallel=True (megatron-core MoELayer: "
                             "'MoE and tensor parallelism are enabled without also "
                             "enabling sequence parallelism')")
    elif par.ep > 1:
        raise ValueError(f"parallel.ep={par.ep} > 1 needs an MoE model "
                         f"(model.num_moe_experts={model.num_moe_experts})")
    per_step = train.micro_batch_size * dp
    if train.global_batch_size % per_step != 0:
        raise ValueError(
            f"train.global_batch_size={train.global_batch_size} is not divisible by "
            f"micro_batch_size*dp={train.micro_batch_size}*{dp}={per_step}")
    if par.cp > 1 and train.seq_length % (2 * par.cp) != 0:
        raise ValueError(f"train.seq_length={train.seq_length} is not divisible by "
                         f"2*cp=2*{par.cp} (load-balanced causal context parallelism)")
    if par.sequence_parallel and (train.seq_length // par.cp) % par.tp != 0:
        raise ValueError(f"train.seq_length/cp={train.seq_length // par.cp} is not "
                         f"divisible by tp={par.tp} (sequence parallelism)")
    m = train.global_batch_size // per_step
    per_run = train.microbatches_per_schedule
    if per_run is not None and m % per_run:
        raise ValueError(f"train.microbatches_per_schedule={per_run} does not divide the "
                         f"step's {m} microbatches (global_batch_size/(micro_batch_size*dp))")
    if par.resolved_schedule == "interleaved" and m < par.pp and not titan:
        raise ValueError(
            f"interleaved schedule needs num_microbatches >= pp: global_batch_size/"
            f"(micro_batch_size*dp)={m} < pp={par.pp}")
    if train.recompute_granularity == "full" and train.recompute_method == "uniform":
        per_chunk = model.num_layers // (par.pp * par.vpp)
        if train.recompute_num_layers > max(per_chunk, 1) and par.pipeline_layout is None:
            raise ValueError(
                f"train.recompute_num_layers={train.recompute_num_layers} exceeds the "
                f"{per_chunk} layers of a pipeline chunk (recompute_method='uniform')")
    if train.optimizer_impl != "megatron" and (not par.use_distributed_optimizer
                                               or par.fsdp):
        # Apex DistributedFusedAdam always shards its state over the data-parallel group.
        raise ValueError(f"train.optimizer_impl={train.optimizer_impl!r} shards the "
                         "optimizer over data parallelism: it needs "
                         "parallel.use_distributed_optimizer=true and parallel.fsdp=false")
    if train.cpu_offloading_num_layers >= model.num_layers:
        # megatron-core TransformerConfig.__post_init__: "CPU offloading can be done only
        # for layers less than num_layers".
        raise ValueError(f"train.cpu_offloading_num_layers="
                         f"{train.cpu_offloading_num_layers} must be below the model's "
                         f"{model.num_layers} layers")
    pipeline_layout(model.num_layers, layout_parallel(model, par, framework))


def uses_te(spec: RunSpec) -> bool:
    """Whether the run's layers are Transformer Engine modules: ``train.te`` when set,
    else TE on GPU hardware and megatron-core's local spec on a CPU (TE has no CPU
    build)."""
    if spec.train.te is not None:
        return spec.train.te
    return spec.cluster.hardware.name != "cpu"
