"""RunSpec -> Megatron-LM flags and a torchrun line (``megatron_args.sh``).

Targets Megatron-LM's ``pretrain_gpt.py`` argument names (megatron-core 0.14 and
later), the other half of ``args.py``: ``parse_launch_args(megatron_argv(spec))`` gives
``spec`` back. The layout (parallel degrees, batch, sequence) is always written; any
other flag only where the spec differs from what Megatron-LM does without it (the
defaults of ``table.py``). The launch runs on mock data with the NullTokenizer, which
reports ``--vocab-size + 1`` tokens (the extra one is EOD), so the flag carries
``vocab_size - 1`` for the padded vocabulary to come out as the spec's.
"""
from __future__ import annotations

import shlex

from primus_ext.frameworks.megatron.layout_string import layout_string
from primus_ext.frameworks.megatron.table import BY_NAME
from primus_ext.spec import RunSpec
from primus_ext.spec.legal_megatron import (args_of_spec, recipe_max_position_embeddings,
                                            required_env)

FP8_FORMAT = "hybrid"  # e4m3 forward, e5m2 backward: Transformer Engine's usual recipe


class _Args(list):
    def value(self, flag: str, value) -> None:
        """``flag value`` unless ``value`` is Megatron-LM's default for ``flag``."""
        if value is not None and value != BY_NAME[flag].default:
            self += [flag, value]

    def switch(self, flag: str, on: bool) -> None:
        if on:
            self.append(flag)


def _moe_layer_freq(spec: RunSpec) -> str | None:
    m = spec.model
    if m.moe_first_k_dense == 0:
        return None if m.moe_layer_freq == 1 else str(m.moe_layer_freq)
    pattern = ",".join("1" if m.is_moe_layer(i) else "0" for i in range(m.num_layers))
    return f"[{pattern}]"


_ACTIVATION_FLAG = {"swiglu": "--swiglu", "quick_geglu": "--quick-geglu",
                    "squared_relu": "--squared-relu"}


def model_args(spec: RunSpec) -> list:
    m = spec.model
    a = _Args(["--num-layers", m.num_layers, "--hidden-size", m.hidden_size,
               "--num-attention-heads", m.num_attention_heads])
    # Megatron's default: 4 x hidden, but 2/3 of it (a multiple of 64) with --swiglu
    # (model_flags.ffn_hidden_size): a SwiGLU spec at 4 x hidden says so.
    ffn = m.ffn_hidden_size
    if ffn is None and m.activation == "swiglu":
        ffn = 4 * m.hidden_size
    a.value("--ffn-hidden-size", ffn)
    if m.num_query_groups is not None:
        a += ["--group-query-attention", "--num-query-groups", m.num_query_groups]
    a.value("--kv-channels", m.kv_channels)
    # Always written: Megatron-LM requires it (legal_megatron, arguments.py:799).
    a += ["--max-position-embeddings", recipe_max_position_embeddings(m, spec.train)]
    a.value("--position-embedding-type", m.position_embedding_type)
    a.value("--rotary-percent", m.rotary_percent)
    a.value("--activation-func-clamp-value", m.activation_func_clamp_value)
    a.value("--normalization", m.normalization)
    a.value("--make-vocab-size-divisible-by", m.make_vocab_size_divisible_by)
    a.value("--hidden-dropout", m.hidden_dropout)
    a.value("--attention-dropout", m.attention_dropout)
    if m.activation in _ACTIVATION_FLAG:
        a.append(_ACTIVATION_FLAG[m.activation])
    a.switch("--disable-bias-linear", not m.add_bias_linear)
    a.switch("--add-qkv-bias", m.add_qkv_bias)
    a.switch("--qk-layernorm", m.qk_layernorm)
    a.switch("--untie-embeddings-and-output-weights", m.untie_embeddings_and_output_weights)
    if m.window_size is not None:
        a += ["--window-size", f"{m.window_size},0"]
        if m.window_full_attention_every > 1:
            a += ["--window-attn-skip-freq", m.window_full_attention_every]
    if m.is_moe:
        p = spec.parallel
        a += ["--num-experts", m.num_moe_experts]
        a.switch("--moe-grouped-gemm", p.moe_grouped_gemm)
        a.switch("--moe-permute-fusion", p.moe_permute_fusion)
        a.switch("--moe-router-fusion", p.moe_router_fusion)
        if p.moe_router_load_balancing_type != "aux_loss":
            a += ["--moe-router-load-balancing-type", p.moe_router_load_balancing_type]
        if p.moe_token_dispatcher_type == "flex":
            a.value("--moe-flex-dispatcher-backend", p.moe_flex_dispatcher_backend)
            if p.moe_flex_num_sms is not None:  # core_v0.16.1's per-backend flag
                a += [f"--moe-{p.moe_flex_dispatcher_backend}-num-sms", p.moe_flex_num_sms]
        a += router_term_flags(p.moe_router_terms)
        a.value("--moe-router-topk", m.moe_router_topk)
        a.value("--moe-token-dispatcher-type", spec.parallel.moe_token_dispatcher_type)
        a.value("--moe-ffn-hidden-size", m.moe_ffn_hidden_size)
        a.value("--moe-shared-expert-intermediate-size",
                m.moe_shared_expert_intermediate_size)
        if m.moe_router_num_groups:
            a += ["--moe-router-num-groups", m.moe_router_num_groups,
                  "--moe-router-group-topk", m.moe_router_group_topk]
        if m.moe_expert_capacity_factor is not None:
            a += ["--moe-expert-capacity-factor", m.moe_expert_capacity_factor]
            a.switch("--moe-pad-expert-input-to-capacity",
                     m.moe_pad_expert_input_to_capacity)
        a.value("--moe-layer-freq", _moe_layer_freq(spec))
        a.value("--moe-router-dtype", spec.train.moe_router_dtype)
        a.switch("--moe-router-force-load-balancing",
                 spec.train.moe_router_force_load_balancing)
    if m.multi_latent_attention:
        a.append("--multi-latent-attention")
        a.value("--q-lora-rank", m.q_lora_rank)
        for flag, v in (("--kv-lora-rank", m.kv_lora_rank), ("--qk-head-dim", m.qk_head_dim),
                        ("--qk-pos-emb-head-dim", m.qk_pos_emb_head_dim),
                        ("--v-head-dim", m.v_head_dim)):
            a.value(flag, v)
    if m.mtp_num_layers:
        a += ["--mtp-num-layers", m.mtp_num_layers]
    return list(a)


