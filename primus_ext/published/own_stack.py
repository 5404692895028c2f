"""Recipe rules of the sources that document their own stack (the Llama 3 paper,
torchtitan's benchmarks, llm-foundry's MPT benchmarks): what each states for itself, so
nothing is filled from the Megatron performance recipes (``recipes.recipe_for`` calls
these; ``Recipe`` and ``RowFacts`` live in ``recipes``)."""
from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from primus_ext.published.recipes import Recipe, RowFacts


def llama3_paper(f: RowFacts, rec: Recipe) -> None:
    rec.set("parallel", "grad_reduce_in_fp32", True, "Llama 3 paper Sec. 3.3.2: gradients "
            "reduce-scattered in FP32")
    if not f.recompute_stated and f.seq // f.cp <= 8192:
        rec.sets_recompute = rec.recompute_from_source = True
        rec.notes.append("recompute: none (Llama 3 paper Sec. 3.3.2: with these memory "
                         "optimisations Llama 3 pre-trains on 8K-token sequences without "
                         "activation checkpointing; here seq/cp <= 8192 tokens per rank)")
    if f.pp == 1 or f.vp_stated:
        return
    for v in range(2, 65):
        chunks = f.pp * v - 2
        if chunks > 0 and f.num_layers % chunks == 0:
            per = f.num_layers // chunks
            rec.set("parallel", "vpp", v, "Llama 3 paper Sec. 3.3.2: interleaved schedule; "
                    "smallest V with equal layers per chunk once the first and last chunks "
                    "hold only the embedding and the output layer with the loss")
            rec.set("parallel", "pipeline_layout", (0,) + (per,) * chunks + (0,),
                    "Llama 3 paper Sec. 3.3.2: first chunk embedding only, last chunk "
                    "output projection and loss only")
            return


_LOCAL_BATCH = re.compile(r"local batch (?:size )?(\d+)", re.I)


def torchtitan(f: RowFacts, rec: Recipe) -> None:
    src = "torchtitan"
    rec.set("parallel", "grad_reduce_in_fp32", True, f"{src}: FSDP2 mixed precision "
            "reduce dtype float32 (config_manager.py Training.mixed_precision_reduce)")
    rec.set("train", "te", False, f"{src}: PyTorch modules, no Transformer Engine")
    rec.set("train", "recompute_modules", ("op",),
            f"{src}: selective activation checkpointing is op-level SAC "
            "(selective_ac_option='op': block input, every other mm output and SDPA "
            "kept; memory/sac_op.py)")
    rec.set("train", "flash_attn_impl", "fa2",
            f"{src}: F.scaled_dot_product_attention flash backend (FlashAttention-2)")
    if f.precision == "fp8":
        rec.set("train", "fp8_recipe", "tensorwise", f"{src}: torchao Float8Linear with "
                "dynamic tensorwise scaling (the float8 converter's default recipe)")
    if not re.search(r"torch\.compile", f.notes, re.I):
        rec.set("train", "fused_elementwise", False,
                f"{src}: eager (no torch.compile): composite RMSNorm, complex RoPE, "
                "SwiGLU as separate kernels")
    if "9dec370" in f.source_detail or f.source == "torchtitan-benchmarks-2024-12":
        rec.set("train", "loss_chunks", 1, f"{src}@9dec370 train.py: loss_fn = "
                "cross_entropy(pred.flatten(0, 1).float(), labels) on the whole sequence's "
                "logits (the chunked loss came later)")
    if f.cp > 1:
        rec.set("parallel", "cp_comm_type", "allgather",
                f"{src}: context_parallel_rotate_method default 'allgather'")
    if re.search(r"async\s*tp", f.notes, re.I) and f.tp > 1:
        rec.set("parallel", "tp_comm_overlap", True, f"{src}: AsyncTP")
    if f.pp > 1:
        if not f.vp_stated and re.search(r"interleaved", f.notes, re.I):
            rec.set("parallel", "vpp", 2, f"{src}: multi-stage schedules default to 2 "
                    "stages per rank (generate_split_points)")
        if not f.mbs_stated and f.gbs:
            local = f.gbs // f.dp
            if local % f.pp == 0:
                rec.set("train", "micro_batch_size", local // f.pp,
                        f"{src}: local batch {local} split into pipeline_parallel_"
                        f"microbatches = pp = {f.pp} microbatches")


# The README's ">= 128 GPUs" table (scripts/train/benchmarking/sweep.py, 5e85bd62d, the
# commit that added both): its model_args_list runs 13b.yaml and 30b.yaml with
# ``--attn_impl triton`` and the others with ``--attn_impl flash``.
_LARGE_SCALE = re.compile(r"large scale|>=\s*128 GPUs", re.I)
_LARGE_SCALE_TRITON = ("mpt_13b", "mpt_30b")


def llm_foundry(f: RowFacts, rec: Recipe) -> None:
    src = "llm-foundry"
    if not _LARGE_SCALE.search(f.source_detail):
        rec.set("train", "flash_attn_impl", "fa1", f"{src}: sweep.sh / submit_benchmarks.py "
                "(b2a43a147) leave --attn_impl at its default 'triton' (llm-foundry v0.3.0 "
                "flash_attn_triton.py, a FlashAttention-1 class kernel)")
    elif f.model_preset in _LARGE_SCALE_TRITON:
        rec.set("train", "flash_attn_impl", "fa1", f"{src}: sweep.py (5e85bd62d) runs "
                f"{f.model_preset.removeprefix('mpt_')}.yaml with --attn_impl triton "
                "(flash_attn_triton.py, a FlashAttention-1 class kernel)")
    else:
        rec.set("train", "flash_attn_impl", "fa2", f"{src}: sweep.py (5e85bd62d) attn_impl "
                "flash with pip .[gpu-flash2] = flash-attn 2.4.2")
    if f.precision == "fp8":
        rec.set("train", "fp8_recipe", "delayed", f"{src}: scripts/train/benchmarking/"
                "submit_benchmarks.py (b2a43a147) installs Transformer Engine v0.10 for "
                "FP8 runs, whose only FP8 recipe is DelayedScaling")
    rec.set("train", "recompute_early_stop", True,
            f"{src}: yamls/pretrain/mpt-*.yaml activation_checkpointing_reentrant: false; "
            "Composer 0.16/0.17 prepare_fsdp_module wraps each MPTBlock in "
            "checkpoint_wrapper(CheckpointImpl.NO_REENTRANT) on torch 2.1, whose early "
            "stop skips the block's down_proj GEMM and residual add in the recompute")
    pure = bool(re.search(r"\bpure\b", f.notes, re.I))
    rec.set("parallel", "grad_reduce_in_fp32", not pure,
            f"{src}: FSDP mixed_precision " + ("PURE (gradients reduced in BF16)" if pure
                                               else "DEFAULT (gradients reduced in FP32)"))
