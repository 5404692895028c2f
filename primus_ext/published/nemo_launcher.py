"""What NeMo 1's launcher recipes say about the NeMo 24.07 performance table's runs (pure
data + one rule).

The NeMo-perf-summary-24.07 rows were measured in the NeMo 24.07 container, which trains
GPT models with NeMo 1's ``megatron_gpt_pretraining.py`` driven by NeMo-Framework-Launcher
(github.com/NVIDIA/NeMo-Framework-Launcher, tag 24.07 = 8325688d8345) and its
``launcher_scripts/conf/training/<family>/<model>.yaml``. At that tag every GPT, Llama,
Nemotron and Mixtral training yaml sets ``optim.name: distributed_fused_adam``: NeMo's
``MegatronDistributedFusedAdam`` over Apex's DistributedFusedAdam, whose state bytes
follow ``optim.dtype`` (``memory/apex_adam.py``; megatron-core's optimizer replaced it in
the launcher only at commit 3dd35614, 2024-12-05). Its other settings per model:

- ``optim.dtype``: only ``nemotron/nemotron_340b.yaml`` sets it (``bf16``: Adam's moments
  in bf16 and, the model being bf16 too, no master copy); the others leave NeMo's default
  fp32 (fp32 moments and the 16-bit remainders of the fp32 master weights);
- ``activations_checkpoint_granularity``: ``selective`` in ``nemotron_340b.yaml`` (NeMo
  passes it as megatron-core's ``recompute_granularity``; megatron-core core_r0.8.0
  ``transformer/attention.py:103`` then checkpoints the core attention only), null in
  the others (the Llama yamls: ``activations_checkpoint_method: block`` with
  ``activations_checkpoint_num_layers: 0``, no layer recomputed).

The table's layout and batch replace the yaml's (the 340B yaml at the tag has PP 12 VP 8,
the table PP 8 VP 12, as the yaml's own later revision 630e6544 has, with the same
``dtype`` and ``selective``). ``tests/data/nemo_launcher_2407/`` holds the lines read.
"""
from __future__ import annotations

from dataclasses import dataclass

from primus_ext.spec.train import APEX_DFA

LAUNCHER_2407 = "NeMo-Framework-Launcher 24.07 (8325688d8345) launcher_scripts/conf/training"


@dataclass(frozen=True)
class LauncherYaml:
    path: str  # under launcher_scripts/conf/training/
    optim_dtype: str = "fp32"  # optim.dtype (NeMo's default when absent: fp32)
    recompute_granularity: str | None = None  # activations_checkpoint_granularity


# model preset -> the launcher's training yaml for it at tag 24.07.
NEMO_LAUNCHER_2407 = {
    "gpt3_5b": LauncherYaml("gpt3/5b.yaml"),
    "gpt3_20b": LauncherYaml("gpt3/20b.yaml"),
    "gpt3_175b": LauncherYaml("gpt3/175b.yaml"),
    "llama2_7b": LauncherYaml("llama/llama2_7b.yaml"),
    "llama2_13b": LauncherYaml("llama/llama2_13b.yaml"),
    "llama2_70b": LauncherYaml("llama/llama2_70b.yaml"),
    "nemotron3_8b": LauncherYaml("nemotron/nemotron_8b.yaml"),
    "nemotron3_22b": LauncherYaml("nemotron/nemotron_22b.yaml"),
    "nemotron4_340b": LauncherYaml("nemotron/nemotron_340b.yaml", optim_dtype="bf16",
                                   recompute_granularity="selective"),
    "llama3_8b": LauncherYaml("llama/llama3_8b.yaml"),
    "llama3_70b": LauncherYaml("llama/llama3_70b.yaml"),
}


def nemo_launcher_2407(f, rec) -> None:
    """The launcher's optimizer (and, where the row states none, its recompute) for a
    NeMo-perf-summary-24.07 row (``f``: ``recipes.RowFacts``, ``rec``: ``recipes.Recipe``).
    A model without a yaml in the table takes the optimizer every yaml names, with NeMo's
    default state dtype."""
    entry = NEMO_LAUNCHER_2407.get(f.model_preset or "")
    src = f"{LAUNCHER_2407}/{entry.path if entry else '*.yaml'}"
    dtype = entry.optim_dtype if entry else "fp32"
    how = (f"optim.dtype {dtype}" if entry and entry.optim_dtype != "fp32" else
           "optim.dtype unset: fp32, NeMo megatron_base_model.py setup_optimization's default")
    rec.set("train", "optimizer_impl", APEX_DFA,
            f"{src}: optim.name distributed_fused_adam (NeMo 1 MegatronDistributedFusedAdam "
            f"over Apex DistributedFusedAdam), {how}")
    if dtype != "fp32":
        rec.train["exp_avg_dtype"] = rec.train["exp_avg_sq_dtype"] = dtype
    if entry is None or f.recompute_stated:
        return
    rec.sets_recompute = True
    if entry.recompute_granularity == "selective":
        rec.set("train", "recompute_granularity", "selective",
                f"{src}: activations_checkpoint_granularity selective")
        rec.set("train", "recompute_modules", ("core_attn",),
                "megatron-core core_r0.8.0 transformer/attention.py:103: selective "
                "granularity checkpoints the core attention only")
    else:
        rec.notes.append(f"recompute: none ({src}: activations_checkpoint_granularity "
                         "null)")