# One flag line per router term (parallel.moe_router_terms): the recipes' usual values.
_ROUTER_TERM_FLAGS = {
    "aux_loss": ["--moe-aux-loss-coeff", "1e-3"],
    "z_loss": ["--moe-z-loss-coeff", "1e-3"],
    "input_jitter": ["--moe-input-jitter-eps", "1e-2"],
    "expert_bias": ["--moe-router-enable-expert-bias"],
    "sigmoid": ["--moe-router-score-function", "sigmoid"],
    "topk_scaling": ["--moe-router-topk-scaling-factor", "2.5"],
    "padding": ["--moe-router-padding-for-quantization"],
    "per_layer_logging": ["--moe-per-layer-logging"],
}


def router_term_flags(terms) -> list:
    return [x for t in terms for x in _ROUTER_TERM_FLAGS[t]]


def parallel_args(spec: RunSpec) -> list:
    p = spec.parallel
    a = _Args(["--tensor-model-parallel-size", p.tp, "--pipeline-model-parallel-size", p.pp,
               "--context-parallel-size", p.cp])
    layout = spec.layout
    if layout.how == "even":
        if p.vpp > 1:
            a += ["--num-layers-per-virtual-pipeline-stage",
                  layout.layers_per_virtual_stage[0]]
    elif layout.how == "first/last":
        a.value("--decoder-first-pipeline-num-layers", p.decoder_first_pipeline_num_layers)
        a.value("--decoder-last-pipeline-num-layers", p.decoder_last_pipeline_num_layers)
        if p.vpp > 1:  # Megatron-LM: uneven stages take the VPP degree, not a layer count
            a += ["--num-virtual-stages-per-pipeline-rank", p.vpp]
    elif layout.how == "embedding/loss":
        emb = p.account_for_embedding_in_pipeline_split
        loss = p.account_for_loss_in_pipeline_split
        a.switch("--account-for-embedding-in-pipeline-split", emb)
        a.switch("--account-for-loss-in-pipeline-split", loss)
        if p.vpp > 1:
            per = (spec.model.num_layers + emb + loss) // (p.pp * p.vpp)
            a += ["--num-layers-per-virtual-pipeline-stage", per]
    else:  # balanced or explicit: the layout string says all
        a += ["--pipeline-model-parallel-layout",
              layout_string(layout.layers_per_virtual_stage, spec.model.mtp_num_layers)]
    if p.resolved_schedule == "interleaved" and spec.num_microbatches % p.pp:
        # megatron-core needs whole microbatch groups; one group of all of them is legal.
        a += ["--microbatch-group-size-per-virtual-pipeline-stage", spec.num_microbatches]
    if p.cp_comm_type != "p2p":
        a += ["--cp-comm-type", p.cp_comm_type]
    if spec.model.is_moe:
        a += ["--expert-model-parallel-size", p.ep, "--expert-tensor-parallel-size",
              p.expert_tp]
        if p.overlap_moe_expert_parallel_comm:
            # the overlap model counts the weight gradients in the window (moe_comm.py)
            a += ["--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute"]
        a.switch("--moe-shared-expert-overlap", p.moe_shared_expert_overlap)
    a.switch("--sequence-parallel", p.sequence_parallel)
    legal = args_of_spec(spec.model, p, spec.train)
    if legal["use_torch_fsdp2"]:
        a.append("--use-torch-fsdp2")  # needs --no-gradient-accumulation-fusion (below)
        a.switch("--torch-fsdp2-no-reshard-after-forward", not p.fsdp_reshard_after_forward)
    if legal["use_megatron_fsdp"]:
        a += ["--use-megatron-fsdp", "--data-parallel-sharding-strategy",
              "optim_grads_params", "--ckpt-format", legal["ckpt_format"]]
    a.switch("--use-distributed-optimizer", legal["use_distributed_optimizer"])
    a.value("--num-distributed-optimizer-instances", p.num_distributed_optimizer_instances)
    a.switch("--overlap-grad-reduce", p.overlap_grad_reduce)
    a.switch("--overlap-param-gather", legal["overlap_param_gather"])
    # Both on by default in Megatron-LM (project/dp_sync.py times them).
    a.switch("--no-align-grad-reduce", not p.align_grad_reduce)
    a.switch("--no-align-param-gather", legal["overlap_param_gather"] and p.vpp > 1
             and not p.align_param_gather)
    a.switch("--tp-comm-overlap", legal["tp_comm_overlap"])
    return list(a)


