"""What a published run's source documents about its recipe beyond the CSV columns.

The reader (``published/reader.py``) fills a row's gaps with these rules before it builds the
RunSpec. Each rule is a documented fact about the software recipe a *source* used
(a framework's performance recipes, a paper's stated schedule, a benchmark's default
configuration), never a fitted number and never keyed to a single row; every rule that
fires writes a note into the row's ``notes``. A column the row does fill always wins.

Sources and what they document (citations are the public files read; the rules of the
Llama 3 paper, torchtitan and llm-foundry, which document their own stack, are in
``published/own_stack.py``):

- **NVIDIA performance tables** (NeMo performance summary 24.07, NeMo Framework 25.02 /
  25.04, Megatron-Bridge 25.09+): the tables are produced with the frameworks'
  *performance* recipes, which
  - turn on TP communication overlap (userbuffers) whenever TP > 1: NeMo 1 launcher
    ``conf/training/*/..._performance.yaml`` ``ub_tp_comm_overlap: True``; NeMo 2.0
    ``scripts/performance`` ``MegatronCommOverlapCallback(tp_comm_overlap=True)``;
    Megatron-Bridge ``scripts/performance/configs`` ``CommOverlapConfig(tp_comm_overlap=
    tp > 1)`` / ``tp_comm_overlap_cfg=userbuffers_*``;
  - reduce gradients in BF16: NeMo 1 ``optim.grad_sync_dtype: bf16``; NeMo 2.0 FP8
    ``plugins.grad_reduce_in_fp32 = False``; Megatron-Bridge ``set_*_common_configs``
    ``ddp.grad_reduce_in_fp32 = False``;
  - (NeMo 2.0 and Megatron-Bridge) fuse the cross-entropy: ``cross_entropy_loss_fusion =
    True`` in NeMo 2.0's ``GPTConfig`` and Megatron-Bridge's GPT model providers;
  - (NeMo 2.0 and Megatron-Bridge) set the data-parallel overlap when dp > 1: DDP
    buckets of ``128 * 1024 * 1024`` parameters and, with pp > 1 and vpp > 1,
    ``align_param_gather = True`` (NeMo v2.2.0 / v2.3.0
    ``nemo/lightning/pytorch/callbacks/megatron_comm_overlap.py``
    ``_get_optimizer_overlap_cfgs``, which every ``scripts/llm/performance`` recipe
    requires; Megatron-Bridge ``src/megatron/bridge/training/comm_overlap.py``; both leave
    ``overlap_param_gather_with_optimizer_step`` off, "disabled due to an issue with
    checkpointing");
  - (NeMo 24.07, NeMo 1) step with Apex's DistributedFusedAdam, in the state dtype and
    with the activation recompute of each model's launcher yaml at tag 24.07
    (``published/nemo_launcher.py``: Nemotron-4 340B bf16 state and selective, core
    attention only; the others fp32 state and none);
  - use no activation recompute for pre-training unless the recipe names modules: NeMo
    2.0 ``recommended_model_configs/model_configs_{h100,b200,gb200}.csv`` have
    ``recompute_layers = 0`` for every pre-training row; Megatron-Bridge Llama 3 / 3.1 and
    Qwen3 configs set ``recompute_granularity = None``; DeepSeek-V3 uses selective
    recompute of ``mla_up_proj`` (+ ``mlp`` on H100) (``configs/deepseek``);
  - DeepSeek-V3 (Megatron-Bridge ``deepseek_llm_pretrain.py``): on H100 the flex
    dispatcher with DeepEP (``enable_deepep=True``) and ``set_moe_a2a_overlap_overrides``
    (``overlap_moe_expert_parallel_comm=True``), layout ``Et|(tt|)*30mL``, no overlapped
    grad reduce; on B200 / GB200 the all-to-all dispatcher with the recipe's layout map
    (``[E + 4 layers] + [4 layers] * 14 + [1 layer + loss]``); ``moe_router_force_load_
    balancing`` (balanced routing, as the projector assumes).
  - Megatron-Bridge fuses the cross entropy with TE's kernel
    (``cross_entropy_fusion_impl: "te"`` in every 0.1.0 ``scripts/performance``
    config; ``_benchmark_common(cross_entropy_impl="te")`` now), and its 25.09 tables ran
    the ``perf_matrix`` memory settings of ``published/perf_matrix.py`` (Megatron-FSDP
    Llama 3 70B / 405B on GB200: CPU activation offloading of 40 / 95 layers);
  - NeMo 2.0 MoE recipes with the all-to-all dispatcher overlap the shared experts
    (``moe_shared_expert_overlap = True``; Mixtral has none, so it changes nothing there).
- **Llama 3 paper** (arXiv 2407.21783, Sec. 3.3.2): an interleaved schedule with V stages
  per pipeline rank, one Transformer layer removed from the first and from the last stage
  so that "the first model chunk on the first stage has only the embedding, and the last
  model chunk on the last stage has only output projection and loss". V is not printed;
  the smallest V > 1 for which the remaining ``pp * V - 2`` chunks hold the same number of
  layers is taken (126 layers, PP 16: V = 8, one layer per chunk). Gradients are
  reduce-scattered in FP32 (same section), the default here. "With these optimizations,
  we could pretrain Llama 3 on sequences of 8K tokens without activation checkpointing":
  no recompute where a rank holds at most 8K tokens (seq / cp).
- **torchtitan benchmarks** (``benchmarks/llama3_h100_202412_torchtitan.md`` at 9dec370):
  ``pipeline_parallel_microbatches`` defaults to the PP degree
  (``parallelisms/pipeline_llama.py``), so the local batch is split into PP microbatches;
  multi-stage schedules (Interleaved 1F1B) default to 2 stages per rank
  (``generate_split_points``); attention is ``F.scaled_dot_product_attention`` whose
  flash backend is FlashAttention-2 (context parallelism supports only the flash and
  efficient backends); context parallelism exchanges K/V with
  ``context_parallel_rotate_method = "allgather"``; AsyncTP overlaps the TP collectives
  with the GEMMs; without torch.compile the model runs eager (norms, RoPE and SwiGLU as
  chains of single-op kernels). Its activation checkpointing, compile, float8 and AsyncTP
  are read as a torchtitan run (``published/torchtitan.py``: framework=torchtitan).
- **AMD Primus** (``PRIMUS_CONFIGS``): the recompute setting of the Primus example
  config a row reproduces (same GPU, model, layout and micro batch; Primus at the commit
  the rows cite). The MI355X Mixtral 8x22B config sets ``recompute_method: block`` with
  ``recompute_num_layers: 0``: no layer is recomputed, and neither it nor its bases
  (``primus/configs/modules/megatron/trainer_base.yaml``, ``primus_pipeline.yaml``,
  ``primus_turbo.yaml``) turn on any other memory saving (no CPU or fine-grained
  offloading, no precision-aware optimizer, no Primus pipeline offload); Primus' own
  memory projection of that config (``docs_deprecated/tech_blogs/projection/
  projection.md``) is 582.8 GB per GPU, over the MI355X's 288 GB as well. The base
  config's ``grad_reduce_in_bf16: false`` makes Megatron-LM accumulate and reduce
  gradients in fp32 for every Primus bf16 / fp8 run.
  Its ``align_param_gather: true`` (Megatron-LM's own default since core_r0.9.0) makes
  the interleaved schedule dispatch each model chunk's parameter all-gathers ahead of it.
- **Megatron-LM's README tables** (core_r0.8.0): gradients accumulate and reduce in FP32,
  which that release forces for every bf16 run (``megatron/training/arguments.py``:
  ``if args.bf16: ... args.accumulate_allreduce_grads_in_fp32 = True``; no flag turns it
  off).
- **Rows whose notes say PP communication overlap was on** and give no ``vp``: the
  interleaved schedule (megatron-core overlaps pipeline p2p only with virtual stages),
  with the smallest number of virtual stages the layers per stage divide into.
- **Megatron runs that leave a setting unstated** (Megatron-LM's README tables, AMD
  Primus, and the NVIDIA tables for what their own rules above do not set): the current
  Megatron-Bridge performance recipes' values, not Megatron-LM's flag defaults
  (``_current_recipe_gaps``; github.com/NVIDIA-NeMo/Megatron-Bridge @067f987
  ``src/megatron/bridge/perf_recipes/_common.py`` ``_benchmark_common``:
  ``ddp.grad_reduce_in_fp32 = False``; per-model files such as
  ``perf_recipes/llama/h100/llama3.py``: ``tp_comm_overlap_cfg = userbuffers_*`` whenever
  TP > 1; ``_perf_precision("fp8_cs")``: FP8 current (tensorwise) scaling). Sources with
  their own documented stack (the Llama 3 paper, torchtitan, llm-foundry) state these
  themselves and are not filled from Megatron recipes.
- **llm-foundry MPT benchmarks** (``scripts/train/benchmarking``): the ">= 128 GPUs"
  table (``sweep.py`` at 5e85bd62d) runs ``attn_impl: flash`` from ``pip .[gpu-flash2]``,
  flash-attn 2.4.2 (FA2; its 13B / 30B runs use ``triton``, not modelled per model); the
  other tables come from ``sweep.sh`` at b2a43a147, which never passes ``--attn_impl``,
  so ``submit_benchmarks.py``'s default ``triton`` runs: llm-foundry v0.3.0's
  ``flash_attn_triton.py``, a FlashAttention-1 class kernel (``flash_attn_impl='fa1'``).
  The benchmark tables run FSDP with mixed precision
  ``DEFAULT`` (gradients reduced in FP32) unless the row says ``PURE`` (BF16 reduce).
  Activation checkpointing is torch's non-reentrant checkpoint of each ``MPTBlock``
  (``activation_checkpointing_reentrant: false`` in every ``yamls/pretrain/mpt-*.yaml``;
  Composer ``composer/trainer/dist_strategy.py`` ``prepare_fsdp_module``:
  ``checkpoint_wrapper(m, checkpoint_impl=CheckpointImpl.NO_REENTRANT)``), whose early
  stop does not re-run the block's last GEMM and residual add.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from primus_ext.presets import recipe_defaults
from primus_ext.published import moe_sources, own_stack
from primus_ext.published.bridge_moe import bridge_moe
from primus_ext.published.nemo_launcher import nemo_launcher_2407
from primus_ext.published.perf_matrix import (BRIDGE_0_1, perf_matrix_cuda_graphs,
                                              perf_matrix_memory)

NVIDIA_PERF_SOURCES = ("NeMo-perf-summary", "NeMo-FW-perf-summary", "MegatronBridge-perf")


@dataclass
class Recipe:
    """Overrides for ParallelSpec / TrainSpec keyword arguments, and their notes."""
    parallel: dict = field(default_factory=dict)
    train: dict = field(default_factory=dict)
    model: dict = field(default_factory=dict)  # ModelSpec fields (token dropping, MTP)
    notes: list = field(default_factory=list)
    sets_recompute: bool = False  # the recipe states the recompute setting
    # The run's own source states its recompute (not a recipe family's default): the
    # reader keeps it even where the memory model says the run does not fit.
    recompute_from_source: bool = False

    def set(self, where: str, key: str, value, note: str) -> None:
        getattr(self, where)[key] = value
        self.notes.append(f"{key}={value!r} ({note})")


@dataclass(frozen=True)
class RowFacts:
    """What the rules read from a row (the reader fills it)."""
    source: str
    model_preset: str | None
    gpu: str
    notes: str
    num_layers: int
    is_moe: bool
    tp: int
    pp: int
    cp: int
    dp: int
    vpp: int
    vp_stated: bool  # the row's vp column is filled
    mbs_stated: bool
    mbs: int | None
    ep: int
    gbs: int | None
    seq: int
    recompute_stated: bool
    precision: str = ""  # the row's precision cell, lower case
    sharding: str = ""  # the row's fsdp_or_zero cell, lower case
    source_detail: str = ""  # the row's source_detail cell (which table of the source)


# Sources whose TFLOP/s (and MFU) count core attention over the whole sequence:
# Megatron-LM's README tables were produced by core_r0.8.0, whose
# num_floating_point_operations (megatron/training/training.py) has the term
# ``seq_length / hidden_size`` with no halving for the causal mask (later releases halve
# it). The measured tokens/s of their rows are recovered with that formula.
README_SOURCE = "Megatron-LM-README"
FULL_ATTENTION_FLOP_SOURCES = (README_SOURCE,)


def attention_flops_halved(source: str) -> bool:
    """Whether the source's published FLOP figures halve core attention (causal mask)."""
    return not source.startswith(FULL_ATTENTION_FLOP_SOURCES)


