"""The Megatron-LM ``pretrain_gpt.py`` flags primus-ext reads and writes: one table.

Each ``Flag`` names the spec field(s) it decides, how argparse reads it and Megatron-LM's
default when the flag is absent (megatron/training/arguments.py and the dataclass
arguments of megatron/core/transformer/transformer_config.py, Megatron-LM main,
d98e8a64). ``args.py`` parses a launch line with this table, ``flags.py`` writes one
from a RunSpec with it, and a flag the spec leaves at Megatron-LM's default is not
written. ``NO_EFFECT`` lists the flags accepted with no effect on step time or memory,
each with the reason; any other flag is reported as "not modelled, may change step time".
"""
from __future__ import annotations

from dataclasses import dataclass

# ModelSpec.position_embedding_type values Megatron-LM can be told (mrope / yarn are
# RoPE variants with the same cost).
POSITION_TYPES = ("learned_absolute", "rope", "alibi", "none", "mrope", "yarn", "relative")
ATTENTION_BACKENDS = ("flash", "fused", "unfused", "local", "auto")  # core AttnBackend
FP8_FORMATS = ("e4m3", "hybrid")  # TransformerConfig.fp8
FP8_RECIPES = ("tensorwise", "delayed", "mxfp8", "blockwise", "custom")
CP_COMM_TYPES = ("p2p", "a2a", "allgather", "all_gather", "a2a+p2p")
RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe",
                     "shared_experts")
OPT_DTYPES = ("fp32", "fp16", "bf16", "fp8")


@dataclass(frozen=True, kw_only=True, slots=True)
class Flag:
    name: str
    fields: tuple[str, ...]  # spec fields it decides ("" entries: launcher settings)
    default: object = None  # Megatron-LM's value when the flag is absent
    type: type | None = None  # None: a switch (store_true)
    choices: tuple | None = None
    nargs: str | None = None
    required: bool = False
    dest: str | None = None
    store_false: bool = False  # a --no-X switch that turns a default-on setting off
    help: str | None = None  # --help's text (primus-ext's own flags)


def _f(name, fields, default=None, type=None, **kw) -> Flag:
    if isinstance(fields, str):
        fields = (fields,) if fields else ()
    return Flag(name=name, fields=tuple(fields), default=default, type=type, **kw)


