"""Megatron-LM flags and a torchrun line for a RunSpec (``megatron_args.sh``).

Targets Megatron-LM's ``pretrain_gpt.py`` argument names (megatron-core 0.14 and
later). The launch runs on mock data with the NullTokenizer, so only the model shape,
layout and training settings matter. Megatron's NullTokenizer reports
``--vocab-size + 1`` tokens (the extra one is EOD), so the flag carries
``vocab_size - 1`` for the padded vocabulary to come out as the spec's.
"""
from __future__ import annotations

import shlex

from primus_ext.spec import RunSpec

FP8_FORMAT = "hybrid"  # e4m3 forward, e5m2 backward: Transformer Engine's usual recipe


def _layout_string(spec: RunSpec) -> str:
    """--pipeline-model-parallel-layout: one '|'-separated entry per virtual stage in
    pipeline order; E = embedding, t = decoder layer, L = output layer and loss."""
    counts = spec.layout.layers_per_virtual_stage
    parts = []
    for k, n in enumerate(counts):
        s = "t" * n
        if k == 0:
            s = "E" + s
        if k == len(counts) - 1:
            s = s + "L"
        parts.append(s)
    return "|".join(parts)


def _moe_layer_freq(spec: RunSpec) -> str | None:
    m = spec.model
    if m.moe_first_k_dense == 0:
        return None if m.moe_layer_freq == 1 else str(m.moe_layer_freq)
    pattern = ",".join("1" if m.is_moe_layer(i) else "0" for i in range(m.num_layers))
    return f"[{pattern}]"


def model_args(spec: RunSpec) -> list[str]:
    m = spec.model
    a = ["--num-layers", m.num_layers, "--hidden-size", m.hidden_size,
         "--num-attention-heads", m.num_attention_heads]
    if m.ffn_hidden_size is not None:  # Megatron's default is 4 * hidden, as ours
        a += ["--ffn-hidden-size", m.ffn_hidden_size]
    if m.num_query_groups is not None:
        a += ["--group-query-attention", "--num-query-groups", m.num_query_groups]
    if m.kv_channels is not None:
        a += ["--kv-channels", m.kv_channels]
    a += ["--max-position-embeddings", m.max_position_embeddings,
          "--position-embedding-type", m.position_embedding_type,
          "--normalization", m.normalization,
          "--make-vocab-size-divisible-by", m.make_vocab_size_divisible_by,
          "--hidden-dropout", m.hidden_dropout, "--attention-dropout", m.attention_dropout]
    if m.activation == "swiglu":
        a.append("--swiglu")
    elif m.activation == "squared_relu":
        a.append("--squared-relu")
    if not m.add_bias_linear:
        a.append("--disable-bias-linear")
    if m.add_qkv_bias:
        a.append("--add-qkv-bias")
    if m.qk_layernorm:
        a.append("--qk-layernorm")
    if m.untie_embeddings_and_output_weights:
        a.append("--untie-embeddings-and-output-weights")
    if m.window_size is not None:
        a += ["--window-size", f"{m.window_size},0"]
        if m.window_full_attention_every > 1:
            a += ["--window-attn-skip-freq", m.window_full_attention_every]
    if m.is_moe:
        a += ["--num-experts", m.num_moe_experts, "--moe-router-topk", m.moe_router_topk,
              "--moe-grouped-gemm", "--moe-token-dispatcher-type",
              spec.parallel.moe_token_dispatcher_type]
        if m.moe_ffn_hidden_size is not None:
            a += ["--moe-ffn-hidden-size", m.moe_ffn_hidden_size]
        if m.moe_shared_expert_intermediate_size:
            a += ["--moe-shared-expert-intermediate-size",
                  m.moe_shared_expert_intermediate_size]
        if m.moe_router_num_groups:
            a += ["--moe-router-num-groups", m.moe_router_num_groups,
                  "--moe-router-group-topk", m.moe_router_group_topk]
        if m.moe_expert_capacity_factor is not None:
            a += ["--moe-expert-capacity-factor", m.moe_expert_capacity_factor]
            if m.moe_pad_expert_input_to_capacity:
                a.append("--moe-pad-expert-input-to-capacity")
        freq = _moe_layer_freq(spec)
        if freq is not None:
            a += ["--moe-layer-freq", freq]
    if m.multi_latent_attention:
        a.append("--multi-latent-attention")
        if m.q_lora_rank is not None:
            a += ["--q-lora-rank", m.q_lora_rank]
        a += ["--kv-lora-rank", m.kv_lora_rank, "--qk-head-dim", m.qk_head_dim,
              "--qk-pos-emb-head-dim", m.qk_pos_emb_head_dim, "--v-head-dim", m.v_head_dim]
    if m.mtp_num_layers:
        a += ["--mtp-num-layers", m.mtp_num_layers]
    return a