def recipe_for(f: RowFacts) -> Recipe:
    rec = Recipe()
    if f.source.startswith("Llama3-paper"):
        own_stack.llama3_paper(f, rec)
    elif f.source.startswith("torchtitan"):
        own_stack.torchtitan(f, rec)
    elif f.source.startswith("llm-foundry"):
        own_stack.llm_foundry(f, rec)
    else:  # Megatron-family runs: the source's rules, then the current recipes' gaps
        if f.source.startswith(NVIDIA_PERF_SOURCES):
            _nvidia_perf(f, rec)
        elif f.source.startswith(README_SOURCE):
            rec.set("parallel", "grad_reduce_in_fp32", True, "core_r0.8.0 megatron/training/"
                    "arguments.py: bf16 forces accumulate_allreduce_grads_in_fp32")
        elif f.source.startswith("AMD-Primus"):
            _amd_primus(f, rec)
            if f.source.startswith("AMD-Primus-moe-package"):
                moe_sources.primus_moe_package(f, rec)
        elif f.source.startswith("Megatron-MoE-ModelZoo"):
            moe_sources.modelzoo(f, rec)
        elif f.source.startswith("NeMo-Automodel"):
            moe_sources.automodel(f, rec)
        _current_recipe_gaps(f, rec)
    return rec




