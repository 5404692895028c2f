"""TrainSpec: batch, sequence, precision, recompute and optimizer of a training run."""
from __future__ import annotations

from dataclasses import dataclass

from primus_ext.spec._check import check_types, one_of, positive
from primus_ext.spec.torchtitan import ACTIVATION_CHECKPOINTS

_OWNER = "train"
PRECISIONS = ("bf16", "fp8", "fp16", "fp32")
RECOMPUTE_GRANULARITIES = (None, "selective", "full")
RECOMPUTE_METHODS = (None, "uniform", "block")
ATTENTION_BACKENDS = ("flash", "unfused")
# muon / dist_muon: Megatron-LM core_v0.16.1's Muon (memory/muon.py).
OPTIMIZERS = ("adam", "sgd", "muon", "dist_muon")
# Who holds Adam's state (memory/apex_adam.py): megatron-core's optimizer, or NeMo 1's
# ``optim.name: distributed_fused_adam`` (Apex DistributedFusedAdam).
APEX_DFA = "apex_distributed_fused_adam"
OPTIMIZER_IMPLS = ("megatron", APEX_DFA)
FP8_RECIPES = ("delayed", "tensorwise", "blockwise", "mxfp8")
FLASH_IMPLS = ("native", "fa2", "fa1")
CROSS_ENTROPY_IMPLS = ("native", "te")
LOSS_IMPLS = ("megatron", "torch")
OFFLOAD_MODULES = ("attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm",
                   "expert_fc1", "moe_act", "fused_group_mlp")
MAIN_GRADS_DTYPES = ("fp32", "bf16")
CUDA_GRAPH_SCOPES = ("attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba",
                     "layer", "full_iteration")
