"""The memory and CUDA-graph settings of Megatron-Bridge's 25.09 performance matrix (pure
data + two rules).

The MegatronBridge-perf-25.09 rows are the tables of the 25.09 NeMo container, produced
by Megatron-Bridge's ``scripts/performance`` at the 0.1.0 release
(github.com/NVIDIA-NeMo/Megatron-Bridge v0.1.0rc4, 6725f7049504). Each model's
``scripts/performance/configs/<family>/<model>_llm_pretrain.yaml`` holds a
``perf_matrix`` per GPU, GPU count and precision (``fp8_cs`` for the FP8 tables), and
``scripts/performance/utils/helpers.py`` applies it:

- ``use_megatron_fsdp: true`` -> ``set_megatron_fsdp_overrides``: Megatron-FSDP with
  ``data_parallel_sharding_strategy = "optim_grads_params"``;
- ``cpu_offloading_num_layers: N`` -> ``set_recompute_overrides``: ``cpu_offloading =
  True``, ``cpu_offloading_weights = False``, ``cpu_offloading_num_layers = N`` (the
  activations of the first N layers on the host; ``memory/offload.py``);
- ``recompute_num_layers: N`` -> ``set_recompute_overrides``: full recompute,
  ``recompute_method = "block"``, ``recompute_num_layers = N``.

- ``cuda_graphs: true`` -> ``set_cuda_graph_overrides``: ``model.enable_cuda_graph``
  (megatron-core's local CUDA graphs of whole transformer layers, ``train.cuda_graph_scope
  = ('layer',)``; a dropless MoE layer's routed part, whose splits the host reads, stays
  outside the graph: ``compute/host.py graphed_parts``).

Every one of those yaml files also sets ``cross_entropy_fusion_impl: "te"`` (TE's fused
cross entropy; the NVIDIA rule turns ``cross_entropy_loss_fusion`` on).

A row takes an entry only when its GPU, model, precision, layout (TP, PP, CP) and micro
batch are the entry's and it ran on FSDP: the same recipe. Only the entries that set a
memory saving are listed.
"""
from __future__ import annotations

from dataclasses import dataclass

BRIDGE_0_1 = "Megatron-Bridge v0.1.0rc4 scripts/performance"


@dataclass(frozen=True)
class MatrixEntry:
    path: str  # the yaml file and the perf_matrix key it was read from
    tp: int
    pp: int
    cp: int
    mbs: int
    cpu_offloading_num_layers: int = 0
    recompute_num_layers: int = 0  # full, block


# (gpu, model preset, precision) -> the perf_matrix entry (all use_megatron_fsdp: true).
PERF_MATRIX_2509 = {
    ("GB200", "llama3_70b", "fp8"): MatrixEntry(
        "configs/llama3/llama3_70b_llm_pretrain.yaml perf_matrix.gb200.num_gpus_64.fp8_cs",
        tp=1, pp=1, cp=1, mbs=2, cpu_offloading_num_layers=40),
    ("GB200", "llama3_70b", "bf16"): MatrixEntry(
        "configs/llama3/llama3_70b_llm_pretrain.yaml perf_matrix.gb200.num_gpus_64.bf16",
        tp=1, pp=1, cp=1, mbs=1, cpu_offloading_num_layers=20),
    ("B200", "llama3_70b", "fp8"): MatrixEntry(
        "configs/llama3/llama3_70b_llm_pretrain.yaml perf_matrix.b200.num_gpus_64.fp8_cs",
        tp=1, pp=1, cp=1, mbs=1, recompute_num_layers=5),
    ("GB200", "llama3.1_405b", "fp8"): MatrixEntry(
        "configs/llama31/llama31_405b_llm_pretrain.yaml "
        "perf_matrix.gb200.num_gpus_128.fp8_cs",
        tp=2, pp=1, cp=1, mbs=1, cpu_offloading_num_layers=95),
}