# A row whose notes say pipeline communication overlap was on ("DP/TP/PP comm overlap
# on") ran the interleaved schedule: megatron-core overlaps PP p2p only with virtual
# stages (core_r0.8.0 megatron/training/arguments.py sets overlap_p2p_comm False, with a
# warning, when there are none).
_PP_OVERLAP_NOTE = re.compile(r"\bPP\b\s+comm(?:unication)?\s+overlap\s+on", re.I)


def _current_recipe_gaps(f: RowFacts, rec: Recipe) -> None:
    """Settings a row and its source leave unstated take the values of the current
    performance recipes, not Megatron-LM's flag defaults."""
    if "grad_reduce_in_fp32" not in rec.parallel:
        rec.set("parallel", "grad_reduce_in_fp32", recipe_defaults.grad_reduce_in_fp32(),
                f"not stated; {recipe_defaults.GRAD_REDUCE_NOTE}")
    if _PP_OVERLAP_NOTE.search(f.notes) and f.pp > 1 and not f.vp_stated:
        per_stage = f.num_layers // f.pp
        vp = next((v for v in range(2, per_stage + 1) if per_stage % v == 0), None)
        if f.num_layers % f.pp == 0 and vp:
            rec.set("parallel", "vpp", vp, "not stated; the row's PP communication "
                    "overlap runs only under the interleaved schedule (core_r0.8.0 "
                    "megatron/training/arguments.py turns overlap_p2p_comm off without "
                    "virtual stages): the smallest interleaving the layers divide into")
    if f.tp > 1 and "tp_comm_overlap" not in rec.parallel:
        rec.set("parallel", "tp_comm_overlap", True,
                f"not stated; {recipe_defaults.TP_OVERLAP_NOTE}")