def train_args(spec: RunSpec) -> list:
    t, p = spec.train, spec.parallel
    a = _Args(["--micro-batch-size", t.micro_batch_size, "--global-batch-size",
               t.global_batch_size, "--seq-length", t.seq_length])
    if t.precision in ("bf16", "fp8"):
        a.append("--bf16")
        a.switch("--grad-reduce-in-bf16", not p.grad_reduce_in_fp32)
    elif t.precision == "fp16":
        a.append("--fp16")
        a.switch("--accumulate-allreduce-grads-in-fp32", p.grad_reduce_in_fp32)
    if t.precision == "fp8":
        a += ["--fp8-format", FP8_FORMAT]
        a.value("--fp8-recipe", t.fp8_recipe)
        a.switch("--fp8-param-gather", t.fp8_param_gather)
    if t.te is not None:
        a += ["--transformer-impl", "transformer_engine" if t.te else "local"]
    if t.recompute_granularity == "full":
        a += ["--recompute-granularity", "full", "--recompute-method", t.recompute_method,
              "--recompute-num-layers", t.recompute_num_layers]
    elif t.recompute_granularity == "selective":
        a += ["--recompute-granularity", "selective"]
        if tuple(t.recompute_modules) != ("core_attn",):  # Megatron-LM's default module
            a += ["--recompute-modules", *t.recompute_modules]
    if t.attention_backend != "flash":
        a += ["--attention-backend", t.attention_backend]
    a.value("--optimizer", t.optimizer)
    a.switch("--cross-entropy-loss-fusion", t.cross_entropy_loss_fusion)
    if t.cross_entropy_loss_fusion:
        a.value("--cross-entropy-fusion-impl", t.cross_entropy_fusion_impl)
    a.switch("--no-attention-softmax-in-fp32", not t.attention_softmax_in_fp32)
    a.switch("--no-masked-softmax-fusion", t.masked_softmax_fusion is False)
    a.switch("--no-rope-fusion", not t.apply_rope_fusion
             and spec.model.position_embedding_type == "rope")
    # Megatron-LM: '--use-torch-fsdp2 is not supported with gradient accumulation fusion'.
    a.switch("--no-gradient-accumulation-fusion",
             not t.gradient_accumulation_fusion or p.fsdp)
    if t.defer_embedding_wgrad_compute:
        a.append("--defer-embedding-wgrad-compute")
        a.value("--wgrad-deferral-limit", t.wgrad_deferral_limit)
    if t.offload_modules:
        a += ["--fine-grained-activation-offloading", "--offload-modules",
              *t.offload_modules]
    if t.cpu_offloading_num_layers:
        a += ["--cpu-offloading", "--cpu-offloading-num-layers",
              t.cpu_offloading_num_layers]
    a.switch("--deterministic-mode", t.deterministic_mode)
    a.switch("--log-params-norm", t.log_params_norm)
    a.switch("--log-num-zeros-in-grad", t.log_num_zeros_in_grad)
    if t.check_weight_hash_interval is not None:
        a.value("--check-weight-hash-across-dp-replicas-interval",
                t.check_weight_hash_interval)
    # Megatron-LM core_v0.16.1 (arguments.py --cuda-graph-scope): full_iteration only
    # with the local implementation (and without the NaN check), the other scopes with
    # transformer_engine; no scope captures whole layers.
    if "full_iteration" in t.cuda_graph_scope:
        a += ["--cuda-graph-impl", "local", "--cuda-graph-scope", "full_iteration",
              "--no-check-for-nan-in-loss-and-grad"]
    elif t.cuda_graph_scope:
        a += ["--cuda-graph-impl", "transformer_engine"]
        if t.cuda_graph_scope != ("layer",):
            a += ["--cuda-graph-scope", *t.cuda_graph_scope]
    if t.use_precision_aware_optimizer:
        a.append("--use-precision-aware-optimizer")
        a.value("--main-grads-dtype", t.main_grads_dtype)
        a.value("--exp-avg-dtype", t.exp_avg_dtype)
        a.value("--exp-avg-sq-dtype", t.exp_avg_sq_dtype)
    return list(a)


