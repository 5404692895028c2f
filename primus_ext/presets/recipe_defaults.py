"""What current performance recipes do with a setting a run leaves unstated.

Megatron-LM's flag defaults date from its first releases; the recipes NVIDIA publishes
its performance figures with set several of them otherwise. A Hydra config that leaves
one of these keys ``null`` (the default) gets the recipe's value, and the result says so;
a launch line (``launch/pretrain_gpt.py``) keeps Megatron-LM's flag defaults, because
there the flags are stated. The published-run reader fills the same gaps from here.

Source: github.com/NVIDIA-NeMo/Megatron-Bridge @067f987
- ``src/megatron/bridge/perf_recipes/_common.py`` ``_benchmark_common``:
  ``ddp.grad_reduce_in_fp32 = False`` (gradients reduced in BF16);
- per-model files such as ``perf_recipes/llama/h100/llama3.py``:
  ``comm_overlap.tp_comm_overlap_cfg = userbuffers_*`` whenever TP > 1 (Transformer
  Engine's userbuffers overlap, which needs sequence parallelism and TE layers).
"""
from __future__ import annotations

BRIDGE = "Megatron-Bridge perf_recipes/_common.py _benchmark_common"
GRAD_REDUCE_NOTE = f"{BRIDGE}: ddp.grad_reduce_in_fp32 = False"
TP_OVERLAP_NOTE = ("Megatron-Bridge perf_recipes/llama/h100/llama3.py: "
                   "comm_overlap.tp_comm_overlap_cfg = userbuffers_* when TP > 1")

# The ParallelSpec keys this module fills when a config leaves them unstated (null).
UNSTATED_PARALLEL = ("grad_reduce_in_fp32", "tp_comm_overlap")


def grad_reduce_in_fp32() -> bool:
    """Recipes reduce gradients in BF16."""
    return False


def tp_comm_overlap(tp: int, sequence_parallel: bool, te: bool) -> bool:
    """Recipes overlap TP communication with TE's userbuffers whenever TP > 1; the
    overlap exists only with sequence parallelism and TE layers (megatron-core's local
    spec has none)."""
    return tp > 1 and sequence_parallel and te


def fill_unstated_parallel(parallel: dict, *, te: bool) -> tuple[dict, list[str]]:
    """``parallel`` (a config's parallel group as a dict) with its ``null`` recipe keys
    filled, and one note per key filled."""
    out, notes = dict(parallel), []
    if out.get("grad_reduce_in_fp32") is None:
        out["grad_reduce_in_fp32"] = grad_reduce_in_fp32()
        notes.append(f"parallel.grad_reduce_in_fp32 not set: False ({GRAD_REDUCE_NOTE})")
    if out.get("tp_comm_overlap") is None:
        tp = out.get("tp", 1)
        value = tp_comm_overlap(tp if isinstance(tp, int) else 1,
                                bool(out.get("sequence_parallel")), te)
        out["tp_comm_overlap"] = value
        if isinstance(tp, int) and tp > 1:
            why = TP_OVERLAP_NOTE if value else (
                "the recipes' TP overlap needs TE layers and sequence parallelism")
            notes.append(f"parallel.tp_comm_overlap not set: {value} ({why})")
    return out, notes