def _nvidia_perf(f: RowFacts, rec: Recipe) -> None:
    src = "NVIDIA performance recipe"
    if f.tp > 1:
        rec.set("parallel", "tp_comm_overlap", True,
                f"{src}: TP communication overlap on whenever TP > 1")
    rec.set("parallel", "grad_reduce_in_fp32", False,
            f"{src}: gradients reduced in BF16")
    if f.source.startswith("NeMo-perf-summary-24.07"):
        nemo_launcher_2407(f, rec)  # published/nemo_launcher.py: the NeMo 1 recipes
    if f.source.startswith("NeMo-perf-summary") and f.precision == "fp8":
        rec.set("train", "fp8_recipe", "delayed", f"{src}: NeMo 24.07 runs Transformer "
                "Engine 1.x, whose only FP8 recipe is DelayedScaling (Float8Current"
                "Scaling first ships in Transformer Engine 2)")
    if not f.source.startswith("NeMo-perf-summary"):
        rec.set("train", "cross_entropy_loss_fusion", True,
                f"{src}: NeMo 2.0 GPTConfig / Megatron-Bridge GPT providers default")
        if f.dp > 1:
            _dp_overlap(f, rec)
    if f.source.startswith("MegatronBridge"):
        rec.set("train", "cross_entropy_fusion_impl", "te",
                f"{BRIDGE_0_1} configs/*_llm_pretrain.yaml: cross_entropy_fusion_impl te; "
                "perf_recipes/_common.py _benchmark_common(cross_entropy_impl='te')")
        if f.source.startswith("MegatronBridge-perf-25.09"):
            perf_matrix_memory(f, rec)  # the recipe's own memory saving, when listed
            perf_matrix_cuda_graphs(f, rec)
    dsv3 = f.model_preset == "deepseek_v3"
    if not f.recompute_stated and not rec.recompute_from_source and not rec.sets_recompute:
        rec.sets_recompute = True
        if dsv3 and f.source.startswith("MegatronBridge"):
            mods = ("mla_up_proj", "mlp") if f.gpu.upper() == "H100" else ("mla_up_proj",)
            rec.set("train", "recompute_granularity", "selective",
                    f"{src}: DeepSeek-V3 selective recompute")
            rec.set("train", "recompute_modules", mods,
                    f"{src}: configs/deepseek recompute_modules")
        else:
            rec.notes.append(f"recompute: none ({src}: no recompute for pre-training "
                             "(recompute_layers=0 / recompute_granularity=None))")
    if dsv3 and f.source.startswith("MegatronBridge"):
        _dsv3_bridge(f, rec)
    if f.is_moe and f.source.startswith("MegatronBridge"):
        bridge_moe(f, rec)  # published/bridge_moe.py: the release's MoE settings
    if f.is_moe:
        rec.set("train", "moe_routing_data", "mock",
                f"{src}: mock data (Megatron-Bridge scripts/performance argument_parser.py "
                "--data default 'mock', perf_recipes mock=True; NeMo 2.0 llm recipes' "
                "MockDataModule): random token ids")
    elif f.is_moe and f.source.startswith("NeMo-FW"):
        rec.set("parallel", "moe_shared_expert_overlap", True,
                f"{src}: NeMo 2.0 all-to-all dispatcher with shared-expert overlap")


