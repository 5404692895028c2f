"""Megatron-LM ``pretrain_gpt.py`` flags -> RunSpec (pure: no torch, no Hydra).

``parse_megatron_args(argv)`` reads the flags that decide step time and memory (model
shape, parallel layout, batch, precision, recompute, optimizer) with Megatron-LM's
defaults where a flag is absent (LayerNorm, GeLU, learned absolute positions, biases,
tied embeddings, dropout 0.1, no distributed optimizer, no overlap); the target cluster
comes from ``--target-nodes`` / ``--target-gpus-per-node`` / ``--target-hardware``
(else $NNODES and $GPUS_PER_NODE, else the cluster torchrun launched: $WORLD_SIZE /
$LOCAL_WORLD_SIZE, else one node of the preset, or as many as the model-parallel size
needs). It reads back what
``primus_ext.frameworks.megatron.flags.megatron_argv`` writes (the NullTokenizer's
``--vocab-size`` is the vocabulary minus its EOD token). Every other flag (data paths,
checkpointing, logging, learning rate, ...) is accepted and ignored; the caller prints
them as one warning line (``LaunchArgs.ignored``).
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
import sys
from dataclasses import dataclass

from primus_ext.presets import hardware_preset
from primus_ext.spec import (ClusterSpec, ModelSpec, ParallelSpec, RunSpec, TrainSpec,
                             pipeline_layout)
from primus_ext.spec.parallel import MOE_DISPATCHERS


@dataclass(frozen=True, kw_only=True, slots=True)
class LaunchArgs:
    spec: RunSpec  # the target run
    train_iters: int
    project_only: bool
    profile_out: str | None
    projection_out: str | None
    recipe_out: str | None
    timings_out: str | None
    layer_times: bool  # training mode: per-layer hook times on rank 0's log
    measure_warmup: int
    measure_repeats: int
    num_microbatches: int
    ignored: tuple[str, ...]  # flags accepted and not modelled
    target_note: str | None = None  # set when the target is the default (no flag named it)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pretrain_gpt.py", add_help=True, allow_abbrev=False)
    a = p.add_argument
    # model
    a("--num-layers", type=int, required=True)
    a("--hidden-size", type=int, required=True)
    a("--num-attention-heads", type=int, required=True)
    a("--ffn-hidden-size", type=int)
    a("--group-query-attention", action="store_true")
    a("--num-query-groups", type=int)
    a("--kv-channels", type=int)
    a("--swiglu", action="store_true")
    a("--squared-relu", action="store_true")
    a("--normalization", default="LayerNorm", choices=("LayerNorm", "RMSNorm"))
    a("--untie-embeddings-and-output-weights", action="store_true")
    a("--position-embedding-type", default="learned_absolute",
      choices=("learned_absolute", "rope", "alibi", "none", "mrope", "yarn"))
    a("--disable-bias-linear", action="store_true")
    a("--add-qkv-bias", action="store_true")
    a("--qk-layernorm", action="store_true")
    a("--hidden-dropout", type=float, default=0.1)
    a("--attention-dropout", type=float, default=0.1)
    a("--vocab-size", type=int)
    a("--tokenizer-type", default=None)
    a("--make-vocab-size-divisible-by", type=int, default=128)
    a("--max-position-embeddings", type=int)
    a("--window-size", default=None)
    a("--window-attn-skip-freq", type=int, default=None)
    a("--num-experts", type=int)
    a("--moe-router-topk", type=int, default=2)
    a("--moe-ffn-hidden-size", type=int)
    a("--moe-shared-expert-intermediate-size", type=int)
    a("--moe-layer-freq", default=None)
    a("--moe-router-num-groups", type=int)
    a("--moe-router-group-topk", type=int)
    a("--moe-expert-capacity-factor", type=float)
    a("--moe-pad-expert-input-to-capacity", action="store_true")
    a("--multi-latent-attention", action="store_true")
    a("--q-lora-rank", type=int)
    a("--kv-lora-rank", type=int, default=512)
    a("--qk-head-dim", type=int, default=128)
    a("--qk-pos-emb-head-dim", type=int, default=64)
    a("--v-head-dim", type=int, default=128)
    a("--mtp-num-layers", type=int, default=0)
    # parallelism
    a("--tensor-model-parallel-size", type=int, default=1)
    a("--pipeline-model-parallel-size", type=int, default=1)
    a("--num-layers-per-virtual-pipeline-stage", type=int)
    a("--virtual-pipeline-model-parallel-size", type=int)
    a("--pipeline-model-parallel-layout", default=None)
    a("--decoder-first-pipeline-num-layers", type=int)
    a("--decoder-last-pipeline-num-layers", type=int)
    a("--account-for-embedding-in-pipeline-split", action="store_true")
    a("--account-for-loss-in-pipeline-split", action="store_true")
    a("--context-parallel-size", type=int, default=1)
    a("--cp-comm-type", default="p2p")
    a("--expert-model-parallel-size", type=int, default=1)
    a("--expert-tensor-parallel-size", type=int)
    a("--sequence-parallel", action="store_true")
    a("--use-distributed-optimizer", action="store_true")
    a("--use-torch-fsdp2", action="store_true")
    a("--use-megatron-fsdp", action="store_true")
    a("--overlap-grad-reduce", action="store_true")
    a("--overlap-param-gather", action="store_true")
    a("--tp-comm-overlap", action="store_true")
    a("--grad-reduce-in-bf16", action="store_true")
    a("--accumulate-allreduce-grads-in-fp32", action="store_true")
    a("--moe-token-dispatcher-type", default=None, choices=MOE_DISPATCHERS)
    a("--overlap-moe-expert-parallel-comm", action="store_true")
    a("--moe-shared-expert-overlap", action="store_true")
    # batch, precision, recompute, optimizer
    a("--micro-batch-size", type=int, default=1)
    a("--global-batch-size", type=int)
    a("--seq-length", type=int, required=True)
    a("--bf16", action="store_true")
    a("--fp16", action="store_true")
    a("--fp8-format", default=None)
    a("--fp8-recipe", default="tensorwise")
    a("--fp8-param-gather", action="store_true")
    a("--use-precision-aware-optimizer", action="store_true")
    a("--main-grads-dtype", default="fp32", choices=("fp32", "bf16"))
    a("--exp-avg-dtype", default="fp32", choices=("fp32", "fp16", "bf16", "fp8"))
    a("--exp-avg-sq-dtype", default="fp32", choices=("fp32", "fp16", "bf16", "fp8"))
    a("--transformer-impl", default=None, choices=("local", "transformer_engine"))
    a("--fine-grained-activation-offloading", action="store_true")
    a("--offload-modules", nargs="*", default=None)
    a("--recompute-granularity", default=None, choices=("full", "selective"))
    a("--recompute-method", default=None, choices=("uniform", "block"))
    a("--recompute-num-layers", type=int)
    a("--recompute-modules", nargs="*", default=None)
    a("--recompute-activations", action="store_true")
    a("--attention-backend", default="auto")
    a("--use-flash-attn", action="store_true")
    a("--attention-softmax-in-fp32", action="store_true")
    a("--no-attention-softmax-in-fp32", action="store_true")
    a("--optimizer", default="adam", choices=("adam", "sgd"))
    a("--cross-entropy-loss-fusion", action="store_true")
    a("--mock-data", action="store_true")
    a("--train-iters", type=int, default=10)
    # primus-ext
    a("--project-only", action="store_true")
    a("--target-nodes", type=int)
    a("--target-gpus-per-node", type=int)
    a("--target-hardware", default=None)
    a("--profile-out", default=None)
    a("--projection-out", default=None)
    a("--recipe-out", default=None)
    a("--timings-out", default=None)
    a("--log-layer-times", action="store_true")
    a("--model-name", default=None)
    a("--measure-warmup", type=int, default=2)
    a("--measure-repeats", type=int, default=3)
    a("--measure-microbatches", type=int, default=2)
    return p


def _layout_counts(layout: str) -> tuple[int, ...]:
    """'Ett|tt|ttL' (or 't*3') -> decoder layers per virtual stage."""
    counts = []
    for stage in layout.split("|"):
        n = 0
        for m in re.finditer(r"t(?:\*(\d+))?", stage):
            n += int(m.group(1) or 1)
        counts.append(n)
    return tuple(counts)


def _moe_pattern(freq: str | None, num_layers: int) -> tuple[int, int]:
    """(moe_layer_freq, moe_first_k_dense) from --moe-layer-freq (int or 0/1 list)."""
    if freq is None:
        return 1, 0
    s = freq.strip()
    if re.fullmatch(r"\d+", s):
        return int(s), 0
    if "*" in s:  # Megatron-LM's "([0]*3+[1]*58)"
        pattern: list[int] = []
        for val, rep in re.findall(r"\[(\d)\]\s*\*\s*(\d+)", s):
            pattern += [int(val)] * int(rep)
    else:
        pattern = [int(x) for x in re.findall(r"\d", s)]
    if len(pattern) != num_layers:
        raise ValueError(f"--moe-layer-freq {freq!r} has {len(pattern)} entries for "
                         f"--num-layers {num_layers}")
    k = next((i for i, v in enumerate(pattern) if v), num_layers)
    rest = pattern[k:]
    for f in range(1, len(rest) + 1):
        if rest == [1 if i % f == 0 else 0 for i in range(len(rest))]:
            return f, k
    raise ValueError(f"--moe-layer-freq {freq!r}: only 'k dense layers, then every f-th "
                     "layer MoE' patterns are modelled")


def _cluster(ns, mp: int) -> ClusterSpec:
    hw = hardware_preset(ns.target_hardware or os.environ.get("PRIMUS_TARGET_HARDWARE",
                                                              "h100"))
    # Without target flags the target is the launched cluster (torchrun's env); with
    # any of them, the target's nodes have the preset's size unless said otherwise.
    targeted = bool(ns.target_nodes or ns.target_hardware or ns.target_gpus_per_node)
    local, world = _env_int("LOCAL_WORLD_SIZE"), _env_int("WORLD_SIZE")
    gpn = ns.target_gpus_per_node or _env_int("GPUS_PER_NODE") or (
        None if targeted else local) or None
    nodes = ns.target_nodes or _env_int("NNODES") or (
        world // local if world and local and not targeted else None)
    if nodes is None:
        nodes = max(1, math.ceil(mp / (gpn or hw.gpus_per_node)))
    return ClusterSpec(hardware=hw, num_nodes=nodes, gpus_per_node=gpn)


def _env_int(name: str) -> int | None:
    v = os.environ.get(name)
    return int(v) if v and v.isdigit() else None


def _grad_reduce_in_fp32(ns) -> bool:
    """Megatron-LM: bf16 accumulates and reduces gradients in fp32 unless
    --grad-reduce-in-bf16; fp16 reduces in fp16 unless
    --accumulate-allreduce-grads-in-fp32; fp32 is fp32."""
    if ns.accumulate_allreduce_grads_in_fp32:
        return True
    if ns.bf16 or ns.fp8_format:
        # arguments.py: --main-grads-dtype bf16 leaves accumulate_allreduce_grads_in_fp32
        # off, as --grad-reduce-in-bf16 does.
        return not (ns.grad_reduce_in_bf16 or ns.main_grads_dtype == "bf16")
    return not ns.fp16


def _dispatcher(ns) -> str:
    """Megatron-LM's default MoE dispatcher is allgather; a dense model keeps the spec's
    default (the field does not apply)."""
    if ns.moe_token_dispatcher_type:
        return ns.moe_token_dispatcher_type
    return "allgather" if ns.num_experts else ParallelSpec().moe_token_dispatcher_type


def _spec(ns, name: str | None) -> RunSpec:
    L = ns.num_layers
    freq, first_k = _moe_pattern(ns.moe_layer_freq, L) if ns.num_experts else (1, 0)
    window, every = None, 1
    if ns.window_size:
        window = int(str(ns.window_size).split(",")[0])
        every = ns.window_attn_skip_freq or 1
    vocab = ns.vocab_size or 32000
    if ns.tokenizer_type == "NullTokenizer" and ns.vocab_size:
        vocab = ns.vocab_size + 1  # NullTokenizer appends the EOD token
    activation = "swiglu" if ns.swiglu else "squared_relu" if ns.squared_relu else "gelu"
    model = ModelSpec(
        moe_router_num_groups=ns.moe_router_num_groups,
        moe_router_group_topk=ns.moe_router_group_topk,
        moe_expert_capacity_factor=ns.moe_expert_capacity_factor,
        moe_pad_expert_input_to_capacity=ns.moe_pad_expert_input_to_capacity,
        name=name or ns.model_name or f"gpt-{L}l-{ns.hidden_size}h",
        num_layers=L, hidden_size=ns.hidden_size,
        num_attention_heads=ns.num_attention_heads, ffn_hidden_size=ns.ffn_hidden_size,
        num_query_groups=ns.num_query_groups if ns.group_query_attention else None,
        kv_channels=ns.kv_channels, vocab_size=vocab,
        make_vocab_size_divisible_by=ns.make_vocab_size_divisible_by,
        max_position_embeddings=ns.max_position_embeddings or ns.seq_length,
        normalization=ns.normalization, activation=activation,
        add_bias_linear=not ns.disable_bias_linear, add_qkv_bias=ns.add_qkv_bias,
        qk_layernorm=ns.qk_layernorm,
        position_embedding_type=ns.position_embedding_type
        if ns.position_embedding_type in ("rope", "learned_absolute", "alibi", "none")
        else "rope",
        untie_embeddings_and_output_weights=ns.untie_embeddings_and_output_weights,
        hidden_dropout=ns.hidden_dropout, attention_dropout=ns.attention_dropout,
        window_size=window, window_full_attention_every=every,
        num_moe_experts=ns.num_experts, moe_router_topk=ns.moe_router_topk,
        moe_ffn_hidden_size=ns.moe_ffn_hidden_size,
        moe_shared_expert_intermediate_size=ns.moe_shared_expert_intermediate_size,
        moe_layer_freq=freq, moe_first_k_dense=first_k,
        multi_latent_attention=ns.multi_latent_attention, q_lora_rank=ns.q_lora_rank,
        kv_lora_rank=ns.kv_lora_rank, qk_head_dim=ns.qk_head_dim,
        qk_pos_emb_head_dim=ns.qk_pos_emb_head_dim, v_head_dim=ns.v_head_dim,
        mtp_num_layers=ns.mtp_num_layers)
    pp = ns.pipeline_model_parallel_size
    layout = _layout_counts(ns.pipeline_model_parallel_layout) \
        if ns.pipeline_model_parallel_layout else None
    vpp = 1
    if layout is not None:
        vpp = max(len(layout) // pp, 1)
    elif ns.virtual_pipeline_model_parallel_size:
        vpp = ns.virtual_pipeline_model_parallel_size
    elif ns.num_layers_per_virtual_pipeline_stage:
        vpp = L // (pp * ns.num_layers_per_virtual_pipeline_stage)
    fsdp = ns.use_torch_fsdp2 or ns.use_megatron_fsdp
    etp = ns.expert_tensor_parallel_size
    if etp == ns.tensor_model_parallel_size:
        etp = None  # megatron-core's default: expert TP = TP
    par = ParallelSpec(
        tp=ns.tensor_model_parallel_size, pp=pp, vpp=vpp, cp=ns.context_parallel_size,
        ep=ns.expert_model_parallel_size, etp=etp,
        # Megatron-LM arguments.py: "Disabling sequence parallelism because tensor model
        # parallelism is disabled" (the flag is ignored at TP 1).
        sequence_parallel=ns.sequence_parallel and ns.tensor_model_parallel_size > 1,
        use_distributed_optimizer=ns.use_distributed_optimizer and not fsdp, fsdp=fsdp,
        overlap_grad_reduce=ns.overlap_grad_reduce,
        overlap_param_gather=ns.overlap_param_gather, tp_comm_overlap=ns.tp_comm_overlap,
        grad_reduce_in_fp32=_grad_reduce_in_fp32(ns),
        moe_token_dispatcher_type=_dispatcher(ns),
        overlap_moe_expert_parallel_comm=ns.overlap_moe_expert_parallel_comm,
        moe_shared_expert_overlap=ns.moe_shared_expert_overlap,
        cp_comm_type="a2a" if ns.cp_comm_type == "a2a" else "p2p",
        decoder_first_pipeline_num_layers=ns.decoder_first_pipeline_num_layers,
        decoder_last_pipeline_num_layers=ns.decoder_last_pipeline_num_layers,
        account_for_embedding_in_pipeline_split=ns.account_for_embedding_in_pipeline_split,
        account_for_loss_in_pipeline_split=ns.account_for_loss_in_pipeline_split,
        pipeline_layout=layout)
    if layout is not None:
        # A layout string that spells the default placement is no explicit layout.
        plain = dataclasses.replace(par, pipeline_layout=None)
        try:
            if pipeline_layout(L, plain).layers_per_virtual_stage == layout:
                par = plain
        except ValueError:
            pass
    precision = "fp8" if ns.fp8_format else "bf16" if ns.bf16 else "fp16" if ns.fp16 \
        else "fp32"
    gran = ns.recompute_granularity or ("selective" if ns.recompute_activations else None)
    backend = ns.attention_backend
    attn = "unfused" if backend in ("unfused", "local") else "flash"
    cluster = _cluster(ns, par.tp * par.pp * par.cp)
    try:
        return _run_spec(ns, model, par, cluster, gran, attn, precision)
    except ValueError as exc:
        note = _default_target_note(ns, cluster)
        if note is None:
            raise
        raise ValueError(f"{exc} ({note})") from None


def _default_target_note(ns, cluster: ClusterSpec) -> str | None:
    """What the target defaults to, when no flag or environment variable names it: a
    rule broken by that default (a batch too small for its data parallelism) reads as
    the user's mistake unless the message says where the cluster came from."""
    named = bool(ns.target_nodes or ns.target_hardware or ns.target_gpus_per_node
                 or os.environ.get("PRIMUS_TARGET_HARDWARE") or _env_int("NNODES")
                 or _env_int("WORLD_SIZE"))
    if named:
        return None
    return (f"target: the default, {cluster.num_nodes} node(s) x {cluster.node_size} "
            f"{cluster.hardware.name}, since no --target-nodes / --target-gpus-per-node / "
            "--target-hardware was given; name the target, e.g. --target-hardware cpu "
            "--target-nodes 1 --target-gpus-per-node 1")