EXP_AVG_DTYPES = ("fp32", "fp16", "bf16", "fp8")


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainSpec:
    seq_length: int = 4096
    micro_batch_size: int = 1
    global_batch_size: int = 1024
    precision: str = "bf16"
    fp8_recipe: str = "tensorwise"
    recompute_granularity: str | None = None
    recompute_method: str | None = None
    recompute_num_layers: int | None = None
    # Selective recompute modules (megatron-core --recompute-modules); core_attn is the
    # default, as in Megatron-LM.
    recompute_modules: tuple[str, ...] = ("core_attn",)
    # Full recompute by torch.utils.checkpoint's non-reentrant implementation (PyTorch
    # checkpoint_wrapper with CheckpointImpl.NO_REENTRANT; early stop on by default since
    # torch 2.1, set_checkpoint_early_stop): the recompute raises _StopRecomputationError
    # once the last tensor the block saved is packed again, so the ops after that point
    # are not re-run -- in a dense block the MLP's second GEMM (its inputs are packed
    # before it runs) and the residual add after it. False: megatron-core's
    # CheckpointFunction, which re-runs the whole layer.
    recompute_early_stop: bool = False
    attention_backend: str = "flash"
    # Which flash-attention kernel generation runs under attention_backend='flash':
    # 'native' = the hardware's tuned fused kernel (cuDNN / FlashAttention-3 on Hopper,
    # cuDNN / FA4 on Blackwell, CK / AITER on AMD: what Transformer Engine selects);
    # 'fa2' = FlashAttention-2 (Dao's flash-attn 2.x, PyTorch SDPA's flash backend), which
    # uses no Hopper/Blackwell-specific tensor-core instructions (wgmma, TMA, tcgen05);
    # 'fa1' = FlashAttention-1 class (flash-attn 1.x, llm-foundry's Triton flash attention).
    flash_attn_impl: str = "native"
    # --cross-entropy-loss-fusion: the vocab-parallel cross-entropy as one fused kernel
    # (megatron-core fused_vocab_parallel_cross_entropy / TE parallel_cross_entropy);
    # off by default in megatron-core, on in the NeMo 2.0 / Megatron-Bridge GPT configs.
    cross_entropy_loss_fusion: bool = False
    # --cross-entropy-fusion-impl: which fused kernel (megatron-core LanguageModule.
    # compute_language_model_loss): 'native' (fused_vocab_parallel_cross_entropy, fp32
    # exp-logits saved) or 'te' (Transformer Engine parallel_cross_entropy: the logits
    # saved in their own dtype, the gradient written into them in place).
    cross_entropy_fusion_impl: str = "native"
    # Which loss computes the cross-entropy: 'megatron' (megatron-core's vocab-parallel
    # cross-entropy, unfused in fp32 unless cross_entropy_loss_fusion) or 'torch'
    # (torch.nn.functional.cross_entropy on the logits in their own dtype, no fp32
    # upcast: NeMo AutoModel's MaskedCrossEntropy(fp32_upcast=False)). Megatron-LM has no
    # flag for 'torch'.
    loss_impl: str = "megatron"
    # Sequence chunks the output layer and loss run in, one after the other: None = the
    # framework's own: 1 in megatron-core; torchtitan 0.3.0's ChunkedLossWrapper
    # (torchtitan/components/loss.py, Config.num_chunks = 8) runs lm_head + cross-entropy
    # per chunk, so its vocab-parallel loss issues its small all-reduces once per chunk
    # and holds one chunk's logits at a time (project/torchtitan.py, memory/torchtitan.py);
    # 1 under torchtitan = the whole sequence's logits at once (torchtitan before the
    # chunked loss, e.g. the Dec. 2024 benchmarks).
    loss_chunks: int | None = None
    # Microbatches of one pipeline schedule run (warm-up, steady state, cool-down): None =
    # every microbatch of the step in one schedule (megatron-core's
    # forward_backward_func); torch.distributed.pipelining runs ``schedule.step`` once per
    # gradient-accumulation step (NeMo AutoModel recipes/llm/benchmark.py and
    # train_ft.py), so a step of m microbatches drains the pipeline m / this times.
    microbatches_per_schedule: int | None = None
    # Elementwise kernels fused (True: Megatron / Transformer Engine's fused RMSNorm, RoPE,
    # SwiGLU and bias-dropout-add, or torch.compile). False: eager PyTorch, where RMSNorm,
    # complex-valued RoPE and SwiGLU run as chains of single-op kernels with fp32
    # intermediates (compute/ops.py counts their bytes).
    fused_elementwise: bool = True
    # Megatron's RoPE as Transformer Engine's fused kernel (megatron-core
    # apply_rope_fusion). False (--no-rope-fusion; Megatron-LM validate_args also turns it
    # off for any --position-embedding-type but rope, e.g. yarn): rope_utils.
    # _apply_rotary_pos_emb_bshd's chain of single-op kernels (compute/layer_ops.py _rope).
    apply_rope_fusion: bool = True
    optimizer: str = "adam"
    # Softmax of the unfused attention path saved in fp32 (megatron-core default True);
    # only matters for attention_backend=unfused.
    attention_softmax_in_fp32: bool = True
    # The layer stack: True = Transformer Engine modules (what GPU runs use), False =
    # megatron-core's local spec (what runs on a CPU); None = TE on GPU hardware presets,
    # local on `cpu` (``uses_te``).
    te: bool | None = None
    # --fp8-param-gather: parameters kept (and all-gathered) in FP8.
    fp8_param_gather: bool = False
    # --use-precision-aware-optimizer with --main-grads-dtype / --exp-avg-dtype /
    # --exp-avg-sq-dtype: the optimizer's main gradients and Adam moments in lower
    # precision (megatron-core optimizer/optimizer_config.py).
    use_precision_aware_optimizer: bool = False
    main_grads_dtype: str = "fp32"
    exp_avg_dtype: str = "fp32"
    exp_avg_sq_dtype: str = "fp32"
    # False: no fp32 master copy; the optimizer steps the parameters in their own dtype
    # and keeps its moments in it (torch.optim.Adam on a model built in bf16: NeMo
    # AutoModel's from_config casts to torch_dtype 'auto' = bfloat16). Megatron-LM has
    # no such mode (its --bf16 always keeps fp32 main parameters).
    master_weights: bool = True
    # 'megatron': megatron-core's DistributedOptimizer / Float16OptimizerWithFloat16Params.
    # 'apex_distributed_fused_adam': NeMo 1's ``optim.name: distributed_fused_adam`` (NeMo's
    # MegatronDistributedFusedAdam over Apex's DistributedFusedAdam, ZeRO-1 over the
    # data-parallel group), whose single state dtype (``optim.dtype``, default fp32) is
    # exp_avg_dtype = exp_avg_sq_dtype; NeMo derives the master copy from it
    # (memory/apex_adam.py). Megatron-LM has no flag for it.
    optimizer_impl: str = "megatron"
    # --fine-grained-activation-offloading --offload-modules: the modules whose saved
    # inputs go to host memory after the forward (megatron-core TransformerConfig
    # offload_modules); empty = no offloading.
    offload_modules: tuple[str, ...] = ()
    # --cpu-offloading --cpu-offloading-num-layers N (megatron-core TransformerConfig
    # cpu_offloading, activations only): the saved activations of the first N decoder
    # layers go to host memory (Transformer Engine's cpu_offload); 0 = off.
    cpu_offloading_num_layers: int = 0
    # torchtitan only (framework=torchtitan): the activation-checkpoint policy
    # (torchtitan ActivationCheckpointingConfig subcommand none|selective|full) and
    # per-block torch.compile (--compile.enable).
    activation_checkpoint: str = "none"
    compile: bool = False
    # --moe-router-dtype fp32: the router's gating GEMM in fp32 (megatron-core
    # TransformerConfig.moe_router_dtype); None: the model's dtype.
    moe_router_dtype: str | None = None
    # --moe-router-force-load-balancing: tokens routed uniformly to the experts (benchmark
    # runs), so no expert-parallel rank waits on a busier one.
    moe_router_force_load_balancing: bool = False
    # --fp8-dot-product-attention (TransformerConfig.fp8_dot_product_attention): the fused
    # attention's two batched GEMMs in FP8 (cuDNN FP8 flash attention); FP8 runs only.
    fp8_dot_product_attention: bool = False
    # Every expert receives exactly ``tokens * topk / experts`` rows (NeMo AutoModel's
    # FakeBalancedGate with noise 0), not the random spread of forced balancing: token t
    # goes to experts t*k .. t*k+k-1 (mod E), consecutive ids, so it reaches the fewest
    # EP ranks and nodes a window of k experts covers (compute/routing.py).
    moe_router_exact_balance: bool = False
    # Hardware queues the GPU runtime gives the process per device (HIP's
    # GPU_MAX_HW_QUEUES, default 4: "if an application allocates more HIP streams than
    # this number, then HIP runtime reuses the same hardware queues for the new streams in
    # a round-robin manner"); streams that share a queue run in turn, so a grouped GEMM's
    # per-expert streams run at most this many at once (compute/layer_ops.py). None: the
    # runtime's default, no fewer queues than the grouped GEMM's streams.
    device_hw_queues: int | None = None
    # What the router routes (compute/routing.py): 'real' = text, through a learned
    # router whose per-expert loads are skewed within a micro-batch (the busiest EP rank
    # waits); 'mock' = uniformly random token ids (Megatron-LM --mock-data, NeMo /
    # Megatron-Bridge mock datasets), which a router spreads as evenly as forced balancing.
    moe_routing_data: str = "real"
    # Megatron-LM's training loop (project/host_step.py): --log-params-norm (an L2 norm
    # of every parameter, all-reduced and read back each iteration),
    # --log-num-zeros-in-grad (zeros counted in every gradient and read back), and CUDA
    # graphs: --cuda-graph-impl local|transformer_engine with --cuda-graph-scope /
    # --cuda-graph-modules (what one graph launch replays: 'attn', 'mlp', 'moe',
    # 'moe_router', 'moe_preprocess', 'layer' = whole layers, 'full_iteration' = the
    # forward and backward of the step); () = no graphs.
    # --deterministic-mode: torch.use_deterministic_algorithms(True) (every new
    # allocation filled), deterministic NCCL and TE algorithms.
    deterministic_mode: bool = False
    log_params_norm: bool = False
    log_num_zeros_in_grad: bool = False
    cuda_graph_scope: tuple[str, ...] = ()
    # TransformerConfig.gradient_accumulation_fusion (Megatron-LM
    # --no-gradient-accumulation-fusion turns it off; torch FSDP2 requires it off, and
    # the field is not read under parallel.fsdp): weight
    # gradients accumulate straight into the fp32 main_grad, and the autograd-visible
    # wgrad is a dummy that Transformer Engine caches once per weight shape
    # (transformer_engine/pytorch/module/base.py get_dummy_wgrad; memory/overhead.py).
    gradient_accumulation_fusion: bool = True
    # --defer-embedding-wgrad-compute with --wgrad-deferral-limit (megatron-core
    # ModelParallelConfig; 0 = every microbatch): the last stage keeps the output
    # layer's gradient output and input of up to that many microbatches and computes the
    # weight gradient in the pipeline flush (tensor_parallel/layers.py
    # LinearWithGradAccumulationAndAsyncCommunication.backward, schedules.py
    # finish_embedding_wgrad_compute).
    defer_embedding_wgrad_compute: bool = False
    wgrad_deferral_limit: int = 0
    # TransformerConfig.masked_softmax_fusion (Megatron-LM --no-masked-softmax-fusion
    # turns it off): the unfused attention's scale-mask-softmax as one CUDA kernel that
    # saves its output in the input dtype (megatron/core/fusions/fused_softmax.py,
    # TE attention/dot_product_attention/softmax.py). None: on GPU presets, off on `cpu`
    # (the kernels are CUDA only); resolved by memory/report.py like ``te``.
    masked_softmax_fusion: bool | None = None
    # Megatron-LM --check-weight-hash-across-dp-replicas-interval N: every N iterations
    # each rank copies every parameter to the host and hashes it there, then all-gathers
    # the hashes (project/weight_hash.py); None: never.
    check_weight_hash_interval: int | None = None

    def __post_init__(self) -> None:
        check_types(self, _OWNER)
        for f in ("seq_length", "micro_batch_size", "global_batch_size"):
            positive(_OWNER, f, getattr(self, f))
        if self.loss_chunks is not None:
            positive(_OWNER, "loss_chunks", self.loss_chunks)
        if self.microbatches_per_schedule is not None:
            positive(_OWNER, "microbatches_per_schedule", self.microbatches_per_schedule)
        one_of(_OWNER, "precision", self.precision, PRECISIONS)
        one_of(_OWNER, "fp8_recipe", self.fp8_recipe, FP8_RECIPES)
        one_of(_OWNER, "recompute_granularity", self.recompute_granularity,
               RECOMPUTE_GRANULARITIES)
        one_of(_OWNER, "recompute_method", self.recompute_method, RECOMPUTE_METHODS)
        one_of(_OWNER, "attention_backend", self.attention_backend, ATTENTION_BACKENDS)
        one_of(_OWNER, "flash_attn_impl", self.flash_attn_impl, FLASH_IMPLS)
        one_of(_OWNER, "cross_entropy_fusion_impl", self.cross_entropy_fusion_impl,
               CROSS_ENTROPY_IMPLS)
        one_of(_OWNER, "loss_impl", self.loss_impl, LOSS_IMPLS)
        if self.loss_impl == "torch" and self.cross_entropy_loss_fusion:
            raise ValueError("train.loss_impl='torch' computes torch's own cross-entropy: "
                             "it takes no train.cross_entropy_loss_fusion (set it false)")
        one_of(_OWNER, "optimizer", self.optimizer, OPTIMIZERS)
        one_of(_OWNER, "activation_checkpoint", self.activation_checkpoint,
               ACTIVATION_CHECKPOINTS)
        one_of(_OWNER, "main_grads_dtype", self.main_grads_dtype, MAIN_GRADS_DTYPES)
        one_of(_OWNER, "exp_avg_dtype", self.exp_avg_dtype, EXP_AVG_DTYPES)
        one_of(_OWNER, "exp_avg_sq_dtype", self.exp_avg_sq_dtype, EXP_AVG_DTYPES)
        one_of(_OWNER, "moe_router_dtype", self.moe_router_dtype, (None, "fp32"))
        one_of(_OWNER, "moe_routing_data", self.moe_routing_data, ("real", "mock"))
        one_of(_OWNER, "optimizer_impl", self.optimizer_impl, OPTIMIZER_IMPLS)
        if self.optimizer_impl == APEX_DFA:
            self._check_apex_adam()
        elif not self.use_precision_aware_optimizer and (
                self.main_grads_dtype, self.exp_avg_dtype, self.exp_avg_sq_dtype) != (
                "fp32", "fp32", "fp32"):
            raise ValueError(
                "train.main_grads_dtype / exp_avg_dtype / exp_avg_sq_dtype other than fp32 "
                "need train.use_precision_aware_optimizer=true (as Megatron-LM requires "
                "--use-precision-aware-optimizer for them)")
        if not self.master_weights and (self.precision == "fp32"
                                        or self.use_precision_aware_optimizer):
            raise ValueError("train.master_weights=false needs a bf16 or fp16 "
                             "train.precision and train.use_precision_aware_optimizer="
                             "false (the parameters are the optimizer's own)")
        if self.defer_embedding_wgrad_compute and not self.gradient_accumulation_fusion:
            raise ValueError("train.defer_embedding_wgrad_compute=True needs "
                             "gradient_accumulation_fusion=True (megatron-core: 'Cannot "
                             "defer embedding wgrad compute when gradient accumulation "
                             "fusion is not used')")
        if self.check_weight_hash_interval is not None and (
                isinstance(self.check_weight_hash_interval, bool)
                or self.check_weight_hash_interval < 1):
            raise ValueError("train.check_weight_hash_interval="
                             f"{self.check_weight_hash_interval!r} must be an int >= 1 "
                             "(iterations between checks) or None")
        if self.device_hw_queues is not None and (
                isinstance(self.device_hw_queues, bool) or not isinstance(
                    self.device_hw_queues, int) or self.device_hw_queues < 1):
            raise ValueError(f"train.device_hw_queues={self.device_hw_queues!r} must be an "
                             "int >= 1 (hardware queues per device) or None")
        if isinstance(self.wgrad_deferral_limit, bool) or self.wgrad_deferral_limit < 0:
            raise ValueError(f"train.wgrad_deferral_limit={self.wgrad_deferral_limit!r} "
                             "must be an int >= 0 (0: every microbatch)")
        if self.fp8_param_gather and self.precision != "fp8":
            raise ValueError(f"train.fp8_param_gather=True needs train.precision='fp8' "
                             f"(it is {self.precision!r})")
        object.__setattr__(self, "recompute_modules", tuple(self.recompute_modules))
        object.__setattr__(self, "offload_modules", tuple(self.offload_modules))
        object.__setattr__(self, "cuda_graph_scope", tuple(self.cuda_graph_scope))
        for m in self.cuda_graph_scope:
            one_of(_OWNER, "cuda_graph_scope[i]", m, CUDA_GRAPH_SCOPES)
        for m in self.offload_modules:
            one_of(_OWNER, "offload_modules[i]", m, OFFLOAD_MODULES)
        if "attn_proj" in self.offload_modules and "core_attn" not in self.offload_modules:
            # megatron-core TransformerConfig.__post_init__: the projection's input is the
            # core attention's output, which core attention's backward needs.
            raise ValueError("train.offload_modules has attn_proj without core_attn "
                             "(megatron-core requires core_attn with attn_proj)")
        if isinstance(self.cpu_offloading_num_layers, bool) or \
                self.cpu_offloading_num_layers < 0:
            raise ValueError(f"train.cpu_offloading_num_layers="
                             f"{self.cpu_offloading_num_layers!r} must be an int >= 0")
        if self.cpu_offloading_num_layers and self.recompute_granularity is not None:
            # megatron-core TransformerConfig.__post_init__: "CPU offloading does not work
            # when activation recomputation is enabled".
            raise ValueError(f"train.cpu_offloading_num_layers="
                             f"{self.cpu_offloading_num_layers} needs recompute_granularity="
                             f"None (it is {self.recompute_granularity!r}; megatron-core "
                             "refuses CPU offloading with activation recompute)")
        if self.recompute_granularity == "full":
            if self.recompute_method is None:
                raise ValueError(
                    "train.recompute_method=None: recompute_granularity='full' needs "
                    "recompute_method 'uniform' or 'block'")
            if self.recompute_num_layers is None:
                raise ValueError(
                    "train.recompute_num_layers=None: recompute_granularity='full' needs "
                    "recompute_num_layers (layers per recompute unit or block)")
            positive(_OWNER, "recompute_num_layers", self.recompute_num_layers)
        elif self.recompute_method is not None:
            raise ValueError(
                f"train.recompute_method={self.recompute_method!r} requires "
                f"recompute_granularity='full' (it is {self.recompute_granularity!r})")

    def _check_apex_adam(self) -> None:
        if self.optimizer != "adam" or self.use_precision_aware_optimizer \
                or not self.master_weights or self.main_grads_dtype != "fp32":
            raise ValueError(
                f"train.optimizer_impl={APEX_DFA!r} is Adam with its own state dtype: it "
                "needs train.optimizer='adam', use_precision_aware_optimizer=false, "
                "master_weights=true and main_grads_dtype='fp32' (gradients take "
                "parallel.grad_reduce_in_fp32, Apex's grad_sync_dtype)")
        if self.exp_avg_dtype != self.exp_avg_sq_dtype or self.exp_avg_dtype == "fp8":
            raise ValueError(
                f"train.exp_avg_dtype={self.exp_avg_dtype!r} / exp_avg_sq_dtype="
                f"{self.exp_avg_sq_dtype!r}: with optimizer_impl={APEX_DFA!r} both are "
                "Apex's one state dtype (NeMo optim.dtype): equal, and fp32, bf16 or fp16")

    @property
    def param_bytes(self) -> int:
        """Bytes per model parameter as held for compute (FP8 keeps bf16 weights)."""
        return 4 if self.precision == "fp32" else 2