def _dp_overlap(f: RowFacts, rec: Recipe) -> None:
    """NeMo 2.0 MegatronCommOverlapCallback / Megatron-Bridge CommOverlapConfig
    ``_get_optimizer_overlap_cfgs`` for dp > 1."""
    src = ("NeMo 2.0 MegatronCommOverlapCallback / Megatron-Bridge CommOverlapConfig "
           "_get_optimizer_overlap_cfgs (dp > 1)")
    rec.set("parallel", "ddp_bucket_params", 128 * 1024 * 1024, f"{src}: bucket_size")
    if f.pp > 1 and f.vpp > 1:
        rec.set("parallel", "align_param_gather", True, f"{src}: pp > 1 and vp > 1")


def _dsv3_bridge(f: RowFacts, rec: Recipe) -> None:
    src = "Megatron-Bridge DeepSeek-V3 performance config"
    pp = f.pp
    if f.gpu.upper() == "H100":
        rec.set("parallel", "moe_token_dispatcher_type", "flex", f"{src}: DeepEP on H100")
        rec.set("parallel", "overlap_moe_expert_parallel_comm", True,
                f"{src}: set_moe_a2a_overlap_overrides")
        rec.set("parallel", "overlap_grad_reduce", False,
                f"{src}: overlap_grad_reduce disabled on H100")
    # By the number of virtual stages: 32 chunks Et|(tt|)*30mL (the H100 recipe; the
    # layout Megatron-LM's DeepSeek-V3 GB200 guide gives for PP 8 VPP 4,
    # docs/discussions/deepseek-v3-gb200-optimization), 16 chunks [E+4] + [4]*14 + [1+L]
    # (Megatron-Bridge recipes/deepseek/deepseek_v3.py layout_map for (16, 1), (8, 2),
    # (4, 4)).
    layout = {32: (1,) + (2,) * 30 + (0,), 16: (4,) * 15 + (1,)}.get(f.pp * f.vpp, ())
    if f.num_layers == sum(layout) and len(layout) == f.pp * f.vpp:
        vp = f.vpp
        rec.set("parallel", "pipeline_layout", layout, f"{src}: pipeline layout for "
                f"pp={pp}, vp={vp} (MTP and loss on the last virtual stage)")


