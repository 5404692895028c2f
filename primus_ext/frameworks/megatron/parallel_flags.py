"""Megatron-LM's rules for the parallel-layout flags of a launch line (pure): gradient
reduce dtype, the MoE token dispatcher, the CP communication type, sequence parallelism
and virtual pipeline stages, each with the note or refusal Megatron-LM gives.
"""
from __future__ import annotations

from primus_ext.frameworks.megatron import layout_string
from primus_ext.spec import ParallelSpec


class Notes:
    """Collects what the parse decided: notes for the user and unmodelled values."""

    def __init__(self) -> None:
        self.notes: list[str] = []
        self.not_modelled: list[str] = []


def _grad_reduce_in_fp32(ns, fsdp: bool, n: Notes) -> bool:
    """Megatron-LM: bf16 accumulates and reduces gradients in fp32 unless
    --grad-reduce-in-bf16; fp16 reduces in fp16 unless
    --accumulate-allreduce-grads-in-fp32; fp32 is fp32. Megatron-FSDP's main-gradient
    and communication dtypes ('auto': the rule above) replace it when set."""
    if ns.accumulate_allreduce_grads_in_fp32:
        if ns.main_grads_dtype == "bf16":
            raise ValueError("--main-grads-dtype bf16 with --accumulate-allreduce-grads-"
                             "in-fp32 (Megatron-LM: '--main-grads-dtype can only be fp32 "
                             "when --accumulate-allreduce-grads-in-fp32 is set')")
        rule = True
    elif ns.bf16 or ns.fp8_format:
        # validate_args: bf16 accumulates in fp32 unless --grad-reduce-in-bf16 or
        # --main-grads-dtype bf16.
        rule = not (ns.grad_reduce_in_bf16 or ns.main_grads_dtype == "bf16")
    else:
        rule = not ns.fp16
    if not (fsdp and ns.use_megatron_fsdp):
        return rule
    main = ns.megatron_fsdp_main_grads_dtype
    main = ("fp32" if rule else "bf16") if main == "auto" else main
    comm = main if ns.megatron_fsdp_grad_comm_dtype == "auto" \
        else ns.megatron_fsdp_grad_comm_dtype
    if "fp16" in (main, comm) or main != comm:
        n.not_modelled.append(f"--megatron-fsdp-main-grads-dtype {main} with "
                              f"--megatron-fsdp-grad-comm-dtype {comm} (modelled as {main})")
    return main == "fp32"


def _dispatcher(ns) -> str:
    """Megatron-LM's default MoE dispatcher is allgather; a dense model keeps the spec's
    default (the field does not apply)."""
    return ns.moe_token_dispatcher_type if ns.num_experts \
        else ParallelSpec().moe_token_dispatcher_type


def _cp_comm_type(ns, n: Notes) -> str:
    kinds = {"all_gather": "allgather"}
    types = [kinds.get(t, t) for t in ns.cp_comm_type]
    first = types[0]
    if first == "a2a+p2p" or len(set(types)) > 1:
        n.not_modelled.append("--cp-comm-type " + " ".join(ns.cp_comm_type)
                              + " (modelled as p2p)")
        return "p2p"
    return first


def _sequence_parallel(ns, n: Notes) -> tuple[bool, bool]:
    """(sequence_parallel, tp_comm_overlap) after Megatron-LM's checks
    (megatron/training/arguments.py validate_args): TP 1 disables sequence parallelism,
    and the TP communication overlap needs it."""
    sp, overlap = ns.sequence_parallel, ns.tp_comm_overlap
    if ns.tensor_model_parallel_size == 1:
        if sp:
            n.notes.append("--sequence-parallel turned off: TP is 1 (Megatron-LM: "
                           "'Disabling sequence parallelism because tensor model "
                           "parallelism is disabled')")
        if overlap:
            n.notes.append("--tp-comm-overlap turned off: TP is 1 (no tensor-parallel "
                           "communication to overlap)")
        return False, False
    if overlap and not sp:
        raise ValueError("--tp-comm-overlap needs --sequence-parallel (Megatron-LM: "
                         "'Tensor parallel communication/GEMM overlap can happen only "
                         "when sequence parallelism is enabled')")
    return sp, overlap


def _virtual_stages(ns, n: Notes) -> tuple[int, tuple[int, ...] | None]:
    """(vpp, explicit layout) from Megatron-LM's three exclusive flags (validate_args:
    'No more than one of the following arguments can be set at the same time')."""
    L, pp = ns.num_layers, ns.pipeline_model_parallel_size
    given = [f for f, v in (("--num-layers-per-virtual-pipeline-stage",
                             ns.num_layers_per_virtual_pipeline_stage),
                            ("--num-virtual-stages-per-pipeline-rank",
                             ns.num_virtual_stages_per_pipeline_rank),
                            ("--pipeline-model-parallel-layout",
                             ns.pipeline_model_parallel_layout),
                            ("--virtual-pipeline-model-parallel-size",
                             ns.virtual_pipeline_model_parallel_size)) if v is not None]
    if len(given) > 1:
        raise ValueError(f"{' and '.join(given)}: no more than one of them can be set "
                         "(Megatron-LM validate_args)")
    extra = int(ns.account_for_embedding_in_pipeline_split) + \
        int(ns.account_for_loss_in_pipeline_split)
    if ns.pipeline_model_parallel_layout is not None:
        counts = layout_string.layout_counts(ns.pipeline_model_parallel_layout, pp=pp,
                                             num_layers=L,
                                             mtp_num_layers=ns.mtp_num_layers or 0)
        return len(counts) // pp, counts
    first_last = ns.decoder_first_pipeline_num_layers is not None or \
        ns.decoder_last_pipeline_num_layers is not None
    if ns.num_layers_per_virtual_pipeline_stage is not None:
        if first_last:
            raise ValueError("--num-layers-per-virtual-pipeline-stage with --decoder-first/"
                             "last-pipeline-num-layers (Megatron-LM: 'please use "
                             "--num-virtual-stages-per-pipeline-rank to specify virtual "
                             "pipeline parallel degree when enable uneven pipeline "
                             "parallelism')")
        per_vs = ns.num_layers_per_virtual_pipeline_stage
        total = L + extra
        if total % pp:
            raise ValueError(f"--num-layers {L} (+{extra} for embedding/loss) is not "
                             f"divisible by --pipeline-model-parallel-size {pp} "
                             "(Megatron-LM: 'number of layers of the model must be "
                             "divisible pipeline model parallel size')")
        if (total // pp) % per_vs:
            raise ValueError(f"--num-layers-per-virtual-pipeline-stage {per_vs} does not "
                             f"divide the {total // pp} layers of a pipeline stage")
        return total // pp // per_vs, None
    vpp = ns.num_virtual_stages_per_pipeline_rank or \
        ns.virtual_pipeline_model_parallel_size or 1
    if vpp == 1 and not first_last and (L + extra) % pp:
        raise ValueError(f"--num-layers {L} (+{extra} for embedding/loss) is not "
                         f"divisible by --pipeline-model-parallel-size {pp} and no layout "
                         "is given (Megatron-LM: 'Number of layers should be divisible by "
                         "the pipeline-model-parallel size'; set "
                         "--pipeline-model-parallel-layout or "
                         "--decoder-first/last-pipeline-num-layers)")
    return vpp, None
