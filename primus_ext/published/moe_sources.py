"""Recipe rules of the MoE sources that publish their own launch configuration
(``recipes.recipe_for`` calls these): the Megatron-MoE-ModelZoo benchmarking scripts, NeMo
AutoModel's benchmark configs and AMD Primus' MoE package. What the row's notes state
(dispatcher, forced balancing, the EP A2A overlap, CUDA graphs) is read from them; what
they leave unstated takes the source's documented default, each with a note.

- **Megatron-MoE-ModelZoo** (github.com/yanring/Megatron-MoE-ModelZoo @e8650517d60d):
  ``sbatch_benchmarking.sh``: ``DISPATCHER`` defaults to ``deepep`` (``--moe-token-
  dispatcher-type flex --moe-flex-dispatcher-backend deepep``; ``alltoall`` and
  ``hybridep`` on request), ``A2A_OVERLAP=1`` adds ``--delay-wgrad-compute
  --overlap-moe-expert-parallel-comm``, BF16 adds ``--tp-comm-overlap``, MXFP8 adds
  ``--fp8-param-gather``, the precision-aware optimizer with BF16 moments and
  ``--moe-router-padding-for-quantization``; ``model_configs/benchmarking/
  Qwen3-235B-A22B.yaml``: ``--moe-grouped-gemm``, ``--moe-permute-fusion``,
  ``--moe-router-fusion``, ``--moe-router-dtype fp32``, ``--moe-router-load-balancing-type
  aux_loss`` with ``--moe-aux-loss-coeff 1e-3``, ``--cross-entropy-loss-fusion`` with the
  TE implementation, no ``--grad-reduce-in-bf16`` (Megatron-LM then reduces BF16 gradients
  in FP32); the runs load the converted Qwen3 checkpoint and train on real data
  (``--finetune --load``, ``runtime.conf`` PRETRAIN 0), so unless a row says
  ``--moe-router-force-load-balancing`` (opt-in, "Add --moe-router-force-load-balancing to
  test forced load balancing", best_practice/qwen3/readme.md) the router routes the text,
  except where the repository's own launch script for the row's layout forces it
  (``best_practice/qwen3/run_h100_235b.sh``: TP 2, PP 8, VPP 4, EP 32, GBS 2048) or the
  row's notes say so (the H100 table's own launch script, ``examples/qwen3/run_235b.sh``
  @8017e1120f5d, forces it on every layout of the table). A row whose notes give its
  line's ``--no-gradient-accumulation-fusion`` (the Megatron-FSDP row) adds its weight
  gradients into ``main_grad`` by a kernel of their own.
- **NeMo AutoModel** (github.com/NVIDIA-NeMo/Automodel @e45812012456,
  ``examples/llm_benchmark/*/*_te_deepep*.yaml``; ``components/models/common/utils.py
  BackendConfig``): ``dispatcher: deepep``, ``experts: gmm`` (grouped_gemm's multi-stream
  GEMMs), ``fake_balanced_gate: true`` (``moe/layers.py FakeBalancedGate``: tokens spread
  uniformly, "noise 0.0 gives perfectly balanced assignment"); activation checkpointing
  wraps each block in torch's non-reentrant ``checkpoint_wrapper`` (``moe/parallelizer.py
  apply_ac``), whose recompute stops early (a row that does not state it is left to the
  memory ladder: the published configs differ on it); AutoModel's DeepSeek-V3 (``models/deepseek_v3/model.py``) has no
  multi-token-prediction module. The loss is ``MaskedCrossEntropy`` with
  ``fp32_upcast: false`` (``components/loss/masked_ce.py``: ``F.cross_entropy`` on the
  bf16 logits), not megatron-core's vocab-parallel loss. FSDP2 keeps the blocks gathered through the step
  (``reshard_after_forward=False``) and ``fsdp_mixin.py`` defers the gradient
  reduce-scatter and the reshard to the last microbatch: one gather and one
  reduce-scatter per step with or without a pipeline. With a pipeline each
  gradient-accumulation step runs its own schedule (``recipes/llm/benchmark.py``: one
  ``schedule.step`` per step of the loop, over LBS / pp_microbatch_size microbatches).
- **AMD Primus MoE package** (github.com/AMD-AGI/Primus @3aaf2d5fb41e,
  ``examples/moe_package``): the baseline configs set ``moe_permute_fusion: false``,
  ``moe_use_legacy_grouped_gemm: true`` (grouped_gemm's multi-stream GEMMs, costed as
  Transformer Engine's), ``gradient_accumulation_fusion: false`` (the weight gradients added into
  ``main_grad`` by a kernel of their own, compute/ops.py ``linear``),
  ``moe_router_force_load_balancing: true``; the run scripts export
  ``GPU_MAX_HW_QUEUES=2`` (two HIP hardware queues per device: the grouped GEMM's four
  streams run two at a time); the run scripts' features (``MoE_Features``)
  3 = TE cross-entropy fusion, 4 = Primus-Turbo DeepEP (``--use_turbo_deepep``, flex-style
  dispatch, ``--moe_router_dtype fp32``), 5 = sync-free MoE stage 1 (router and
  permutation fusion); the row's notes name the features of its bar.
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from primus_ext.published.recipes import Recipe, RowFacts

ZOO = "Megatron-MoE-ModelZoo@e8650517d60d"
AUTOMODEL = "NeMo AutoModel@e45812012456"
PRIMUS_MOE = "AMD Primus@3aaf2d5fb41e examples/moe_package"

_A2A = re.compile(r"all-to-all dispatcher|\(table: A2A\)", re.I)
_HYBRIDEP = re.compile(r"\bHybridEP\b", re.I)
_FORCED = re.compile(r"forced load balancing", re.I)
_A2A_OVERLAP = re.compile(r"\+1f1b overlap|A2A_OVERLAP=1", re.I)
_NO_GAF = re.compile(r"--no-gradient-accumulation-fusion")
_GRAPHS = re.compile(r"CUDA graphs \(([^)]*)\)", re.I)
_MXFP8 = re.compile(r"\bMXFP8\b", re.I)
_LBS = re.compile(r"\bLBS (\d+)\b")
_PP_MBS = re.compile(r"\bpp_microbatch_size (\d+)\b")


# The repository's launch scripts by the layout they run (gpu, tp, pp, vpp, ep, mbs,
# gbs): a row of that layout is that recipe (as published/recipes.py PRIMUS_CONFIGS).
_ZOO_SCRIPTS = {
    ("H100", 2, 8, 4, 32, 1, 2048): "best_practice/qwen3/run_h100_235b.sh",
}


def modelzoo(f: RowFacts, rec: Recipe) -> None:
    src = ZOO
    if _A2A.search(f.notes):
        rec.set("parallel", "moe_token_dispatcher_type", "alltoall",
                f"{src}: the row's dispatcher (A2A)")
    else:
        backend = "hybridep" if _HYBRIDEP.search(f.notes) else "deepep"
        rec.set("parallel", "moe_token_dispatcher_type", "flex",
                f"{src} sbatch_benchmarking.sh: DISPATCHER={backend}")
        rec.set("parallel", "moe_flex_dispatcher_backend", backend,
                f"{src} sbatch_benchmarking.sh: DISPATCHER={backend}")
        if backend == "hybridep":
            rec.set("parallel", "moe_flex_num_sms", 32, f"{src} sbatch_benchmarking.sh: "
                    "DISPATCHER=hybridep adds --moe-hybridep-num-sms 32")
    yaml = f"{src} model_configs/benchmarking yaml"
    rec.set("parallel", "moe_router_fusion", True, f"{yaml}: --moe-router-fusion")
    rec.set("parallel", "moe_permute_fusion", True, f"{yaml}: --moe-permute-fusion")
    rec.set("train", "moe_router_dtype", "fp32", f"{yaml}: --moe-router-dtype fp32")
    terms = ("aux_loss",) + (("padding",) if _MXFP8.search(f.notes) else ())
    rec.set("parallel", "moe_router_terms", terms,
            f"{yaml}: --moe-aux-loss-coeff 1e-3" + ("; sbatch_benchmarking.sh MXFP8: "
                                                    "--moe-router-padding-for-quantization"
                                                    if len(terms) > 1 else ""))
    rec.set("train", "cross_entropy_loss_fusion", True, f"{yaml}: --cross-entropy-loss-fusion")
    rec.set("train", "cross_entropy_fusion_impl", "te", f"{yaml}: --cross-entropy-fusion-impl te")
    rec.set("parallel", "grad_reduce_in_fp32", True, f"{yaml}: no --grad-reduce-in-bf16 "
            "(Megatron-LM accumulates and reduces BF16 gradients in FP32)")
    rec.notes.append(f"moe_routing_data='real' ({src} runtime_configs/benchmarking/"
                     "runtime.conf: DATASET CustomDataset, text)")
    script = _ZOO_SCRIPTS.get((f.gpu.upper(), f.tp, f.pp, f.vpp, f.ep, f.mbs, f.gbs))
    forced = bool(_FORCED.search(f.notes))
    if forced:
        why = "the row's --moe-router-force-load-balancing"
    elif script:
        forced, why = True, (f"{script}, the repository's command for this layout: "
                             "--moe-router-force-load-balancing")
    else:
        why = "not forced (opt-in): the router routes the text"
    rec.set("train", "moe_router_force_load_balancing", forced, f"{src}: {why}")
    if _NO_GAF.search(f.notes):
        rec.set("train", "gradient_accumulation_fusion", False,
                f"{src}: the row's --no-gradient-accumulation-fusion")
    if _A2A_OVERLAP.search(f.notes):
        rec.set("parallel", "overlap_moe_expert_parallel_comm", True,
                f"{src} sbatch_benchmarking.sh: A2A_OVERLAP=1")
    graphs = _GRAPHS.search(f.notes)
    if graphs:
        scope = tuple(s.strip() for s in graphs.group(1).split(","))
        rec.set("train", "cuda_graph_scope", scope, f"{src}: the row's --cuda-graph-scope")
    if f.precision == "bf16" and f.tp > 1:
        rec.set("parallel", "tp_comm_overlap", True,
                f"{src} sbatch_benchmarking.sh: BF16 adds --tp-comm-overlap")
    if _MXFP8.search(f.notes):
        mx = f"{src} sbatch_benchmarking.sh PR=mxfp8"
        rec.set("train", "fp8_param_gather", True, f"{mx}: --fp8-param-gather")
        rec.set("train", "use_precision_aware_optimizer", True,
                f"{mx}: --use-precision-aware-optimizer")
        rec.set("train", "exp_avg_dtype", "bf16", f"{mx}: --exp-avg-dtype bf16")
        rec.set("train", "exp_avg_sq_dtype", "bf16", f"{mx}: --exp-avg-sq-dtype bf16")


def automodel(f: RowFacts, rec: Recipe) -> None:
    src = f"{AUTOMODEL} examples/llm_benchmark *_te_deepep*.yaml BackendConfig"
    rec.set("parallel", "moe_token_dispatcher_type", "flex", f"{src}: dispatcher deepep")
    rec.set("parallel", "moe_flex_dispatcher_backend", "deepep", f"{src}: dispatcher deepep")
    rec.set("train", "moe_router_exact_balance", True,
            f"{src}: fake_balanced_gate true (FakeBalancedGate, noise 0: every expert "
            "the same number of tokens)")
    rec.set("train", "moe_routing_data", "mock",
            f"{src}: MockIterableDataset (random token ids)")
    rec.set("train", "recompute_early_stop", True,
            f"{AUTOMODEL} moe/parallelizer.py apply_ac: torch checkpoint_wrapper "
            "(non-reentrant) per block")
    rec.set("train", "master_weights", False,
            f"{AUTOMODEL} _transformers/auto_model.py from_config: torch_dtype 'auto' -> "
            "torch.bfloat16 (the benchmark configs set none), the model built in bf16 and "
            "stepped by torch.optim.Adam, whose moments take the parameters' dtype")
    rec.set("train", "loss_impl", "torch",
            f"{AUTOMODEL} examples/llm_benchmark *_te_deepep*.yaml loss_fn: "
            "MaskedCrossEntropy fp32_upcast false (components/loss/masked_ce.py: "
            "F.cross_entropy on the bf16 logits)")
    if (f.model_preset or "").startswith("gpt_oss"):
        rec.set("model", "activation_func_clamp_value", None,
                f"{AUTOMODEL} components/moe/experts.py quick_geglu_deepep / "
                "swiglu_oai_deepep: torch.compile(fullgraph=True), the clamps fused into "
                "the activation's kernel")
    if f.model_preset == "deepseek_v3":
        rec.set("model", "mtp_num_layers", 0,
                f"{AUTOMODEL} models/deepseek_v3/model.py: no MTP module")
    lbs, pp_mbs = _LBS.search(f.notes), _PP_MBS.search(f.notes)
    if f.pp > 1 and lbs and pp_mbs and int(lbs.group(1)) % int(pp_mbs.group(1)) == 0:
        rec.set("train", "microbatches_per_schedule",
                int(lbs.group(1)) // int(pp_mbs.group(1)),
                f"{AUTOMODEL} recipes/llm/benchmark.py: one pipeline schedule.step per "
                "gradient-accumulation step over local_batch_size / pp_microbatch_size "
                "microbatches (the row's LBS and pp_microbatch_size)")
    if f.sharding.startswith("fsdp") and f.pp == 1:
        # As under a pipeline (published/reader.py): the blocks stay gathered from the
        # first forward to the last backward and their gradients are reduce-scattered
        # once, so the step moves one gather and one reduce-scatter, as the distributed
        # optimizer does, with FSDP2's unsharded gradients made in the backward.
        why = (f"{AUTOMODEL} moe/parallelizer.py parallelize_model / apply_fsdp: "
               "reshard_after_forward=False; moe/fsdp_mixin.py prepare_for_grad_"
               "accumulation (enable_fsdp_optimizations true in the benchmark configs): "
               "set_requires_gradient_sync(False) and set_reshard_after_backward(False) "
               "until the last microbatch")
        rec.set("parallel", "fsdp", False, why)
        rec.set("parallel", "use_distributed_optimizer", True, why)
        rec.set("parallel", "grad_buffer", "on_backward", why)


_FEATURES_DEEPEP = re.compile(r"Primus-Turbo DeepEP", re.I)
_FEATURES_SYNC_FREE = re.compile(r"sync-free MoE", re.I)
_FEATURES_LOSS = re.compile(r"cross-entropy loss fusion", re.I)


def primus_moe_package(f: RowFacts, rec: Recipe) -> None:
    cfg = f"{PRIMUS_MOE}/configs/MI355X/*-pretrain-baseline.yaml"
    rec.set("train", "moe_router_force_load_balancing", True,
            f"{cfg}: moe_router_force_load_balancing true")
    rec.set("parallel", "moe_permute_fusion", False, f"{cfg}: moe_permute_fusion false")
    rec.set("train", "gradient_accumulation_fusion", False,
            f"{cfg}: gradient_accumulation_fusion false")
    rec.set("parallel", "moe_shared_expert_overlap", False,
            f"{PRIMUS_MOE}: the baseline sets no shared-expert overlap")
    rec.set("train", "device_hw_queues", 2,
            f"{PRIMUS_MOE}/run_deepseek_v2*_pretrain_mi355x.sh: export "
            "GPU_MAX_HW_QUEUES=${GPU_MAX_HW_QUEUES:-2} (HIP hardware queues per device)")
    run = f"{PRIMUS_MOE}/run_deepseek_v2*_pretrain_mi355x.sh MoE_Features"
    if _FEATURES_LOSS.search(f.notes):
        rec.set("train", "cross_entropy_loss_fusion", True, f"{run} 3")
        rec.set("train", "cross_entropy_fusion_impl", "te", f"{run} 3")
    if _FEATURES_DEEPEP.search(f.notes):
        rec.set("parallel", "moe_token_dispatcher_type", "flex",
                f"{run} 4: --use_turbo_deepep (Primus-Turbo DeepEP)")
        rec.set("parallel", "moe_flex_dispatcher_backend", "deepep", f"{run} 4")
        rec.set("train", "moe_router_dtype", "fp32", f"{run} 4: --moe_router_dtype fp32")
    if _FEATURES_SYNC_FREE.search(f.notes):
        rec.set("parallel", "moe_permute_fusion", True,
                f"{run} 5: --turbo_sync_free_moe_stage 1 (router and permutation fusion)")
        rec.set("parallel", "moe_router_fusion", True, f"{run} 5")