def _run_spec(ns, model, par, cluster, gran, attn, precision) -> RunSpec:
    dp = cluster.world_size // (par.tp * par.pp * par.cp) or 1
    train = TrainSpec(
        cross_entropy_loss_fusion=ns.cross_entropy_loss_fusion,
        seq_length=ns.seq_length, micro_batch_size=ns.micro_batch_size,
        global_batch_size=ns.global_batch_size or ns.micro_batch_size * dp,
        precision=precision, fp8_recipe=ns.fp8_recipe, recompute_granularity=gran,
        recompute_method=ns.recompute_method, recompute_num_layers=ns.recompute_num_layers,
        recompute_modules=tuple(ns.recompute_modules) if ns.recompute_modules
        else ("core_attn",),
        attention_backend=attn, optimizer=ns.optimizer,
        attention_softmax_in_fp32=not ns.no_attention_softmax_in_fp32,
        te=None if ns.transformer_impl is None else ns.transformer_impl != "local",
        fp8_param_gather=ns.fp8_param_gather and precision == "fp8",
        use_precision_aware_optimizer=ns.use_precision_aware_optimizer,
        main_grads_dtype=ns.main_grads_dtype, exp_avg_dtype=ns.exp_avg_dtype,
        exp_avg_sq_dtype=ns.exp_avg_sq_dtype,
        offload_modules=tuple(ns.offload_modules or ())
        if ns.fine_grained_activation_offloading else ())
    return RunSpec(model=model, parallel=par, train=train, cluster=cluster)