def data_args(spec: RunSpec) -> list:
    return ["--mock-data", "--tokenizer-type", "NullTokenizer",
            "--vocab-size", spec.model.vocab_size - 1,
            "--train-iters", 20, "--eval-iters", 0, "--log-interval", 1,
            "--lr", "3e-4", "--min-lr", "3e-5", "--lr-decay-style", "cosine",
            "--weight-decay", "0.1", "--clip-grad", "1.0", "--init-method-std", "0.01",
            "--log-throughput"]


def megatron_argv(spec: RunSpec) -> list[str]:
    """Every Megatron-LM flag for ``spec`` (strings, ready for a shell)."""
    return [str(x) for x in (model_args(spec) + parallel_args(spec) + train_args(spec)
                             + data_args(spec))]


def torchrun_script(spec: RunSpec, title: str = "") -> str:
    """A bash script: the torchrun line with the Megatron-LM flags, one group a line.

    NNODES (and GPUS_PER_NODE for a partial node) and PRIMUS_TARGET_HARDWARE are
    exported with the recipe's values as defaults: torchrun reads the first, and
    ``launch/pretrain_gpt.py --project-only`` (parse_megatron_args) reads all three.
    """
    c = spec.cluster
    groups = [model_args(spec), parallel_args(spec), train_args(spec), data_args(spec)]
    lines = ["#!/usr/bin/env bash",
             _comment(title) if title else "# primus-ext tune recipe",
             _comment(f"{c.num_nodes} node(s) x {c.node_size} {c.hardware.name}; run on every "
                      "node with NODE_RANK, MASTER_ADDR and MASTER_PORT set."),
             "# NullTokenizer counts --vocab-size + 1 tokens (EOD): the flag is vocab_size - 1.",
             "# Projection only, same flags: replace $MEGATRON_LM/pretrain_gpt.py by "
             "primus-ext's launch/pretrain_gpt.py and add --project-only.",
             "set -euo pipefail",
             "MEGATRON_LM=${MEGATRON_LM:-/workspace/Megatron-LM}",
             f"export NNODES=${{NNODES:-{c.num_nodes}}}",
             *_default_env("PRIMUS_TARGET_HARDWARE", c.hardware.name)]
    if c.gpus_per_node is not None:
        lines.append(f"export GPUS_PER_NODE=${{GPUS_PER_NODE:-{c.gpus_per_node}}}")
    for name, value in required_env(args_of_spec(spec.model, spec.parallel,
                                                 spec.train)).items():
        # Megatron-LM core_v0.16.1 validate_args (arguments.py:951): TP or CP > 1 without
        # FSDP needs CUDA_DEVICE_MAX_CONNECTIONS=1 before Blackwell.
        lines.append(f"export {name}={value}")
    if spec.train.deterministic_mode:
        # Megatron-LM core_v0.16.1 validate_args asserts NCCL_ALGO under
        # --deterministic-mode; megatron-core's TE attention refuses it unless
        # NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 (training/determinism.py's defaults).
        lines += ["export NCCL_ALGO=${NCCL_ALGO:-Ring}",
                  "export NVTE_ALLOW_NONDETERMINISTIC_ALGO=0",
                  "export CUBLAS_WORKSPACE_CONFIG=${CUBLAS_WORKSPACE_CONFIG:-:4096:8}"]
    if spec.train.device_hw_queues is not None:
        # The hardware queues the projection gave the grouped GEMM's streams (HIP).
        lines.append(f"export GPU_MAX_HW_QUEUES={int(spec.train.device_hw_queues)}")
    if spec.parallel.resolved_schedule == "zb":
        lines.insert(3, "# Schedule: zero-bubble (ZB-H1) as projected; upstream Megatron-LM "
                        "has no flag for it (Primus: --enable-zero-bubble), so this line "
                        "runs 1F1B.")
    if spec.train.optimizer_impl != "megatron":
        lines.insert(3, f"# Projected with NeMo 1's Apex DistributedFusedAdam (train."
                        f"optimizer_impl={spec.train.optimizer_impl}); Megatron-LM has no "
                        "flag for it, so this line runs megatron-core's distributed "
                        "optimizer (fp32 master weights and moments: more optimizer "
                        "memory).")
    if not spec.train.master_weights:
        lines.insert(3, "# Projected without fp32 master weights (train.master_weights="
                        "false); Megatron-LM has no flag for it, so this line keeps them "
                        "(more optimizer memory).")
    if spec.train.loss_impl == "torch":
        lines.insert(3, "# Projected with torch's cross-entropy on the bf16 logits (train."
                        "loss_impl=torch); Megatron-LM computes its vocab-parallel loss "
                        "(fp32 unless --cross-entropy-loss-fusion).")
    if (spec.parallel.fsdp and not spec.parallel.fsdp_reshard_after_forward
            and spec.parallel.fsdp_impl != "torch_fsdp2"):
        lines.insert(3, "# Projected without resharding after forward (parallel.fsdp_"
                        "reshard_after_forward=false, ZeRO-2); Megatron-FSDP has no such "
                        "mode, so this line gathers the parameters again in backward.")
    if spec.parallel.tp_comm_overlap or spec.parallel.fsdp:
        lines.insert(3, "# Needs Transformer Engine (tp-comm-overlap) / FSDP support "
                        "in the Megatron-LM build.")
    lines += ["", "torchrun \\",
              f"  --nnodes $NNODES --nproc-per-node {c.node_size} \\",
              "  --node-rank ${NODE_RANK:-0} --master-addr ${MASTER_ADDR:-localhost} "
              "--master-port ${MASTER_PORT:-6000} \\",
              '  "$MEGATRON_LM/pretrain_gpt.py" \\']
    for i, args in enumerate(groups):
        end = " \\" if i < len(groups) - 1 else ""
        lines.append(f"  {_join([str(x) for x in args])}{end}")
    lines.append("")
    return "\n".join(lines)


def _default_env(name: str, value: str) -> list[str]:
    """``export NAME=${NAME:-value}``; a value that is not a plain shell word is set,
    quoted, on a line of its own first, so its expansion is one word whatever it holds."""
    if shlex.quote(value) == value:
        return [f"export {name}=${{{name}:-{value}}}"]
    return [f"primus_default={shlex.quote(value)}",
            f'export {name}="${{{name}:-$primus_default}}"']


def _comment(text: str) -> str:
    """One comment line: a newline or another control character in ``text`` (a model
    name, a title) is written escaped, so nothing after it can become a command."""
    return "# " + "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


def _join(args: list[str]) -> str:
    """Flags with their values on one line, shell-quoted where needed."""
    return " ".join(shlex.quote(a) for a in args)