MODEL = (
    _f("--num-layers", "model.num_layers", type=int, required=True),
    _f("--hidden-size", "model.hidden_size", type=int, required=True),
    _f("--num-attention-heads", "model.num_attention_heads", type=int, required=True),
    _f("--ffn-hidden-size", "model.ffn_hidden_size", type=int),  # None: 4 x hidden
    _f("--group-query-attention", "model.num_query_groups", False),
    _f("--num-query-groups", "model.num_query_groups", 1, int),
    _f("--kv-channels", "model.kv_channels", type=int),
    _f("--swiglu", "model.activation", False),
    _f("--squared-relu", "model.activation", False),
    _f("--quick-geglu", "model.activation", False),
    _f("--normalization", "model.normalization", "LayerNorm", str,
       choices=("LayerNorm", "RMSNorm")),
    _f("--untie-embeddings-and-output-weights",
       "model.untie_embeddings_and_output_weights", False),
    _f("--position-embedding-type", "model.position_embedding_type", "learned_absolute",
       str, choices=POSITION_TYPES),
    _f("--use-rotary-position-embeddings", "model.position_embedding_type", False),
    _f("--rotary-percent", "model.rotary_percent", 1.0, float),
    _f("--activation-func-clamp-value", "model.activation_func_clamp_value", type=float),
    _f("--no-position-embedding", "model.position_embedding_type", True,
       store_false=True, dest="add_position_embedding"),
    _f("--disable-bias-linear", "model.add_bias_linear", False),
    _f("--add-qkv-bias", "model.add_qkv_bias", False),
    _f("--qk-layernorm", "model.qk_layernorm", False),
    _f("--hidden-dropout", "model.hidden_dropout", 0.1, float),
    _f("--attention-dropout", "model.attention_dropout", 0.1, float),
    _f("--max-position-embeddings", "model.max_position_embeddings", type=int),
    _f("--make-vocab-size-divisible-by", "model.make_vocab_size_divisible_by", 128, int),
    _f("--vocab-size", "model.vocab_size", type=int),
    _f("--padded-vocab-size", ("model.vocab_size", "model.make_vocab_size_divisible_by"),
       type=int),
    # Pai-Megatron-Patch's tokenizer flags (vocab.py _pai_vocab).
    _f("--patch-tokenizer-type", "model.vocab_size", type=str),
    _f("--extra-vocab-size", "model.vocab_size", 0, int),
    _f("--tokenizer-type", "model.vocab_size", type=str),
    _f("--tokenizer-model", "model.vocab_size", type=str),
    _f("--vocab-file", "model.vocab_size", type=str),
    _f("--window-size", "model.window_size", type=str),
    _f("--window-attn-skip-freq", "model.window_full_attention_every", type=int),
    _f("--mtp-num-layers", "model.mtp_num_layers", type=int),
)
MOE = (
    _f("--num-experts", "model.num_moe_experts", type=int),
    _f("--moe-router-topk", "model.moe_router_topk", 2, int),
    _f("--moe-ffn-hidden-size", "model.moe_ffn_hidden_size", type=int),
    _f("--moe-shared-expert-intermediate-size",
       "model.moe_shared_expert_intermediate_size", type=int),
    _f("--moe-layer-freq", ("model.moe_layer_freq", "model.moe_first_k_dense"), "1", str),
    _f("--moe-router-num-groups", "model.moe_router_num_groups", type=int),
    _f("--moe-router-group-topk", "model.moe_router_group_topk", type=int),
    _f("--moe-expert-capacity-factor", "model.moe_expert_capacity_factor", type=float),
    _f("--moe-pad-expert-input-to-capacity", "model.moe_pad_expert_input_to_capacity",
       False),
    _f("--moe-token-dispatcher-type", "parallel.moe_token_dispatcher_type", "allgather",
       str, choices=("allgather", "alltoall", "flex")),
    _f("--moe-router-dtype", "train.moe_router_dtype", type=str, choices=("fp32", "fp64")),
    _f("--moe-router-force-load-balancing", "train.moe_router_force_load_balancing", False),
    _f("--overlap-moe-expert-parallel-comm", "parallel.overlap_moe_expert_parallel_comm",
       False),
    # megatron-core requires it with the EP A2A overlap (transformer_config.py: "overlap_
    # moe_expert_parallel_comm must be enabled when enabling delay_wgrad_compute"); the
    # overlap window of comm/moe_comm.py already counts the weight gradients, and the
    # schedule nodes that issue them later are on the host clock (compute/host_moe.py).
    _f("--delay-wgrad-compute", "parallel.overlap_moe_expert_parallel_comm", False),
    _f("--moe-shared-expert-overlap", "parallel.moe_shared_expert_overlap", False),
    _f("--moe-grouped-gemm", "parallel.moe_grouped_gemm", False),
    _f("--moe-use-legacy-grouped-gemm", "parallel.moe_grouped_gemm", False),
    _f("--moe-permute-fusion", "parallel.moe_permute_fusion", False),
    _f("--moe-router-fusion", "parallel.moe_router_fusion", False),
    _f("--moe-router-load-balancing-type", "parallel.moe_router_load_balancing_type",
       ["aux_loss"], str, nargs="+",
       choices=("aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "none")),
    _f("--moe-flex-dispatcher-backend", "parallel.moe_flex_dispatcher_backend", "deepep",
       str, choices=("deepep", "hybridep")),
    # SMs of the flex dispatcher's kernels (impl_flags.num_sms_flags: the chosen backend's
    # flag, or main's unified one; megatron-core defaults 20 / 16 when absent).
    _f("--moe-deepep-num-sms", "parallel.moe_flex_num_sms", type=int),
    _f("--moe-hybridep-num-sms", "parallel.moe_flex_num_sms", type=int),
    _f("--moe-flex-dispatcher-num-sms", "parallel.moe_flex_num_sms", type=int),
    # The router's optional terms (parallel.moe_router_terms; args.py router_terms).
    _f("--moe-aux-loss-coeff", "parallel.moe_router_terms", ["0.0"], str, nargs="+"),
    _f("--moe-z-loss-coeff", "parallel.moe_router_terms", type=float),
    _f("--moe-input-jitter-eps", "parallel.moe_router_terms", type=float),
    _f("--moe-router-enable-expert-bias", "parallel.moe_router_terms", False),
    _f("--moe-router-bias-update-rate", "parallel.moe_router_terms", 1e-3, float),
    _f("--moe-router-score-function", "parallel.moe_router_terms", "softmax", str,
       choices=("softmax", "sigmoid")),
    _f("--moe-router-topk-scaling-factor", "parallel.moe_router_terms", type=float),
    _f("--moe-router-padding-for-fp8", "parallel.moe_router_terms", False),
    _f("--moe-router-padding-for-quantization", "parallel.moe_router_terms", False),
    _f("--moe-per-layer-logging", "parallel.moe_router_terms", False),
    # The order of softmax and top-k: the same kernels.
    _f("--moe-router-pre-softmax", "", False),
    # A scalar on the MTP loss: the same kernels.
    _f("--mtp-loss-scaling-factor", "", 0.1, float),
)
MLA = (
    _f("--multi-latent-attention", "model.multi_latent_attention", False),
    _f("--q-lora-rank", "model.q_lora_rank", type=int),
    _f("--kv-lora-rank", "model.kv_lora_rank", 32, int),  # core_v0.16.1 arguments.py:2727
    _f("--qk-head-dim", "model.qk_head_dim", 128, int),
    _f("--qk-pos-emb-head-dim", "model.qk_pos_emb_head_dim", 64, int),
    _f("--v-head-dim", "model.v_head_dim", 128, int),
)
PARALLEL = (
    _f("--tensor-model-parallel-size", "parallel.tp", 1, int),
    _f("--pipeline-model-parallel-size", "parallel.pp", 1, int),
    _f("--num-layers-per-virtual-pipeline-stage", "parallel.vpp", type=int),
    _f("--num-virtual-stages-per-pipeline-rank", "parallel.vpp", type=int),
    _f("--virtual-pipeline-model-parallel-size", "parallel.vpp", type=int),  # older name
    _f("--pipeline-model-parallel-layout", ("parallel.pipeline_layout", "parallel.vpp"),
       type=str),
    _f("--decoder-first-pipeline-num-layers", "parallel.decoder_first_pipeline_num_layers",
       type=int),
    _f("--decoder-last-pipeline-num-layers", "parallel.decoder_last_pipeline_num_layers",
       type=int),
    _f("--account-for-embedding-in-pipeline-split",
       "parallel.account_for_embedding_in_pipeline_split", False),
    _f("--account-for-loss-in-pipeline-split",
       "parallel.account_for_loss_in_pipeline_split", False),
    _f("--microbatch-group-size-per-virtual-pipeline-stage", "", type=int),
    _f("--context-parallel-size", "parallel.cp", 1, int),
    _f("--cp-comm-type", "parallel.cp_comm_type", ["p2p"], str, nargs="+",
       choices=CP_COMM_TYPES),
    _f("--expert-model-parallel-size", "parallel.ep", 1, int),
    _f("--expert-tensor-parallel-size", "parallel.etp", type=int),
    _f("--sequence-parallel", "parallel.sequence_parallel", False),
    _f("--use-distributed-optimizer", "parallel.use_distributed_optimizer", False),
    _f("--use-torch-fsdp2", "parallel.fsdp", False),
    # core_v0.16.1 training.py: reshard_after_forward of TorchFullyShardedDataParallelConfig
    # (read under --use-torch-fsdp2 only): ZeRO-2.
    _f("--torch-fsdp2-no-reshard-after-forward", "parallel.fsdp_reshard_after_forward",
       False),
    _f("--use-megatron-fsdp", "parallel.fsdp", False),
    _f("--data-parallel-sharding-strategy", "parallel.fsdp", "no_shard", str,
       choices=("no_shard", "optim", "optim_grads", "optim_grads_params")),
    _f("--num-distributed-optimizer-instances",
       "parallel.num_distributed_optimizer_instances", 1, int),
    _f("--overlap-grad-reduce", "parallel.overlap_grad_reduce", False),
    _f("--overlap-param-gather", "parallel.overlap_param_gather", False),
    # Default on in Megatron-LM core_v0.16.1; arguments.py turns it off without virtual
    # stages (project/dp_sync.py times the aligned gather).
    _f("--no-align-grad-reduce", "parallel.align_grad_reduce", True, store_false=True,
       dest="align_grad_reduce"),
    _f("--no-align-param-gather", "parallel.align_param_gather", True, store_false=True,
       dest="align_param_gather"),
    _f("--tp-comm-overlap", "parallel.tp_comm_overlap", False),
    _f("--grad-reduce-in-bf16", "parallel.grad_reduce_in_fp32", False),
    _f("--accumulate-allreduce-grads-in-fp32", "parallel.grad_reduce_in_fp32", False),
    _f("--megatron-fsdp-grad-comm-dtype", "parallel.grad_reduce_in_fp32", "auto", str,
       choices=("fp32", "fp16", "bf16", "auto")),
    _f("--megatron-fsdp-main-grads-dtype", "train.main_grads_dtype", "auto", str,
       choices=("fp32", "bf16", "fp16", "auto")),
)
TRAIN = (
    _f("--micro-batch-size", "train.micro_batch_size", 1, int),
    _f("--global-batch-size", "train.global_batch_size", type=int),
    # Batch schedules: the steady (final) batch is projected, the ramp named in a note
    # (line_flags.global_batch).
    _f("--step-batch-size-schedule", "train.global_batch_size", type=str, nargs="+"),
    _f("--rampup-batch-size", "train.global_batch_size", type=int, nargs=3),
    _f("--seq-length", "train.seq_length", type=int, required=True),
    _f("--bf16", "train.precision", False),
    _f("--fp16", "train.precision", False),
    _f("--fp8-format", "train.precision", type=str, choices=FP8_FORMATS),
    _f("--fp8-recipe", "train.fp8_recipe", "delayed", str, choices=FP8_RECIPES),
    _f("--fp8-param-gather", "train.fp8_param_gather", False),
    # Megatron-LM's default is transformer_engine; absent, train.te stays None (TE on GPU
    # presets, megatron-core's local spec on `cpu`: spec.run.uses_te).
    _f("--transformer-impl", "train.te", None, str,
       choices=("local", "transformer_engine", "inference_optimized")),
    _f("--recompute-granularity", "train.recompute_granularity", type=str,
       choices=("full", "selective")),
    _f("--recompute-activations", "train.recompute_granularity", False),
    _f("--recompute-method", "train.recompute_method", type=str,
       choices=("uniform", "block")),
    _f("--recompute-num-layers", "train.recompute_num_layers", type=int),
    _f("--recompute-modules", "train.recompute_modules", None, str, nargs="+",
       choices=RECOMPUTE_MODULES),
    _f("--attention-backend", "train.attention_backend", "auto", str,
       choices=ATTENTION_BACKENDS),
    _f("--use-flash-attn", "train.attention_backend", False),
    _f("--no-attention-softmax-in-fp32", "train.attention_softmax_in_fp32", False),
    # On by default in Megatron-LM; absent, train.masked_softmax_fusion stays None (on for
    # GPU presets: memory/report.py resolved_train).
    _f("--no-masked-softmax-fusion", "train.masked_softmax_fusion", False),
    _f("--no-gradient-accumulation-fusion", "train.gradient_accumulation_fusion", False),
    _f("--no-rope-fusion", "train.apply_rope_fusion", True, store_false=True,
       dest="apply_rope_fusion"),
    _f("--defer-embedding-wgrad-compute", "train.defer_embedding_wgrad_compute", False),
    _f("--wgrad-deferral-limit", "train.wgrad_deferral_limit", 0, int),
    _f("--attention-softmax-in-fp32", "train.attention_softmax_in_fp32", False),
    _f("--cross-entropy-loss-fusion", "train.cross_entropy_loss_fusion", False),
    _f("--cross-entropy-fusion-impl", "train.cross_entropy_fusion_impl", "native", str,
       choices=("native", "te")),
    _f("--optimizer", "train.optimizer", "adam", str,
       choices=("adam", "sgd", "muon", "dist_muon")),
    # Megatron-LM main: muon with --use-distributed-optimizer (line_flags.check_optimizer).
    _f("--no-use-layer-wise-param-layout", "train.optimizer", True, store_false=True,
       dest="use_layer_wise_param_layout"),
    _f("--use-precision-aware-optimizer", "train.use_precision_aware_optimizer", False),
    _f("--main-grads-dtype", "train.main_grads_dtype", "fp32", str, choices=("fp32", "bf16")),
    _f("--main-params-dtype", "", "fp32", str, choices=("fp32", "fp16")),
    _f("--exp-avg-dtype", "train.exp_avg_dtype", "fp32", str, choices=OPT_DTYPES),
    _f("--exp-avg-sq-dtype", "train.exp_avg_sq_dtype", "fp32", str, choices=OPT_DTYPES),
    _f("--fine-grained-activation-offloading", "train.offload_modules", False),
    _f("--offload-modules", "train.offload_modules", None, str, nargs="*"),
    _f("--cpu-offloading", "train.cpu_offloading_num_layers", False),
    _f("--cpu-offloading-num-layers", "train.cpu_offloading_num_layers", 0, int),
    _f("--train-iters", "", type=int),
    _f("--deterministic-mode", "train.deterministic_mode", False),
    _f("--log-params-norm", "train.log_params_norm", False),
    _f("--log-num-zeros-in-grad", "train.log_num_zeros_in_grad", False),
    _f("--check-weight-hash-across-dp-replicas-interval",
       "train.check_weight_hash_interval", None, int),
    # CUDA graphs (Megatron-LM main): --cuda-graph-impl none|local|transformer_engine
    # with --cuda-graph-scope (or its older name --cuda-graph-modules), the legacy
    # --enable-cuda-graph (local, whole layers) and --external-cuda-graph
    # (transformer_engine); all read into train.cuda_graph_scope (cuda_graphs.py).
    _f("--cuda-graph-impl", "train.cuda_graph_scope", "none", str,
       choices=("none", "local", "transformer_engine", "full_iteration")),
    _f("--cuda-graph-scope", "train.cuda_graph_scope", None, str, nargs="*"),
    _f("--cuda-graph-modules", "train.cuda_graph_scope", None, str, nargs="*"),
    _f("--enable-cuda-graph", "train.cuda_graph_scope", False),
    _f("--external-cuda-graph", "train.cuda_graph_scope", False),
    _f("--cuda-graph-warmup-steps", "", 3, int),
)
# primus-ext's own flags (the launcher and its outputs; not Megatron-LM flags).
PRIMUS = (
    _f("--project-only", "", help="project step time, tokens/s/GPU, MFU and memory of this "
       "launch line at the --target-* scale instead of training"),
    _f("--projection-backend", "", "hybrid", str, choices=("hybrid", "simulate"),
       help="hybrid (default): the launched ranks run a downscaled megatron-core "
       "measurement planned to fit this device, rank 0 restores the target analytically; "
       "simulate: analytic only, one process, no torch, about a second"),
    _f("--target-nodes", "", type=int, help="nodes of the target cluster (else $NNODES, "
       "else 1)"),
    _f("--target-gpus-per-node", "", type=int, help="GPUs per target node (else "
       "$GPUS_PER_NODE, else the hardware preset's)"),
    _f("--target-hardware", "", type=str, help="the target GPU preset (h100, h200, b200, "
       "gb200, mi300x, ..., or cpu); measured times stand in for it only when the "
       "measuring device is the same hardware"),
    _f("--profile-out", "", type=str, help="hybrid: write the measured profile here (else "
       "primus_ext_profile.json in $PRIMUS_EXT_HOME/runs/<id>/)"),
    _f("--projection-out", "", type=str, help="write the Estimate JSON (with the composed "
       "config and what was measured / modelled) here"),
    _f("--recipe-out", "", type=str, help="write Hydra overrides and megatron_args.sh into "
       "this directory"),
    _f("--timings-out", "", type=str, help="training mode: write per-iteration timings as "
       "JSON here"),
    _f("--log-layer-times", "", help="training mode: log the measurement's per-layer hook "
       "times on each rank"),
    _f("--model-name", "", type=str, help="a name for the model in reports"),
    _f("--measure-warmup", "", 2, int, help="hybrid, same hardware: untimed warm-up steps "
       "(default 2)"),
    _f("--measure-repeats", "", 3, int, help="hybrid, same hardware: timed steps, median "
       "per layer kind (default 3)"),
    _f("--measure-microbatches", "", 2, int, help="hybrid: microbatches per measured step "
       "(default 2; the plan may take 1)"),
    _f("--measure-layers-per-kind", "", 2, int, dest="measure_layers_per_kind",
       help="hybrid: decoder layers of each kind measured (default 2; the plan may take "
       "1)"),
    _f("--measure-memory-gib", "", None, float, help="hybrid: memory the measurement may "
       "use (CPU: all local processes together, default half of MemAvailable, at most "
       "6 GiB; GPU: per device, default 90%% of its free memory). The plan shrinks "
       "microbatches, optimizer, layers, vocabulary, then sequence until it fits"),
    _f("--measure-max-seconds", "", None, float, help="hybrid: estimated compute the "
       "measurement may take (default 150 s on a CPU, 300 s on a GPU)"),
)
FLAGS: tuple[Flag, ...] = MODEL + MOE + MLA + PARALLEL + TRAIN + PRIMUS
BY_NAME = {f.name: f for f in FLAGS}
