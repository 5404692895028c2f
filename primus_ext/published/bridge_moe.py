"""The MoE settings of Megatron-Bridge's performance recipes, per table release (pure data
plus one rule).

Each MegatronBridge-perf table was produced by that release's performance scripts
(github.com/NVIDIA-NeMo/Megatron-Bridge):

- **25.09**: ``scripts/performance`` at v0.1.0rc4 (6725f7049504). ``run_script.py``: Qwen3
  30B-A3B and 235B-A22B run ``apply_moe_token_drop`` (training/utils/moe_token_drop.py:
  ``moe_expert_capacity_factor = 1.0``, ``moe_pad_expert_input_to_capacity = True``) with
  the all-to-all dispatcher; DeepSeek-V3 on H100 runs DeepEP (``enable_deepep``,
  ``moe_router_force_load_balancing = True``) with the EP A2A overlap, on B200 / GB200
  token drop with the shared-expert overlap. Every ``configs/*_llm_pretrain.yaml``: ``moe_
  router_fusion: true``.
- **26.02.01**: ``scripts/performance/configs/<family>/*_workload_base_configs.py`` and
  ``*_llm_pretrain.py`` at cfeddcd94 (the commit that published the table), or at v0.3.0
  (the 26.02 table's scripts) where only that release holds a config of the row's layout.
- **26.06**: the same files at 63b08b397 (the commit that published the table).
- **26.08**: ``src/megatron/bridge/perf_recipes/<family>/<gpu>/*.py`` at 4ab94dfad (the
  commit that published the table): per-recipe functions; the MXFP8 GB200 recipes add the
  full-iteration CUDA graph, the EP A2A overlap with delayed weight gradients, the fused
  grouped MLP (``use_transformer_engine_op_fuser`` with ``NVTE_CUTEDSL_FUSED_GROUPED_MLP=1``)
  and, for Qwen3 and GPT-OSS, FP8 attention (``qwen/common.py``
  ``_enable_hybridep_full_iteration_mxfp8``, ``gpt_oss/common.py``
  ``_apply_gpt_oss_120b_full_iter_fp8mx_configs``, ``deepseek/common.py``
  ``_enable_deepseek_full_iteration_mxfp8``).

Common to the 26.x recipes (the tables' footnote: "we force-balance the token distribution
among experts and all benchmarks are token-dropless"): ``moe_router_force_load_balancing =
True`` and ``moe_router_fusion = True`` (``set_qwen3_common_configs``,
``set_gpt_oss_common_configs``, ``set_deepseek_v3_common_configs``); ``moe_a2a_overlap``
sets ``overlap_moe_expert_parallel_comm`` and ``delay_wgrad_compute``
(``utils/overrides.py _set_moe_a2a_overlap_overrides``); ``recompute_modules`` sets
selective recompute (``_set_recompute_overrides``); a flex backend sets the flex dispatcher
(``training/flex_dispatcher_backend.py apply_flex_dispatcher_backend``) unless the model's
``*_llm_pretrain.py`` sets ``moe_token_dispatcher_type`` itself (Qwen3 235B-A22B on H100:
``alltoall``).

A row takes the entry of its release, GPU, model, precision (``bf16``, ``fp8_cs``,
``fp8_mx``) and GPU count; a config whose layout differs from the row's is named in the
note (the row's layout columns always win). A row with no entry here takes its release's
preset as that release's scripts define it (published/bridge_presets.py, 25.11 to 26.06).
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from primus_ext.published.bridge_presets import preset_entry

BRIDGE = "github.com/NVIDIA-NeMo/Megatron-Bridge"
_MXFP8 = re.compile(r"\bprecision\s+MXFP8\b|--fp8-recipe\s+mxfp8", re.I)


def precision_kind(precision: str, notes: str) -> str:
    """bf16, fp8_cs or fp8_mx (the 26.x tables print MXFP8 apart from FP8)."""
    if precision != "fp8":
        return precision
    return "fp8_mx" if _MXFP8.search(notes) else "fp8_cs"


@dataclass(frozen=True)
class MoeEntry:
    path: str  # file(s) and config read, at the release's commit
    dispatcher: str = "alltoall"
    backend: str | None = None  # flex backend
    a2a_overlap: bool = False
    graphs: tuple[str, ...] = ()
    recompute: tuple[str, ...] | None = None  # selective modules; () = none
    token_drop: bool = False
    force_balance: bool = True
    shared_expert_overlap: bool = False
    fused_grouped_mlp: bool = False
    fp8_attention: bool = False
    tp_comm_overlap: bool | None = None  # the pretrain function's CommOverlapConfig
    layout: str = ""  # the config's layout when it differs from the row's


_QWEN_2509 = MoeEntry("v0.1.0rc4 scripts/performance/run_script.py (qwen3: "
                      "apply_moe_token_drop)", token_drop=True, force_balance=False)
_CFG_0302 = "cfeddcd94 scripts/performance/configs"
_RECIPES_2608 = "4ab94dfad src/megatron/bridge/perf_recipes"
_FULL_ITER = ("full_iteration",)
_TE_GRAPHS = ("attn", "moe_router", "moe_preprocess")

# (release, gpu, model preset, precision kind, GPUs); gpu "*" = any.
ENTRIES = {
    ("25.09", "*", "qwen3_30b_a3b", "*", 0): _QWEN_2509,
    ("25.09", "*", "qwen3_235b_a22b", "*", 0): _QWEN_2509,
    ("25.09", "H100", "deepseek_v3", "*", 0): MoeEntry(
        "v0.1.0rc4 scripts/performance/run_script.py (deepseek v3, h100: enable_deepep, "
        "A2A_1F1B)", dispatcher="flex", backend="deepep", a2a_overlap=True),
    ("25.09", "B200", "deepseek_v3", "*", 0): MoeEntry(
        "v0.1.0rc4 scripts/performance/run_script.py (deepseek v3, b200: use_tokendrop)",
        token_drop=True, force_balance=False, shared_expert_overlap=True),
    ("25.09", "GB200", "deepseek_v3", "*", 0): MoeEntry(
        "v0.1.0rc4 scripts/performance/run_script.py (deepseek v3, gb200: use_tokendrop)",
        token_drop=True, force_balance=False, shared_expert_overlap=True),
    ("26.02.01", "B200", "deepseek_v3", "fp8_mx", 256): MoeEntry(
        f"{_CFG_0302}/deepseek DEEPSEEK_V3_PRETRAIN_CONFIG_B200_FP8_MX_V2; recipes/deepseek/"
        "deepseek_v3.py apply_flex_dispatcher_backend(hybridep)", dispatcher="flex",
        backend="hybridep", recompute=("mla_up_proj",)),
    ("26.02.01", "GB200", "gpt_oss_120b", "bf16", 64): MoeEntry(
        f"{_CFG_0302}/gpt_oss GPT_OSS_120B_PRETRAIN_CONFIG_GB200_BF16_V2",
        recompute=("layernorm", "moe_act")),
    ("26.02.01", "B200", "gpt_oss_120b", "bf16", 64): MoeEntry(
        f"{_CFG_0302}/gpt_oss GPT_OSS_120B_PRETRAIN_CONFIG_B200_BF16_V2",
        recompute=("layernorm", "moe_act"), layout="EP 64"),
    ("26.02.01", "H100", "gpt_oss_120b", "bf16", 64): MoeEntry(
        f"{_CFG_0302}/gpt_oss GPT_OSS_120B_PRETRAIN_CONFIG_H100_BF16_V2",
        recompute=("layernorm", "moe_act")),
    ("26.02.01", "B200", "qwen3_30b_a3b", "fp8_mx", 8): MoeEntry(
        f"{_CFG_0302}/qwen QWEN3_30B_A3B_PRETRAIN_CONFIG_B200_FP8_MX_V1",
        dispatcher="flex", backend="hybridep", graphs=_TE_GRAPHS),
    ("26.02.01", "H100", "qwen3_30b_a3b", "fp8_cs", 16): MoeEntry(
        "v0.3.0 scripts/performance/configs/qwen QWEN3_30B_A3B_PRETRAIN_CONFIG_H100_FP8_CS_V1 "
        "(the config of the row's PP 2, VP 12, EP 8; cfeddcd94's is EP 16)",
        dispatcher="flex", backend="deepep", a2a_overlap=True),
    ("26.02.01", "H100", "qwen3_235b_a22b", "fp8_cs", 256): MoeEntry(
        f"{_CFG_0302}/qwen QWEN3_235B_A22B_PRETRAIN_CONFIG_H100_FP8_CS_V2; "
        "qwen3_llm_pretrain.py qwen3_235b_a22b_pretrain_config_h100: "
        "moe_token_dispatcher_type alltoall, CommOverlapConfig(tp_comm_overlap=False)",
        a2a_overlap=True, tp_comm_overlap=False),
    ("26.02.01", "GB200", "qwen3_235b_a22b", "fp8_mx", 256): MoeEntry(
        "v0.3.0 scripts/performance/configs/qwen QWEN3_235B_A22B_PRETRAIN_CONFIG_GB200_FP8_MX_V2 "
        "(the config of the row's VP n/a; cfeddcd94's has VP 3)",
        dispatcher="flex", backend="hybridep", graphs=_TE_GRAPHS),
    ("26.06", "H100", "qwen3_30b_a3b", "fp8_cs", 16): MoeEntry(
        "63b08b397 scripts/performance/configs/qwen QWEN3_30B_A3B_PRETRAIN_CONFIG_H100_FP8_CS_V1",
        dispatcher="flex", backend="hybridep"),
    ("26.08", "GB200", "deepseek_v3", "fp8_mx", 256): MoeEntry(
        f"{_RECIPES_2608}/deepseek/gb200/deepseek_v3.py deepseek_v3_pretrain_256gpu_gb200_"
        "fp8mx_config", dispatcher="flex", backend="hybridep", a2a_overlap=True,
        graphs=_FULL_ITER, recompute=("mla_up_proj",), fused_grouped_mlp=True),
    ("26.08", "GB200", "gpt_oss_120b", "fp8_mx", 64): MoeEntry(
        f"{_RECIPES_2608}/gpt_oss/gb200/gpt_oss.py gpt_oss_120b_pretrain_64gpu_gb200_fp8mx_"
        "config", dispatcher="flex", backend="hybridep", a2a_overlap=True,
        graphs=_FULL_ITER, recompute=(), fused_grouped_mlp=True, fp8_attention=True),
    ("26.08", "GB200", "qwen3_30b_a3b", "fp8_mx", 8): MoeEntry(
        f"{_RECIPES_2608}/qwen/gb200/qwen3_moe.py qwen3_30b_a3b_pretrain_8gpu_gb200_fp8mx_"
        "config", dispatcher="flex", backend="hybridep", a2a_overlap=True,
        graphs=_FULL_ITER, fused_grouped_mlp=True, fp8_attention=True),
    ("26.08", "GB200", "qwen3_235b_a22b", "fp8_mx", 256): MoeEntry(
        f"{_RECIPES_2608}/qwen/gb200/qwen3_moe.py qwen3_235b_a22b_pretrain_256gpu_gb200_"
        "fp8mx_config", dispatcher="flex", backend="hybridep", a2a_overlap=True,
        graphs=_FULL_ITER, fused_grouped_mlp=True, fp8_attention=True),
}

# 26.06.01 (381d0b825, the commit that published its table): the four GB200 MXFP8
# recipe functions above, and the helpers they call, read the same there (the DeepSeek
# helper sets no dispatcher; deepseek/common.py's set_deepseek_v3_common_configs sets
# flex / hybridep).
for (_rel, _gpu, _model, _kind, _n), _e in list(ENTRIES.items()):
    if _rel == "26.08":
        ENTRIES[("26.06.01", _gpu, _model, _kind, _n)] = dataclasses.replace(
            _e, path=_e.path.replace("4ab94dfad", "381d0b825"))


# Megatron-Bridge builds GPT-OSS with YaRN RoPE (models/gpt_oss/gpt_oss_bridge.py:
# position_embedding_type "yarn"), and GPTModelProvider.provide turns RoPE fusion off for
# any type but rope (utils/fusions.py validate_rope_fusion_compatibility), as Megatron-LM's
# validate_args does.
_YARN_PRESETS = frozenset({"gpt_oss_120b", "gpt_oss_20b"})
_YARN_SOURCE = (f"{BRIDGE}@cfeddcd94 gpt_oss_bridge.py position_embedding_type='yarn'; "
                "gpt_provider.py provide: validate_rope_fusion_compatibility -> "
                "apply_rope_fusion=False")


# Every release read here (25.11 to 26.08) runs HybridEP on 32 SMs: the performance
# scripts' common overrides set it whenever the backend is hybridep (since "HybridEP
# support", c62795c60, Nov 2025), after the model's own config.
HYBRIDEP_SMS = 32
HYBRIDEP_SMS_SOURCE = (f"{BRIDGE}@cfeddcd94 scripts/performance/utils/overrides.py "
                       "_set_common_perf_overrides (the same at 97ad8cc6f to 63b08b397; "
                       "perf_recipes/_common.py at 381d0b825 and 4ab94dfad): "
                       "moe_hybridep_num_sms = 32 whenever the backend is hybridep")


def release_of(source: str) -> str | None:
    prefix = "MegatronBridge-perf-"
    return source[len(prefix):] if source.startswith(prefix) else None


def find_entry(f) -> MoeEntry | None:
    """The entry for a row (``f``: recipes.RowFacts)."""
    release = release_of(f.source)
    if release is None or not f.is_moe:
        return None
    kind = precision_kind(f.precision, f.notes)
    gpus = f.tp * f.pp * f.cp * f.dp
    gpu, model = f.gpu.upper(), f.model_preset or ""
    for key in ((release, gpu, model, kind, gpus), (release, gpu, model, "*", 0),
                (release, "*", model, "*", 0)):
        if key in ENTRIES:
            return ENTRIES[key]
    return preset_entry(release, f, kind, MoeEntry)  # published/bridge_presets.py


def bridge_moe(f, rec) -> None:
    """Apply the row's Megatron-Bridge MoE recipe entry (``f``: recipes.RowFacts, ``rec``:
    recipes.Recipe)."""
    e = find_entry(f)
    if e is None:
        return
    src = f"{BRIDGE}@{e.path}" + (f" (that config's layout: {e.layout})" if e.layout else "")
    rec.set("parallel", "moe_token_dispatcher_type", e.dispatcher, src)
    if e.backend:
        rec.set("parallel", "moe_flex_dispatcher_backend", e.backend, src)
    if e.dispatcher == "flex" and e.backend == "hybridep":
        rec.set("parallel", "moe_flex_num_sms", HYBRIDEP_SMS, HYBRIDEP_SMS_SOURCE)
    if e.tp_comm_overlap is not None and f.tp > 1:
        rec.set("parallel", "tp_comm_overlap", e.tp_comm_overlap,
                f"{src}: CommOverlapConfig(tp_comm_overlap={e.tp_comm_overlap})")
    rec.set("parallel", "moe_router_fusion", True, f"{src}: moe_router_fusion")
    if f.model_preset in _YARN_PRESETS:
        rec.set("train", "apply_rope_fusion", False, _YARN_SOURCE)
    if e.a2a_overlap:
        rec.set("parallel", "overlap_moe_expert_parallel_comm", True,
                f"{src}: moe_a2a_overlap (overlap_moe_expert_parallel_comm, "
                "delay_wgrad_compute)")
    if e.shared_expert_overlap:
        rec.set("parallel", "moe_shared_expert_overlap", True, src)
    if e.fused_grouped_mlp:
        rec.set("parallel", "moe_fused_grouped_mlp", True, f"{src}: use_transformer_engine_"
                "op_fuser, NVTE_CUTEDSL_FUSED_GROUPED_MLP=1")
    if e.graphs:
        rec.set("train", "cuda_graph_scope", e.graphs, src)
    if e.fp8_attention and f.precision == "fp8":
        rec.set("train", "fp8_dot_product_attention", True, src)
    rec.set("train", "moe_router_force_load_balancing", e.force_balance,
            f"{src}: moe_router_force_load_balancing" if e.force_balance
            else f"{src}: token drop, routing not forced")
    if e.token_drop:
        rec.set("model", "moe_expert_capacity_factor", 1.0, f"{src}: apply_moe_token_drop")
        rec.set("model", "moe_pad_expert_input_to_capacity", True,
                f"{src}: apply_moe_token_drop")
    if e.recompute is not None and not f.recompute_stated:
        rec.sets_recompute = True
        if e.recompute:
            rec.set("train", "recompute_granularity", "selective", src)
            rec.set("train", "recompute_modules", e.recompute, src)
        else:
            rec.notes.append(f"recompute: none ({src}: recompute_modules [])")
