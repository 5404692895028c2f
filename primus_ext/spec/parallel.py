"""ParallelSpec: parallel degrees, pipeline layout, sharding and overlap switches.

Degrees use Megatron-LM's meaning: ``tp`` tensor, ``pp`` pipeline, ``vpp`` virtual
pipeline chunks per stage (1 = no interleaving), ``cp`` context, ``ep`` expert,
``etp`` expert-tensor (None = same as tp, Megatron's default). The data-parallel size is
derived from the world size in RunSpec.
"""
from __future__ import annotations

from dataclasses import dataclass

from primus_ext.spec._check import check_types, non_negative, one_of, positive
from primus_ext.spec.legal_megatron import FSDP_IMPLS
from primus_ext.spec.torchtitan import SCHEDULE_SIM

TORCHTITAN_SCHEDULES = tuple(SCHEDULE_SIM) + ("LoopedBFS", "DualPipeV")

_OWNER = "parallel"
# The simulator's schedules and torchtitan's names (spec/torchtitan.py maps those onto
# the simulator; framework=torchtitan only).
# fill_drain: GPipe's order (every forward, then every backward), which megatron-core does
# not ship; torchtitan's GPipe runs as it.
SIM_SCHEDULES = ("auto", "1f1b", "interleaved", "zb", "fill_drain")
SCHEDULES = SIM_SCHEDULES + TORCHTITAN_SCHEDULES
AXES = ("tp", "cp", "ep", "dp", "pp")
# megatron-core --moe-token-dispatcher-type. Megatron-LM's flag defaults to allgather, but
# megatron-core's MoE guide recommends alltoall with EP and every published MoE recipe
# sets alltoall or flex, so alltoall is the default here.
MOE_DISPATCHERS = ("alltoall", "allgather", "flex")
GRAD_BUFFERS = ("persistent", "on_backward")
# --moe-aux-loss-coeff > 0 (aux / seq / global balancing losses), --moe-z-loss-coeff,
# --moe-input-jitter-eps, --moe-router-enable-expert-bias, --moe-router-score-function
# sigmoid, --moe-router-topk-scaling-factor, --moe-router-padding-for-fp8 /
# -quantization, --moe-per-layer-logging.
ROUTER_TERMS = ("aux_loss", "z_loss", "input_jitter", "expert_bias", "sigmoid",
                "topk_scaling", "padding", "per_layer_logging")
