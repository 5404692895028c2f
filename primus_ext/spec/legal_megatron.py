"""Megatron-LM's legal space: the layout and sharding rules of its argument checks.

One rule table, taken from NVIDIA/Megatron-LM tag ``core_v0.16.1`` (the release that
matches megatron-core 0.16.1): ``megatron/training/arguments.py`` ``validate_args`` (line
numbers below are that file's at the tag). Each rule states what Megatron-LM refuses and
its own message; nothing else is refused. The rules read a flat mapping of Megatron-LM's
argument names (``args.<dest>`` after ``parse_args``) plus the launch environment:

- the tuner's candidates and the app's composed spec: ``check_spec`` (through
  ``spec/run.py`` ``check_run``) on ``args_of_spec``, the arguments the recipe writes;
- the drop-in's parsed line: ``check`` on the namespace argparse produced;
- the recipe writer: ``required_env`` says what the script exports.

Pure: no torch, no Hydra.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

SOURCE = "Megatron-LM core_v0.16.1 megatron/training/arguments.py"
# Megatron-LM's --ckpt-format default (training_config.py CheckpointConfig.ckpt_format).
DEFAULT_CKPT_FORMAT = "torch_dist"
# Megatron-FSDP checkpoints only as fsdp_dtensor (arguments.py:690): the recipe writes it.
MEGATRON_FSDP_CKPT_FORMAT = "fsdp_dtensor"
FSDP_IMPLS = ("megatron_fsdp", "torch_fsdp2")
SHARDING_STRATEGIES = ("no_shard", "optim", "optim_grads", "optim_grads_params")
CDMC = "CUDA_DEVICE_MAX_CONNECTIONS"


@dataclass(frozen=True, slots=True)
class Rule:
    name: str
    line: int  # in SOURCE
    message: str  # Megatron-LM's own assertion text
    refuses: Callable[[Mapping], bool]
    detail: Callable[[Mapping], str] | None = None  # the values that break it

    def describe(self, a: Mapping) -> str:
        said = f": {self.detail(a)}" if self.detail else ""
        return f"{self.message}{said} ({SOURCE}:{self.line}; {self.name})"


def _g(a: Mapping, k: str, default=None):
    v = a.get(k, default)
    return default if v is None else v


def _pp(a):
    return _g(a, "pipeline_model_parallel_size", 1)


def _fsdp(a) -> bool:
    return bool(_g(a, "use_torch_fsdp2", False) or _g(a, "use_megatron_fsdp", False))


def _layers_split_given(a) -> bool:
    return bool(a.get("pipeline_model_parallel_layout") is not None
                or a.get("decoder_first_pipeline_num_layers") is not None
                or a.get("decoder_last_pipeline_num_layers") is not None
                or a.get("num_virtual_stages_per_pipeline_rank") is not None)


def _layers_for_split(a) -> int:
    return (_g(a, "num_layers", 0) + int(bool(_g(a, "account_for_embedding_in_pipeline_split")))
            + int(bool(_g(a, "account_for_loss_in_pipeline_split"))))


def _uneven_without_layout(a) -> bool:
    if _layers_split_given(a) and a.get("num_layers_per_virtual_pipeline_stage") is None:
        return False
    if a.get("pipeline_model_parallel_layout") is not None:
        return False
    return _layers_for_split(a) % _pp(a) != 0


def _virtual_split_uneven(a) -> bool:
    per_virtual = a.get("num_layers_per_virtual_pipeline_stage")
    if per_virtual is None or _uneven_without_layout(a):
        return False
    return (_layers_for_split(a) // _pp(a)) % per_virtual != 0


def _interleaved(a) -> bool:
    return (a.get("num_layers_per_virtual_pipeline_stage") is not None
            or _g(a, "num_virtual_stages_per_pipeline_rank", 1) > 1
            or _g(a, "virtual_pipeline_model_parallel_size", 1) > 1)


def _needs_cdmc_1(a) -> bool:
    """arguments.py:927-953: before Blackwell, TP or CP > 1 without FSDP and without the
    EP A2A overlap requires CUDA_DEVICE_MAX_CONNECTIONS=1 (with FSDP or the overlap it
    is a warning only)."""
    model_parallel = (_g(a, "tensor_model_parallel_size", 1) > 1
                      or _g(a, "context_parallel_size", 1) > 1)
    return (model_parallel and _g(a, "device_arch_major", 9) < 10 and not _fsdp(a)
            and not _g(a, "overlap_moe_expert_parallel_comm", False))


def _env(a):
    return a.get("env", {}).get(CDMC)


RULES: tuple[Rule, ...] = (
    Rule("pp divides the layers", 570,
         "Number of layers should be divisible by the pipeline-model-parallel size "
         "(set --pipeline-model-parallel-layout or --decoder-first/last-pipeline-num-layers "
         "for an uneven split)", _uneven_without_layout,
         lambda a: f"--num-layers {_g(a, 'num_layers', 0)} (+"
                   f"{_layers_for_split(a) - _g(a, 'num_layers', 0)} for embedding/loss) is "
                   f"not divisible by --pipeline-model-parallel-size {_pp(a)}"),
    Rule("virtual stage divides a stage", 547,
         "number of layers per pipeline stage must be divisible number of layers per "
         "virtual pipeline stage", _virtual_split_uneven),
    Rule("interleaving without p2p overlap needs pp > 2", 579,
         "When interleaved schedule is used and p2p communication overlap is disabled, "
         "pipeline-model-parallel size should be greater than 2",
         lambda a: _interleaved(a) and not _g(a, "overlap_p2p_comm", True) and _pp(a) <= 2),
    Rule("overlap-param-gather sharding", 598,
         "--overlap-param-gather only supported with distributed optimizer or megatron fsdp",
         lambda a: bool(_g(a, "overlap_param_gather", False)) and not (
             _g(a, "use_distributed_optimizer", False) or _g(a, "use_megatron_fsdp", False))),
    Rule("overlap-param-gather needs overlap-grad-reduce", 600,
         "Must use --overlap-param-gather with --overlap-grad-reduce",
         lambda a: bool(_g(a, "overlap_param_gather", False))
         and not _g(a, "overlap_grad_reduce", False)),
    Rule("FSDP2 without PP", 608, "--use-torch-fsdp2 is not supported with pipeline "
         "parallelism", lambda a: bool(_g(a, "use_torch_fsdp2", False)) and _pp(a) != 1),
    Rule("FSDP2 without EP", 610, "--use-torch-fsdp2 is not supported with expert "
         "parallelism", lambda a: bool(_g(a, "use_torch_fsdp2", False))
         and _g(a, "expert_model_parallel_size", 1) != 1),
    Rule("FSDP2 without the distributed optimizer", 612,
         "--use-torch-fsdp2 is not supported with MCore's distributed optimizer",
         lambda a: bool(_g(a, "use_torch_fsdp2", False))
         and bool(_g(a, "use_distributed_optimizer", False))),
    Rule("FSDP2 without gradient accumulation fusion", 614,
         "--use-torch-fsdp2 is not supported with gradient accumulation fusion",
         lambda a: bool(_g(a, "use_torch_fsdp2", False))
         and bool(_g(a, "gradient_accumulation_fusion", True))),
    Rule("FSDP2 checkpoint format", 616,
         "--use-torch-fsdp2 requires --ckpt-format torch_dist or torch_dcp",
         lambda a: bool(_g(a, "use_torch_fsdp2", False))
         and _g(a, "ckpt_format", DEFAULT_CKPT_FORMAT) not in ("torch_dist", "torch_dcp")),
    Rule("FSDP2 with untied embeddings", 618,
         "--use-torch-fsdp2 requires --untie-embeddings-and-output-weights",
         lambda a: bool(_g(a, "use_torch_fsdp2", False))
         and not _g(a, "untie_embeddings_and_output_weights", False)),
    Rule("FSDP2 without fp16", 620, "--use-torch-fsdp2 not supported with fp16 yet",
         lambda a: bool(_g(a, "use_torch_fsdp2", False)) and bool(_g(a, "fp16", False))),
    Rule("FSDP2 connections", 622,
         "FSDP always requires CUDA_DEVICE_MAX_CONNECTIONS value large than one",
         lambda a: bool(_g(a, "use_torch_fsdp2", False)) and _env(a) == "1"),
    Rule("fp8-param-gather sharding", 656,
         "--fp8-param-gather only supported with distributed optimizer, torch fsdp2, "
         "megatron fsdp, or inference mode",
         lambda a: bool(_g(a, "fp8_param_gather", False)) and not (
             _g(a, "use_distributed_optimizer", False) or _fsdp(a))),
    Rule("Megatron-FSDP connections", 687,
         "FSDP always requires CUDA_DEVICE_MAX_CONNECTIONS value large than one",
         lambda a: bool(_g(a, "use_megatron_fsdp", False)) and _env(a) == "1"),
    Rule("Megatron-FSDP checkpoint format", 690,
         "Megatron FSDP only supports fsdp_dtensor checkpoint format "
         "(--ckpt-format fsdp_dtensor; so it never runs together with --use-torch-fsdp2, "
         "which requires torch_dist or torch_dcp, line 616)",
         lambda a: bool(_g(a, "use_megatron_fsdp", False))
         and _g(a, "ckpt_format", DEFAULT_CKPT_FORMAT) != MEGATRON_FSDP_CKPT_FORMAT),
    Rule("max-position-embeddings given", 799,
         "max_position_embeddings argument is None (--max-position-embeddings is required)",
         lambda a: "max_position_embeddings" in a and a["max_position_embeddings"] is None),
    Rule("seq-length within max-position-embeddings", 830,
         "max_position_embeddings must be greater than or equal to seq_length",
         lambda a: a.get("max_position_embeddings") is not None
         and _g(a, "seq_length", 0) > a["max_position_embeddings"],
         lambda a: f"--seq-length {a.get('seq_length')} > --max-position-embeddings "
                   f"{a.get('max_position_embeddings')}"),
    Rule("tp-comm-overlap needs SP", 916,
         "Tensor parallel communication/GEMM overlap can happen only when sequence "
         "parallelism is enabled",
         lambda a: bool(_g(a, "tp_comm_overlap", False)) and not (
             _g(a, "sequence_parallel", False)
             and _g(a, "tensor_model_parallel_size", 1) > 1),
         lambda a: "--tp-comm-overlap needs --sequence-parallel with TP > 1"),
    Rule("TP/CP connections", 951,
         "Using tensor model parallelism or context parallelism require setting the "
         "environment variable CUDA_DEVICE_MAX_CONNECTIONS to 1",
         lambda a: "env" in a and _needs_cdmc_1(a) and _env(a) != "1"),
    Rule("fsdp_dtensor needs Megatron-FSDP", 1050,
         "--ckpt-format fsdp_dtensor is only tested with Megatron FSDP.",
         lambda a: _g(a, "ckpt_format", DEFAULT_CKPT_FORMAT) == MEGATRON_FSDP_CKPT_FORMAT
         and not _g(a, "use_megatron_fsdp", False)),
)


def violations(args: Mapping) -> list[str]:
    """Every rule of ``RULES`` that Megatron-LM would refuse ``args`` by, described."""
    return [r.describe(args) for r in RULES if r.refuses(args)]


def check(args: Mapping, where: str = "Megatron-LM") -> None:
    """One ValueError naming each refused rule, or nothing."""
    bad = violations(args)
    if bad:
        raise ValueError(f"{where}: Megatron-LM's validate_args refuses this: "
                         + "; ".join(bad))


def required_env(args: Mapping) -> dict[str, str]:
    """The environment a launch of ``args`` must export (arguments.py:951); FSDP must
    not have CUDA_DEVICE_MAX_CONNECTIONS=1 (lines 622, 687), so nothing is set for it."""
    return {CDMC: "1"} if _needs_cdmc_1(args) else {}


def args_of_spec(model, par, train) -> dict:
    """The Megatron-LM arguments (``args.<dest>``) that decide legality, as the recipe
    writer (frameworks/megatron/flags.py) writes them for the spec; the environment is
    the one it exports (``required_env``)."""
    torch_fsdp2 = par.fsdp and par.fsdp_impl == "torch_fsdp2"
    megatron_fsdp = par.fsdp and par.fsdp_impl == "megatron_fsdp"
    # Megatron-FSDP runs megatron-core's DistributedOptimizer over its sharded buffers
    # (NVIDIA's Megatron-FSDP launch lines pass --use-distributed-optimizer with it).
    distopt = (par.use_distributed_optimizer and not par.fsdp) or megatron_fsdp
    a = {
        "num_layers": model.num_layers,
        "seq_length": train.seq_length,
        "max_position_embeddings": recipe_max_position_embeddings(model, train),
        "tensor_model_parallel_size": par.tp,
        "pipeline_model_parallel_size": par.pp,
        "context_parallel_size": par.cp,
        "expert_model_parallel_size": par.ep,
        "sequence_parallel": par.sequence_parallel,
        "tp_comm_overlap": recipe_tp_comm_overlap(par),
        "use_distributed_optimizer": distopt,
        "use_torch_fsdp2": torch_fsdp2,
        "use_megatron_fsdp": megatron_fsdp,
        "ckpt_format": MEGATRON_FSDP_CKPT_FORMAT if megatron_fsdp else DEFAULT_CKPT_FORMAT,
        "overlap_grad_reduce": par.overlap_grad_reduce,
        "overlap_param_gather": recipe_overlap_param_gather(par),
        "gradient_accumulation_fusion": train.gradient_accumulation_fusion
        and not torch_fsdp2,
        "untie_embeddings_and_output_weights": model.untie_embeddings_and_output_weights,
        "fp16": train.precision == "fp16",
        "fp8_param_gather": train.precision == "fp8" and train.fp8_param_gather,
        "overlap_moe_expert_parallel_comm": par.overlap_moe_expert_parallel_comm,
        # Uneven splits are written as --pipeline-model-parallel-layout or first/last.
        "pipeline_model_parallel_layout": None,
    }
    if model.num_layers % (par.pp * par.vpp) or par.pipeline_layout is not None or (
            par.decoder_first_pipeline_num_layers is not None
            or par.decoder_last_pipeline_num_layers is not None):
        a["pipeline_model_parallel_layout"] = "given"
    a["env"] = required_env(a)
    return a


def recipe_overlap_param_gather(par) -> bool:
    """--overlap-param-gather as written: only where Megatron-LM has it (distributed
    optimizer or Megatron-FSDP, line 598); torch FSDP2 prefetches its own all-gathers."""
    return bool(par.overlap_param_gather and par.overlap_grad_reduce and (
        (par.use_distributed_optimizer and not par.fsdp)
        or (par.fsdp and par.fsdp_impl == "megatron_fsdp")))


def recipe_tp_comm_overlap(par) -> bool:
    """--tp-comm-overlap as written: only with sequence parallelism over TP > 1 (line
    916; Megatron-LM turns SP off at TP 1 first, line 907)."""
    return bool(par.tp_comm_overlap and par.sequence_parallel and par.tp > 1)


def recipe_max_position_embeddings(model, train) -> int:
    """--max-position-embeddings as written (always: Megatron-LM requires it, line 799).
    Learned positions keep the model's table; without a learned table the value only
    bounds the sequence (line 830), so it is raised to the sequence length."""
    mpe = model.max_position_embeddings
    if model.position_embedding_type == "learned_absolute":
        return mpe
    return max(mpe, train.seq_length)


def check_spec(model, par, train) -> None:
    check(args_of_spec(model, par, train), "spec")