def parallel_args(spec: RunSpec) -> list[str]:
    p = spec.parallel
    a = ["--tensor-model-parallel-size", p.tp, "--pipeline-model-parallel-size", p.pp,
         "--context-parallel-size", p.cp]
    layout = spec.layout
    if layout.how == "even":
        if p.vpp > 1:
            a += ["--num-layers-per-virtual-pipeline-stage",
                  layout.layers_per_virtual_stage[0]]
    elif layout.how == "first/last" and p.vpp == 1:
        if p.decoder_first_pipeline_num_layers is not None:
            a += ["--decoder-first-pipeline-num-layers", p.decoder_first_pipeline_num_layers]
        if p.decoder_last_pipeline_num_layers is not None:
            a += ["--decoder-last-pipeline-num-layers", p.decoder_last_pipeline_num_layers]
    elif layout.how == "embedding/loss" and p.vpp == 1:
        if p.account_for_embedding_in_pipeline_split:
            a.append("--account-for-embedding-in-pipeline-split")
        if p.account_for_loss_in_pipeline_split:
            a.append("--account-for-loss-in-pipeline-split")
    else:  # uneven with virtual stages, balanced or explicit: the layout string says all
        a += ["--pipeline-model-parallel-layout", _layout_string(spec)]
    if p.resolved_schedule == "interleaved" and spec.num_microbatches % p.pp:
        # megatron-core needs whole microbatch groups; one group of all of them is legal.
        a += ["--microbatch-group-size-per-virtual-pipeline-stage", spec.num_microbatches]
    a += ["--cp-comm-type", p.cp_comm_type]
    if spec.model.is_moe:
        a += ["--expert-model-parallel-size", p.ep, "--expert-tensor-parallel-size",
              p.expert_tp]
        if p.overlap_moe_expert_parallel_comm:
            a.append("--overlap-moe-expert-parallel-comm")
        if p.moe_shared_expert_overlap:
            a.append("--moe-shared-expert-overlap")
    if p.sequence_parallel:
        a.append("--sequence-parallel")
    if p.fsdp:
        a += ["--use-torch-fsdp2", "--no-gradient-accumulation-fusion"]
    elif p.use_distributed_optimizer:
        a.append("--use-distributed-optimizer")
    if p.overlap_grad_reduce:
        a.append("--overlap-grad-reduce")
    if p.overlap_param_gather and (p.use_distributed_optimizer or p.fsdp):
        a.append("--overlap-param-gather")
    if p.tp_comm_overlap:
        a.append("--tp-comm-overlap")
    return a


def train_args(spec: RunSpec) -> list[str]:
    t = spec.train
    a = ["--micro-batch-size", t.micro_batch_size, "--global-batch-size",
         t.global_batch_size, "--seq-length", t.seq_length]
    if t.precision in ("bf16", "fp8"):
        a.append("--bf16")
        if not spec.parallel.grad_reduce_in_fp32:
            a.append("--grad-reduce-in-bf16")
    elif t.precision == "fp16":
        a.append("--fp16")
        if spec.parallel.grad_reduce_in_fp32:
            a.append("--accumulate-allreduce-grads-in-fp32")
    if t.precision == "fp8":
        a += ["--fp8-format", FP8_FORMAT, "--fp8-recipe", t.fp8_recipe]
        if t.fp8_param_gather:
            a.append("--fp8-param-gather")
    if t.use_precision_aware_optimizer:
        a += ["--use-precision-aware-optimizer", "--main-grads-dtype", t.main_grads_dtype,
              "--exp-avg-dtype", t.exp_avg_dtype, "--exp-avg-sq-dtype", t.exp_avg_sq_dtype]
    if t.offload_modules:
        a += ["--fine-grained-activation-offloading", "--offload-modules",
              *t.offload_modules]
    if t.te is not None:
        a += ["--transformer-impl", "transformer_engine" if t.te else "local"]
    if t.recompute_granularity == "full":
        a += ["--recompute-granularity", "full", "--recompute-method", t.recompute_method,
              "--recompute-num-layers", t.recompute_num_layers]
    elif t.recompute_granularity == "selective":
        a += ["--recompute-granularity", "selective", "--recompute-modules",
              *t.recompute_modules]
    a += ["--attention-backend", t.attention_backend, "--optimizer", t.optimizer]
    if t.cross_entropy_loss_fusion:
        a.append("--cross-entropy-loss-fusion")
    if not t.attention_softmax_in_fp32:
        a.append("--no-attention-softmax-in-fp32")
    return a


def data_args(spec: RunSpec) -> list[str]:
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
    if spec.parallel.resolved_schedule == "zb":
        lines.insert(3, "# Schedule: zero-bubble (ZB-H1) as projected; upstream Megatron-LM "
                        "has no flag for it (Primus: --enable-zero-bubble), so this line "
                        "runs 1F1B.")
    if spec.parallel.tp_comm_overlap or spec.parallel.fsdp:
        lines.insert(3, "# Needs Transformer Engine (tp-comm-overlap) / torch FSDP2 support "
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