# megatron-core TransformerConfig.moe_router_load_balancing_type.
MOE_BALANCING = ("aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "none")


@dataclass(frozen=True, kw_only=True, slots=True)
class ParallelSpec:
    tp: int = 1
    pp: int = 1
    vpp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int | None = None
    sequence_parallel: bool = False
    use_distributed_optimizer: bool = True
    fsdp: bool = False
    # Which FSDP runs under fsdp=True (framework=megatron): Megatron-FSDP
    # (--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params) or
    # PyTorch FSDP2 (--use-torch-fsdp2), each within Megatron-LM's own rules
    # (spec/legal_megatron.py).
    fsdp_impl: str = "megatron_fsdp"
    # Under fsdp=True: True (ZeRO-3, FSDP1 FULL_SHARD) frees each layer's gathered
    # parameters after its forward and gathers them again in backward; False (ZeRO-2,
    # FSDP1 SHARD_GRAD_OP, FSDP2 reshard_after_forward=False) keeps them gathered from the
    # forward to the layer's backward: no backward all-gather, every layer's unsharded
    # parameters held at the backward's start.
    fsdp_reshard_after_forward: bool = True
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = True
    tp_comm_overlap: bool = False
    # Gradients accumulated and reduced in fp32 (megatron-core DistributedDataParallelConfig
    # grad_reduce_in_fp32; Megatron-LM turns it on with --bf16 unless --grad-reduce-in-bf16).
    # False: bf16 gradient reduce-scatter / all-reduce (half the bytes).
    grad_reduce_in_fp32: bool = True
    # When a rank's unsharded gradients exist: 'persistent' = megatron-core DDP's
    # contiguous grad buffer, allocated at start-up (param_and_grad_buffer.py);
    # 'on_backward' = allocated at a model chunk's first backward of the step and freed
    # once its last microbatch's gradients are reduce-scattered (PyTorch FSDP with the
    # gradient sync deferred to the last microbatch: the autograd .grad / FSDP unsharded
    # grad), so the activation peak of an early pipeline stage can come before them.
    grad_buffer: str = "persistent"
    # megatron-core DistributedDataParallelConfig.bucket_size: parameters per DDP bucket
    # of the buckets that are bucketed at all; None = megatron-core's default
    # max(40M, 1M * dp) (distributed_data_parallel.py DistributedDataParallel.__init__).
    # NeMo 2.0's MegatronCommOverlapCallback and Megatron-Bridge's CommOverlapConfig set
    # 128 * 1024 * 1024 when dp > 1.
    ddp_bucket_params: int | None = None
    # DistributedDataParallelConfig.num_distributed_optimizer_instances (Megatron-LM
    # --num-distributed-optimizer-instances): the distributed optimizer shards its state
    # and the DDP buffers over dp / instances ranks (the intra-instance group of
    # distributed_data_parallel.py) and all-reduces across the instances; Megatron-FSDP
    # shards within an instance (HSDP, fsdp/mcore_fsdp_adapter.py).
    num_distributed_optimizer_instances: int = 1
    # DistributedDataParallelConfig.align_param_gather: with the interleaved schedule every
    # model chunk's parameter all-gathers are dispatched together, ahead of the chunk
    # (schedules.py forward_backward_pipelining_with_interleaving param_sync_func), instead
    # of one bucket ahead from the forward pre-hooks. NeMo 2.0 / Megatron-Bridge turn it on
    # when pp > 1 and vpp > 1 and dp > 1.
    align_param_gather: bool = False
    # Megatron-LM --no-align-grad-reduce (default on: core_v0.16.1 training.py sets
    # config.grad_sync_func = start_grad_sync per chunk when args.align_grad_reduce;
    # core_r0.8.0 did the same under --delay-grad-reduce, also default on; Megatron-Bridge
    # setup.py align_grad_reduce=True). Under the interleaved schedule a chunk's gradient
    # sync is then launched whole when stage 0 finishes the chunk's last backward
    # (project/dp_sync.py), not bucket by bucket from the backward hooks.
    align_grad_reduce: bool = True
    # MoE token dispatch (megatron-core): alltoall = one copy per (token, expert) pair in an
    # all-to-all; allgather = all-gather of the EP group's tokens and reduce-scatter of the
    # outputs; flex = DeepEP / HybridEP kernels that send a token once per destination node
    # over the network and fan it out over NVLink (--moe-token-dispatcher-type flex).
    moe_token_dispatcher_type: str = "alltoall"
    # --overlap-moe-expert-parallel-comm (megatron-core >= 0.14): the dispatch / combine
    # all-to-alls of one microbatch overlap the compute of another (merged forward and
    # backward in the steady state of 1F1B; needs pp == 1 or interleaving).
    overlap_moe_expert_parallel_comm: bool = False
    # --moe-shared-expert-overlap: the shared experts run while the routed tokens are
    # dispatched and combined (alltoall dispatcher).
    moe_shared_expert_overlap: bool = False
    # How megatron-core runs the MoE block (kernel and module choices: host launches,
    # host-device synchronisations, per-expert loops). Defaults: what the performance
    # recipes set; a Megatron-LM launch line keeps its flag defaults (all off, router
    # 'aux_loss'). --moe-grouped-gemm: TEGroupedMLP (one module for the local experts)
    # instead of SequentialMLP's loop; --moe-permute-fusion / --moe-router-fusion: TE's
    # fused permutation and router kernels; --moe-router-load-balancing-type: 'sinkhorn'
    # balances by Sinkhorn iterations (megatron-core moe_utils.sinkhorn: a host-device
    # synchronisation per iteration; the busiest EP rank then carries uniform routing's
    # load, not a learned router's skew: compute/routing.py), the loss-based types keep
    # the learned router's skew; --moe-flex-dispatcher-backend: DeepEP or HybridEP
    # kernels behind the flex dispatcher.
    moe_grouped_gemm: bool = True
    moe_permute_fusion: bool = True
    moe_router_fusion: bool = False
    moe_router_load_balancing_type: str = "aux_loss"
    moe_flex_dispatcher_backend: str = "deepep"
    # SMs the flex dispatcher's kernels run on (--moe-deepep-num-sms / --moe-hybridep-num-
    # sms, Megatron-LM main's --moe-flex-dispatcher-num-sms): their bandwidth
    # (hardware.flex_efficiency) and the compute they take while overlapped; None: the
    # backend's megatron-core default (comm/moe_comm.py flex_num_sms: DeepEP 20,
    # HybridEP 16).
    moe_flex_num_sms: int | None = None
    # TransformerConfig.use_transformer_engine_op_fuser with Transformer Engine's CuTe DSL
    # fused grouped MLP (NVTE_CUTEDSL_FUSED_GROUPED_MLP=1; megatron-core experts.py
    # TEGroupedMLP._is_fused_impl_supported): fc1, the gated activation with the routing
    # probabilities and fc2 of all local experts as grouped kernels, the activation (and
    # its quantisation) in the GEMM epilogue.
    moe_fused_grouped_mlp: bool = False
    # The router's optional terms (megatron-core moe/router.py TopKRouter.routing and
    # moe_utils.py; ROUTER_TERMS): each adds kernels to every MoE layer, some a
    # reduction and a read-back per step (compute/host.py ROUTER_TERM_WORK).
    moe_router_terms: tuple[str, ...] = ()
    schedule: str = "auto"  # auto: interleaved when vpp > 1, else 1f1b
    order: str = "tp-cp-ep-dp-pp"
    # --cp-comm-type: p2p (ring of K/V chunks), a2a (Ulysses-style all-to-all of heads) or
    # allgather (K/V of the whole sequence gathered once per layer, as TE's all_gather
    # mode and PyTorch's context_parallel with rotate_method=allgather do).
    cp_comm_type: str = "p2p"
    # Uneven pipeline layouts as Megatron-LM expresses them.
    decoder_first_pipeline_num_layers: int | None = None
    decoder_last_pipeline_num_layers: int | None = None
    account_for_embedding_in_pipeline_split: bool = False
    account_for_loss_in_pipeline_split: bool = False
    # Explicit layout: decoder layers per virtual stage, in pipeline order
    # (chunk 0 of stages 0..pp-1, then chunk 1, ...); length pp * vpp.
    pipeline_layout: tuple[int, ...] | None = None
    # torchtitan only (framework=torchtitan; ParallelismConfig data_parallel_*_degree):
    # FSDP2 degree (-1 = the ranks the other axes leave) and HSDP replicas.
    dp_shard: int = -1
    dp_replicate: int = 1

    def __post_init__(self) -> None:
        check_types(self, _OWNER)
        for f in ("tp", "pp", "vpp", "cp", "ep", "dp_replicate"):
            positive(_OWNER, f, getattr(self, f))
        if isinstance(self.dp_shard, bool) or not isinstance(self.dp_shard, int) or (
                self.dp_shard != -1 and self.dp_shard < 1):
            raise ValueError(f"parallel.dp_shard={self.dp_shard!r} must be -1 or >= 1 "
                             "(torchtitan ParallelDims._validate)")
        if self.etp is not None:
            positive(_OWNER, "etp", self.etp)
        if self.ddp_bucket_params is not None:
            positive(_OWNER, "ddp_bucket_params", self.ddp_bucket_params)
        positive(_OWNER, "num_distributed_optimizer_instances",
                 self.num_distributed_optimizer_instances)
        if self.num_distributed_optimizer_instances > 1 and not (
                self.use_distributed_optimizer or self.fsdp):
            raise ValueError(f"parallel.num_distributed_optimizer_instances="
                             f"{self.num_distributed_optimizer_instances} requires "
                             "use_distributed_optimizer=True or fsdp=True (megatron-core: "
                             "'Partial DistOpt cannot be used without DistOpt'; Megatron-"
                             "FSDP shards within an instance: HSDP)")
        one_of(_OWNER, "schedule", self.schedule, SCHEDULES)
        one_of(_OWNER, "fsdp_impl", self.fsdp_impl, FSDP_IMPLS)
        one_of(_OWNER, "cp_comm_type", self.cp_comm_type, ("p2p", "a2a", "allgather"))
        one_of(_OWNER, "grad_buffer", self.grad_buffer, GRAD_BUFFERS)
        one_of(_OWNER, "moe_token_dispatcher_type", self.moe_token_dispatcher_type,
               MOE_DISPATCHERS)
        one_of(_OWNER, "moe_router_load_balancing_type",
               self.moe_router_load_balancing_type, MOE_BALANCING)
        one_of(_OWNER, "moe_flex_dispatcher_backend", self.moe_flex_dispatcher_backend,
               ("deepep", "hybridep"))
        if self.moe_flex_num_sms is not None:
            positive(_OWNER, "moe_flex_num_sms", self.moe_flex_num_sms)
        for t in self.moe_router_terms:
            one_of(_OWNER, "moe_router_terms[i]", t, ROUTER_TERMS)
        object.__setattr__(self, "moe_router_terms", tuple(
            t for t in ROUTER_TERMS if t in self.moe_router_terms))
        if "expert_bias" in self.moe_router_terms and \
                "sigmoid" not in self.moe_router_terms:
            # transformer_config.py: "Expert bias for aux-loss-free routing only
            # supports sigmoid score function."
            raise ValueError("parallel.moe_router_terms has expert_bias without sigmoid "
                             "(megatron-core: expert bias needs the sigmoid score "
                             "function)")
        if "aux_loss" in self.moe_router_terms and \
                self.moe_router_load_balancing_type in ("sinkhorn", "none"):
            raise ValueError(f"parallel.moe_router_terms has aux_loss with "
                             f"moe_router_load_balancing_type="
                             f"{self.moe_router_load_balancing_type!r} (megatron-core: "
                             "Sinkhorn routing does not support aux loss)")
        if self.overlap_moe_expert_parallel_comm:
            # megatron/training/arguments.py (0.14): alltoall or flex dispatcher, VPP with
            # PP, and not together with the shared-expert overlap.
            if self.moe_token_dispatcher_type == "allgather":
                raise ValueError("parallel.overlap_moe_expert_parallel_comm=True requires "
                                 "moe_token_dispatcher_type 'alltoall' or 'flex' "
                                 "(it is 'allgather')")
            if self.pp > 1 and self.vpp == 1:
                raise ValueError(f"parallel.overlap_moe_expert_parallel_comm=True with "
                                 f"pp={self.pp} requires vpp > 1 (interleaved schedule)")
            if self.moe_shared_expert_overlap:
                raise ValueError("parallel.overlap_moe_expert_parallel_comm=True excludes "
                                 "moe_shared_expert_overlap=True")
        axes = self.order.split("-")
        if sorted(axes) != sorted(AXES):
            raise ValueError(
                f"parallel.order={self.order!r} must be a permutation of "
                f"{'-'.join(AXES)} joined by '-'")
        if self.sequence_parallel and self.tp == 1:
            raise ValueError("parallel.sequence_parallel=True requires tp > 1 (tp=1)")
        if self.vpp > 1 and self.pp == 1:
            raise ValueError(f"parallel.vpp={self.vpp} requires pp > 1 (pp=1)")
        if self.schedule == "interleaved" and self.vpp == 1:
            raise ValueError("parallel.schedule='interleaved' requires vpp > 1 (vpp=1)")
        if self.schedule == "1f1b" and self.vpp > 1:
            raise ValueError(f"parallel.schedule='1f1b' requires vpp=1 (vpp={self.vpp})")
        if not self.fsdp_reshard_after_forward and not self.fsdp:
            raise ValueError("parallel.fsdp_reshard_after_forward=False requires "
                             "fsdp=True (it says when FSDP frees gathered parameters)")
        if self.fsdp and self.use_distributed_optimizer:
            # FSDP shards parameters, gradients and optimizer state itself.
            object.__setattr__(self, "use_distributed_optimizer", False)
        if self.grad_buffer == "on_backward" and not self.use_distributed_optimizer:
            # The deferred gradient sync ends in a reduce-scatter into sharded gradients
            # (the distributed optimizer's layout); FSDP's own gradients are modelled
            # per layer already (memory/states.py).
            raise ValueError("parallel.grad_buffer='on_backward' requires "
                             "use_distributed_optimizer=True and fsdp=False")
        for f in ("decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers"):
            v = getattr(self, f)
            if v is not None:
                non_negative(_OWNER, f, v)
                if self.pp == 1:
                    raise ValueError(f"parallel.{f}={v} requires pp > 1 (pp=1)")
        if self.pipeline_layout is not None:
            layout = tuple(self.pipeline_layout)
            object.__setattr__(self, "pipeline_layout", layout)
            if len(layout) != self.pp * self.vpp:
                raise ValueError(
                    f"parallel.pipeline_layout has {len(layout)} entries; it must have "
                    f"pp*vpp={self.pp * self.vpp} (layers per virtual stage)")
            for v in layout:
                non_negative(_OWNER, "pipeline_layout[i]", v)

    @property
    def expert_tp(self) -> int:
        return self.tp if self.etp is None else self.etp

    @property
    def resolved_schedule(self) -> str:
        if self.schedule in SCHEDULE_SIM:
            return SCHEDULE_SIM[self.schedule]
        if self.schedule != "auto":
            return self.schedule
        return "interleaved" if self.vpp > 1 else "1f1b"

    @property
    def model_parallel_size(self) -> int:
        return self.tp * self.pp * self.cp