def perf_matrix_memory(f, rec) -> None:
    """Apply the 25.09 perf matrix's memory saving to a row of that recipe (``f``:
    ``recipes.RowFacts``, ``rec``: ``recipes.Recipe``)."""
    entry = PERF_MATRIX_2509.get((f.gpu.upper(), f.model_preset or "", f.precision))
    if entry is None or f.recompute_stated or not f.sharding.startswith("fsdp"):
        return
    if (f.tp, f.pp, f.cp, f.mbs) != (entry.tp, entry.pp, entry.cp, entry.mbs):
        return
    src = f"{BRIDGE_0_1}/{entry.path}"
    rec.sets_recompute = rec.recompute_from_source = True  # the row's own recipe
    if entry.cpu_offloading_num_layers:
        rec.set("train", "cpu_offloading_num_layers", entry.cpu_offloading_num_layers,
                f"{src}: cpu_offloading_num_layers (utils/helpers.py "
                "set_recompute_overrides: activations of the first N layers on the host)")
        rec.notes.append(f"recompute: none ({src}: CPU activation offloading instead)")
    if entry.recompute_num_layers:
        rec.set("train", "recompute_granularity", "full", src)
        rec.set("train", "recompute_method", "block", src)
        rec.set("train", "recompute_num_layers", entry.recompute_num_layers, src)


# (gpu, model preset, precision, GPUs) -> cuda_graphs of the perf_matrix entry, where true
# (every other entry of the 25.09 yaml files states false). The FP8 tables are fp8_cs.
CUDA_GRAPHS_2509 = {
    ("B200", "llama3_70b", "bf16", 64): "configs/llama3/llama3_70b_llm_pretrain.yaml "
    "perf_matrix.b200.num_gpus_64.bf16",
    ("B200", "llama3_8b", "bf16", 8): "configs/llama3/llama3_8b_llm_pretrain.yaml "
    "perf_matrix.b200.num_gpus_8.common",
    ("B200", "llama3_8b", "fp8", 8): "configs/llama3/llama3_8b_llm_pretrain.yaml "
    "perf_matrix.b200.num_gpus_8.common",
    ("GB200", "llama3_8b", "bf16", 8): "configs/llama3/llama3_8b_llm_pretrain.yaml "
    "perf_matrix.gb200.num_gpus_8.bf16",
    ("GB200", "qwen3_235b_a22b", "bf16", 64): "configs/qwen3/qwen3_235b_a22b_llm_pretrain."
    "yaml perf_matrix.gb200.num_gpus_64.common",
    ("GB200", "qwen3_235b_a22b", "fp8", 64): "configs/qwen3/qwen3_235b_a22b_llm_pretrain."
    "yaml perf_matrix.gb200.num_gpus_64.common",
    ("GB200", "qwen3_30b_a3b", "bf16", 8): "configs/qwen3/qwen3_30b_a3b_llm_pretrain.yaml "
    "perf_matrix.gb200.num_gpus_8.common",
    ("GB200", "qwen3_30b_a3b", "fp8", 8): "configs/qwen3/qwen3_30b_a3b_llm_pretrain.yaml "
    "perf_matrix.gb200.num_gpus_8.common",
    ("B200", "qwen3_30b_a3b", "bf16", 8): "configs/qwen3/qwen3_30b_a3b_llm_pretrain.yaml "
    "perf_matrix.b200.num_gpus_8.common",
    ("B200", "qwen3_30b_a3b", "fp8", 8): "configs/qwen3/qwen3_30b_a3b_llm_pretrain.yaml "
    "perf_matrix.b200.num_gpus_8.common",
}


def perf_matrix_cuda_graphs(f, rec) -> None:
    """The 25.09 perf matrix's CUDA graphs, for a row of that recipe."""
    gpus = f.tp * f.pp * f.cp * f.dp
    entry = CUDA_GRAPHS_2509.get((f.gpu.upper(), f.model_preset or "", f.precision, gpus))
    if entry is not None:
        rec.set("train", "cuda_graph_scope", ("layer",),
                f"{BRIDGE_0_1}/{entry}: cuda_graphs true (utils/helpers.py "
                "set_cuda_graph_overrides: model.enable_cuda_graph)")