def parse_launch_args(argv: list[str] | None = None, *, name: str | None = None
                      ) -> LaunchArgs:
    argv = list(sys.argv[1:] if argv is None else argv)
    ns, unknown = _parser().parse_known_args(argv)
    ignored = tuple(x for x in unknown if x.startswith("--"))
    spec = _spec(ns, name)
    return LaunchArgs(spec=spec, target_note=_default_target_note(ns, spec.cluster),
                      train_iters=ns.train_iters,
                      project_only=ns.project_only, profile_out=ns.profile_out,
                      projection_out=ns.projection_out, recipe_out=ns.recipe_out,
                      timings_out=ns.timings_out, layer_times=ns.log_layer_times,
                      measure_warmup=ns.measure_warmup, measure_repeats=ns.measure_repeats,
                      num_microbatches=ns.measure_microbatches, ignored=ignored)


def parse_megatron_args(argv: list[str] | None = None, *, name: str | None = None
                        ) -> RunSpec:
    """The target RunSpec of a Megatron-LM ``pretrain_gpt.py`` command line."""
    return parse_launch_args(argv, name=name).spec


def ignored_warning(ignored: tuple[str, ...]) -> str | None:
    """The one warning line for flags accepted and not modelled."""
    if not ignored:
        return None
    return ("primus-ext: ignoring flags it does not model: " + " ".join(ignored))
