"""Megatron-LM ``pretrain_gpt.py`` flags -> RunSpec (pure: no torch, no Hydra).

``parse_launch_args(argv)`` reads a launch line with the flag table (``table.py``): the
flags that decide step time and memory take Megatron-LM's defaults when absent
(LayerNorm, GeLU, learned absolute positions, biases, tied embeddings, dropout 0.1, no
distributed optimizer, no overlap, the delayed FP8 recipe), and Megatron-LM's argument
checks are applied with its reasons: sequence parallelism (and the TP communication
overlap) is turned off at TP 1 with a note, ``--fp16 --bf16`` and layers that do not
divide over the pipeline without a layout are refused. The vocabulary comes from
``vocab.py``. The target cluster comes from ``--target-nodes`` /
``--target-gpus-per-node`` / ``--target-hardware`` (else $NNODES and $GPUS_PER_NODE,
else the cluster torchrun launched: $WORLD_SIZE / $LOCAL_WORLD_SIZE, else one node of the
preset, or as many as the model-parallel size needs). It reads back what
``flags.megatron_argv`` writes. Every other flag is accepted: the caller prints
``warning_lines`` -- flags not modelled that may change step time first, then the flags
with no effect on step time or memory (``no_effect.py``).
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from dataclasses import dataclass

from primus_ext.frameworks.megatron.impl_flags import (cuda_graph_scope, moe_impl,
                                                     router_dtype)
from primus_ext.frameworks.megatron.line_flags import (check_optimizer, cross_entropy,
                                                     global_batch, refuse_other_models)
from primus_ext.frameworks.megatron.model_flags import model_spec
from primus_ext.frameworks.megatron.line_rules import check_line
from primus_ext.frameworks.megatron.no_effect import is_known  # noqa: F401 (re-export)
from primus_ext.frameworks.megatron.no_effect import split_unknown
from primus_ext.frameworks.megatron.parallel_flags import (Notes, _cp_comm_type, _dispatcher,
                                                         _grad_reduce_in_fp32,
                                                         _sequence_parallel, _virtual_stages)
from primus_ext.frameworks.megatron.table import FLAGS
from primus_ext.frameworks.megatron.target import default_target_note, target_cluster
from primus_ext.spec import ParallelSpec, RunSpec, TrainSpec
from primus_ext.util.files import check_outputs


@dataclass(frozen=True, kw_only=True, slots=True)
class LaunchArgs:
    spec: RunSpec  # the target run
    train_iters: int
    project_only: bool
    projection_backend: str  # hybrid (measure, then project) | simulate (analytic)
    profile_out: str | None
    projection_out: str | None
    recipe_out: str | None
    timings_out: str | None
    layer_times: bool  # training mode: per-layer hook times on rank 0's log
    measure_warmup: int
    measure_repeats: int
    num_microbatches: int
    not_modelled: tuple[str, ...]  # flags (or flag values) that may change step time
    no_effect: tuple[str, ...]  # flags with no effect on step time or memory
    notes: tuple[str, ...]  # what was decided for the user (vocabulary, turned-off flags)
    target_note: str | None = None  # set when the target is the default (no flag named it)
    layers_per_kind: int = 2  # hybrid: decoder layers of each kind measured
    measure_memory_gib: float | None = None  # hybrid: the measurement's memory budget
    measure_max_seconds: float | None = None  # hybrid: its estimated compute budget

    @property
    def ignored(self) -> tuple[str, ...]:
        return self.not_modelled + self.no_effect


def _parser() -> argparse.ArgumentParser:
    # argparse's own errors (a bad choice or type, a missing required flag) exit with
    # code 2 and its message, as Megatron-LM's argparse does; the checks below raise
    # ValueError with Megatron-LM's reason.
    p = argparse.ArgumentParser(prog="pretrain_gpt.py", add_help=True, allow_abbrev=False)
    for f in FLAGS:
        kw: dict = {"dest": f.dest} if f.dest else {}
        if f.type is None:
            kw["action"] = "store_false" if f.store_false else "store_true"
        else:
            kw.update(type=f.type, default=f.default)
            for k in ("choices", "nargs", "required"):
                if getattr(f, k):
                    kw[k] = getattr(f, k)
        if f.help:
            kw["help"] = f.help
        p.add_argument(f.name, **kw)
    return p


def _parallel(ns, n: Notes) -> ParallelSpec:
    pp = ns.pipeline_model_parallel_size
    vpp, layout = _virtual_stages(ns, n)
    fsdp = ns.use_torch_fsdp2 or ns.use_megatron_fsdp
    check_optimizer(ns, fsdp, n)
    if ns.use_megatron_fsdp and ns.data_parallel_sharding_strategy != "optim_grads_params":
        n.not_modelled.append(f"--data-parallel-sharding-strategy "
                              f"{ns.data_parallel_sharding_strategy} (modelled as "
                              "optim_grads_params, full sharding)")
    if ns.torch_fsdp2_no_reshard_after_forward and not ns.use_torch_fsdp2:
        n.notes.append("--torch-fsdp2-no-reshard-after-forward: no effect without "
                       "--use-torch-fsdp2 (Megatron-LM core_v0.16.1 training.py reads it "
                       "for torch FSDP2 only)")
    if ns.delay_wgrad_compute and not ns.overlap_moe_expert_parallel_comm:
        raise ValueError("--delay-wgrad-compute needs --overlap-moe-expert-parallel-comm "
                         "(megatron-core: 'overlap_moe_expert_parallel_comm must be "
                         "enabled when enabling delay_wgrad_compute')")
    sp, tp_overlap = _sequence_parallel(ns, n)
    if ns.defer_embedding_wgrad_compute and pp == 1:
        raise ValueError("--defer-embedding-wgrad-compute needs pipeline parallelism "
                         "(megatron-core: 'Cannot defer embedding wgrad compute when "
                         "pipeline model parallel is not used')")
    etp = ns.expert_tensor_parallel_size
    if etp == ns.tensor_model_parallel_size:
        etp = None  # megatron-core's default: expert TP = TP
    par = ParallelSpec(
        tp=ns.tensor_model_parallel_size, pp=pp, vpp=vpp, cp=ns.context_parallel_size,
        ep=ns.expert_model_parallel_size, etp=etp, sequence_parallel=sp,
        use_distributed_optimizer=ns.use_distributed_optimizer and not fsdp, fsdp=fsdp,
        fsdp_impl="torch_fsdp2" if ns.use_torch_fsdp2 else "megatron_fsdp",
        fsdp_reshard_after_forward=not (ns.use_torch_fsdp2
                                        and ns.torch_fsdp2_no_reshard_after_forward),
        num_distributed_optimizer_instances=ns.num_distributed_optimizer_instances,
        overlap_grad_reduce=ns.overlap_grad_reduce,
        overlap_param_gather=ns.overlap_param_gather, tp_comm_overlap=tp_overlap,
        # Megatron-LM arguments.py turns align_param_gather off without virtual stages;
        # it acts only with --overlap-param-gather (training.py param_sync_func).
        align_param_gather=ns.align_param_gather and vpp > 1 and ns.overlap_param_gather,
        align_grad_reduce=ns.align_grad_reduce,
        grad_reduce_in_fp32=_grad_reduce_in_fp32(ns, fsdp, n),
        moe_token_dispatcher_type=_dispatcher(ns),
        overlap_moe_expert_parallel_comm=ns.overlap_moe_expert_parallel_comm,
        moe_shared_expert_overlap=ns.moe_shared_expert_overlap,
        cp_comm_type=_cp_comm_type(ns, n),
        **moe_impl(ns),
        decoder_first_pipeline_num_layers=ns.decoder_first_pipeline_num_layers,
        decoder_last_pipeline_num_layers=ns.decoder_last_pipeline_num_layers,
        account_for_embedding_in_pipeline_split=ns.account_for_embedding_in_pipeline_split,
        account_for_loss_in_pipeline_split=ns.account_for_loss_in_pipeline_split,
        pipeline_layout=layout)
    return par


def _precision(ns) -> str:
    if ns.fp16 and ns.bf16:
        raise ValueError("--fp16 and --bf16 are exclusive (Megatron-LM validate_args: "
                         "'assert not args.fp16' under --bf16)")
    return "fp8" if ns.fp8_format else "bf16" if ns.bf16 else "fp16" if ns.fp16 \
        else "fp32"


def _train(ns, dp: int, n: Notes) -> TrainSpec:
    precision = _precision(ns)
    gran = ns.recompute_granularity or ("selective" if ns.recompute_activations else None)
    if gran == "selective" and ns.recompute_method is not None:
        raise ValueError("--recompute-method needs --recompute-granularity full "
                         "(Megatron-LM: 'recompute method is not yet supported for "
                         "selective recomputing granularity')")
    fp8_gather = ns.fp8_param_gather and precision == "fp8"
    if ns.fp8_param_gather and not fp8_gather:
        n.notes.append("--fp8-param-gather has no effect without --fp8-format")
    pao = ns.use_precision_aware_optimizer
    dtypes = (ns.main_grads_dtype, ns.exp_avg_dtype, ns.exp_avg_sq_dtype)
    if not pao and dtypes[1:] != ("fp32",) * 2:
        n.notes.append("--exp-avg-dtype / --exp-avg-sq-dtype have no effect without "
                       "--use-precision-aware-optimizer")
    if not pao:  # --main-grads-dtype bf16 alone: bf16 gradients (grad_reduce_in_fp32)
        dtypes = ("fp32",) * 3
    if ns.main_params_dtype != "fp32":
        n.not_modelled.append(f"--main-params-dtype {ns.main_params_dtype} (modelled as "
                              "fp32 main parameters)")
    te = None if ns.transformer_impl is None else ns.transformer_impl != "local"
    # megatron-core's local spec has one core attention, its unfused DotProductAttention
    # (gpt_layer_specs.py get_gpt_layer_local_spec); --attention-backend (default auto)
    # only chooses among Transformer Engine's backends (LanguageModule.
    # _set_attention_backend sets TE's NVTE_*_ATTN switches).
    backend = "unfused" if ns.attention_backend in ("unfused", "local") or te is False \
        else "flash"
    ce_fusion, ce_impl = cross_entropy(ns, n)
    return TrainSpec(
        seq_length=ns.seq_length, micro_batch_size=ns.micro_batch_size,
        global_batch_size=global_batch(ns, dp, n),
        precision=precision, recompute_granularity=gran,
        # Megatron-LM's recipe under --fp8-format (delayed unless --fp8-recipe); without
        # FP8 the field does not apply and keeps the spec's default.
        fp8_recipe=ns.fp8_recipe if precision == "fp8" else TrainSpec().fp8_recipe,
        recompute_method=ns.recompute_method, recompute_num_layers=ns.recompute_num_layers,
        recompute_modules=tuple(ns.recompute_modules) if ns.recompute_modules
        else ("core_attn",),
        attention_backend=backend, optimizer=ns.optimizer,
        cross_entropy_loss_fusion=ce_fusion, cross_entropy_fusion_impl=ce_impl,
        attention_softmax_in_fp32=not ns.no_attention_softmax_in_fp32, te=te,
        fp8_param_gather=fp8_gather, use_precision_aware_optimizer=pao,
        main_grads_dtype=dtypes[0], exp_avg_dtype=dtypes[1], exp_avg_sq_dtype=dtypes[2],
        moe_router_dtype=router_dtype(ns, n),
        offload_modules=tuple(ns.offload_modules or ())
        if ns.fine_grained_activation_offloading else (),
        cpu_offloading_num_layers=ns.cpu_offloading_num_layers if ns.cpu_offloading
        else 0,
        moe_router_force_load_balancing=bool(ns.num_experts)
        and ns.moe_router_force_load_balancing,
        deterministic_mode=ns.deterministic_mode, log_params_norm=ns.log_params_norm,
        log_num_zeros_in_grad=ns.log_num_zeros_in_grad,
        check_weight_hash_interval=ns.check_weight_hash_across_dp_replicas_interval,
        cuda_graph_scope=cuda_graph_scope(ns),
        masked_softmax_fusion=False if ns.no_masked_softmax_fusion else None,
        # Megatron-LM validate_args: 'if args.position_embedding_type != "rope":
        # args.apply_rope_fusion = False': the RoPE variants yarn and mrope run
        # megatron-core's unfused RoPE (without RoPE the field is moot).
        apply_rope_fusion=ns.apply_rope_fusion and (
            ns.use_rotary_position_embeddings
            or ns.position_embedding_type not in ("yarn", "mrope")),
        # torch FSDP2 requires the flag (Megatron-LM validate_args) and the memory model
        # reads the field only without FSDP: under FSDP it keeps the spec's default.
        gradient_accumulation_fusion=not ns.no_gradient_accumulation_fusion
        or ns.use_torch_fsdp2 or ns.use_megatron_fsdp,
        defer_embedding_wgrad_compute=ns.defer_embedding_wgrad_compute,
        wgrad_deferral_limit=ns.wgrad_deferral_limit)


def _spec(ns, name: str | None, n: Notes) -> RunSpec:
    model = model_spec(ns, name, n)
    par = _parallel(ns, n)
    cluster = target_cluster(ns, par.tp * par.pp * par.cp)
    dp = cluster.world_size // (par.tp * par.pp * par.cp) or 1
    try:
        spec = RunSpec(model=model, parallel=par, train=_train(ns, dp, n),
                       cluster=cluster)
    except ValueError as exc:
        note = default_target_note(ns, cluster)
        if note is None:
            raise
        raise ValueError(f"{exc} ({note})") from None
    if par.pipeline_layout is not None:
        # A layout string that spells the default placement is no explicit layout.
        plain = dataclasses.replace(par, pipeline_layout=None)
        try:
            if dataclasses.replace(spec, parallel=plain).layout.layers_per_virtual_stage \
                    == par.pipeline_layout:
                spec = dataclasses.replace(spec, parallel=plain)
        except ValueError:
            pass
    if spec.layout.how == "balanced" and ns.pipeline_model_parallel_layout is None:
        # a placement Megatron-LM would not make without a layout
        raise ValueError(f"--num-layers {model.num_layers} does not divide into "
                         f"pp*vpp={par.pp * par.vpp} virtual stages and no layout is "
                         "given (megatron-core needs layers divisible by the virtual "
                         "stages; set --pipeline-model-parallel-layout)")
    return spec


def parse_launch_args(argv: list[str] | None = None, *, name: str | None = None
                      ) -> LaunchArgs:
    argv = list(sys.argv[1:] if argv is None else argv)
    refuse_other_models(argv)
    ns, unknown = _parser().parse_known_args(argv)
    check_line(ns, unknown)  # what Megatron-LM's validate_args refuses, with its reason
    n = Notes()
    spec = _spec(ns, name, n)
    not_mod, no_eff = split_unknown(unknown, n.not_modelled)
    check_outputs({"--projection-out": ns.projection_out, "--profile-out": ns.profile_out,
                   "--timings-out": ns.timings_out}, {"--recipe-out": ns.recipe_out})
    return LaunchArgs(spec=spec, train_iters=ns.train_iters or 10,
                      project_only=ns.project_only,
                      projection_backend=ns.projection_backend,
                      profile_out=ns.profile_out, projection_out=ns.projection_out,
                      recipe_out=ns.recipe_out, timings_out=ns.timings_out,
                      layer_times=ns.log_layer_times, measure_warmup=ns.measure_warmup,
                      measure_repeats=ns.measure_repeats,
                      num_microbatches=ns.measure_microbatches, not_modelled=not_mod,
                      layers_per_kind=ns.measure_layers_per_kind,
                      measure_memory_gib=ns.measure_memory_gib,
                      measure_max_seconds=ns.measure_max_seconds,
                      no_effect=no_eff, notes=tuple(n.notes),
                      target_note=default_target_note(ns, spec.cluster))


def parse_megatron_args(argv: list[str] | None = None, *, name: str | None = None
                        ) -> RunSpec:
    """The target RunSpec of a Megatron-LM ``pretrain_gpt.py`` command line."""
    return parse_launch_args(argv, name=name).spec


def warning_lines(la: LaunchArgs) -> list[str]:
    """The launcher's warnings: unmodelled flags first, then the no-effect ones, each on
    one line (none when empty)."""
    out = []
    if la.not_modelled:
        out.append("primus-ext: not modelled, may change step time: "
                   + "; ".join(la.not_modelled))
    if la.no_effect:
        out.append("primus-ext: no effect on step time or memory: " + " ".join(la.no_effect))
    return out