# AMD Primus example configs (github.com/AMD-AGI/Primus @fd1eeabb, the commit the rows
# cite): (gpu, model preset) -> (file, recompute_num_layers under recompute_method=block,
# and the tp, pp, ep, micro_batch_size the file sets). A row takes the file's recompute
# only when its stated layout and micro batch are the file's (the same recipe).
PRIMUS_CONFIGS = {
    ("MI355X", "mixtral_8x22b"): (
        "examples/megatron/configs/MI355X/mixtral_8x22B_v0.1-BF16-pretrain.yaml", 0,
        (1, 4, 8, 2)),
    ("MI325X", "llama3.1_70b"): (
        "examples/megatron/configs/MI325X/llama3.1_70B-BF16-pretrain.yaml", 72,
        (1, 1, 1, 3)),
}


def _amd_primus(f: RowFacts, rec: Recipe) -> None:
    # Primus' Megatron base config states bf16 with grad_reduce_in_bf16 false and
    # accumulate_allreduce_grads_in_fp32 false; Megatron-LM's validate_args
    # (megatron/training/arguments.py) then turns accumulate_allreduce_grads_in_fp32 on
    # for bf16 ("accumulate and all-reduce gradients in fp32 for bfloat16 data type").
    rec.set("parallel", "grad_reduce_in_fp32", True, "AMD Primus primus/configs/modules/"
            "megatron/trainer_base.yaml: grad_reduce_in_bf16 false; Megatron-LM "
            "validate_args then accumulates and reduces gradients in fp32")
    if f.pp > 1 and f.vpp > 1:
        rec.set("parallel", "align_param_gather", True, "AMD Primus primus/configs/"
                "modules/megatron/trainer_base.yaml: align_param_gather true (Megatron-LM's "
                "default since core_r0.9.0, --no-align-param-gather)")
    if f.is_moe:
        rec.set("train", "moe_routing_data", "mock", "AMD Primus example configs "
                "(examples/megatron/configs/*, examples/moe_package/configs/*): mock_data "
                "true: random token ids")
    found = PRIMUS_CONFIGS.get((f.gpu.upper(), f.model_preset or ""))
    if found is None or f.recompute_stated:
        return
    path, layers, (tp, pp, ep, mbs) = found
    if (f.tp, f.pp, f.ep, f.mbs) != (tp, pp, ep, mbs):
        return
    rec.sets_recompute = rec.recompute_from_source = True  # the run's own config
    src = f"AMD Primus {path}"
    if layers == 0:
        rec.notes.append(f"recompute: none ({src}: recompute_granularity full, "
                         "recompute_method block, recompute_num_layers 0: no layer "
                         "recomputed)")
        return
    rec.set("train", "recompute_granularity", "full", src)
    rec.set("train", "recompute_method", "block", src)
    rec.set("train", "recompute_num_layers", layers, src)
