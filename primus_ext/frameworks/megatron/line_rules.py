"""A parsed Megatron-LM launch line under Megatron-LM's own rules (spec/legal_megatron.py).

``line_args`` gives the rule table the arguments as Megatron-LM's ``parse_args`` would
hold them (``args.<dest>``); flags the drop-in does not model (``--ckpt-format``) are read
from the tokens argparse left over. The environment is not read: a projection runs
elsewhere than the job, and the recipe writer exports what the job needs.

One rule is read as the drop-in always has: ``--tp-comm-overlap`` at TP 1 is turned off
with a note (args.py ``_sequence_parallel``), though core_v0.16.1 refuses it (arguments.py
916, after line 907 turns SP off at TP 1): Megatron-MoE-ModelZoo's Qwen3-30B scripts set
it at TP 1, so the build they run accepts it.
"""
from __future__ import annotations

from primus_ext.spec.legal_megatron import DEFAULT_CKPT_FORMAT, check

_DESTS = ("num_layers", "seq_length", "max_position_embeddings",
          "tensor_model_parallel_size", "pipeline_model_parallel_size",
          "context_parallel_size", "expert_model_parallel_size", "sequence_parallel",
          "tp_comm_overlap", "use_distributed_optimizer", "use_torch_fsdp2",
          "use_megatron_fsdp", "overlap_grad_reduce", "overlap_param_gather",
          "untie_embeddings_and_output_weights", "fp16", "fp8_param_gather",
          "overlap_moe_expert_parallel_comm", "pipeline_model_parallel_layout",
          "decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers",
          "num_virtual_stages_per_pipeline_rank", "num_layers_per_virtual_pipeline_stage",
          "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split")


def _token_value(tokens: list[str], flag: str) -> str | None:
    value = None
    for i, t in enumerate(tokens):
        if t == flag and i + 1 < len(tokens):
            value = tokens[i + 1]
        elif t.startswith(flag + "="):
            value = t.split("=", 1)[1]
    return value


def line_args(ns, unknown: list[str]) -> dict:
    a = {k: getattr(ns, k, None) for k in _DESTS}
    a["tp_comm_overlap"] = bool(ns.tp_comm_overlap and ns.tensor_model_parallel_size > 1)
    a["gradient_accumulation_fusion"] = not getattr(ns, "no_gradient_accumulation_fusion",
                                                    False)
    a["ckpt_format"] = _token_value(unknown, "--ckpt-format") or DEFAULT_CKPT_FORMAT
    a["overlap_p2p_comm"] = "--no-overlap-p2p-communication" not in unknown
    if getattr(ns, "virtual_pipeline_model_parallel_size", None):
        a["num_virtual_stages_per_pipeline_rank"] = ns.virtual_pipeline_model_parallel_size
    return a


def check_line(ns, unknown: list[str]) -> None:
    """One ValueError with each of Megatron-LM's refusals of the line, or nothing."""
    check(line_args(ns, unknown), "launch line")
