"""The activation bytes megatron-core's local spec saves on a CPU beyond what it saves on
a GPU: torch's composite RMSNorm keeps the fp32 upcast and the fp32 normalised input
(4 + 4 bytes per element, where the fused GPU kernel keeps the input in the compute
dtype), and CPU LayerNorm keeps mean and rstd in the input dtype (CUDA: fp32); the q/k
RMSNorms of ``--qk-layernorm`` keep fp32 copies instead of views of the QKV output; the
local spec's SequentialMLP runs the fused quick-GeGLU once per local expert, each call
saving its 0-dim offset tensor, where Transformer Engine's grouped experts make one call.
Used where CPU measurements are set beside the model (``groundtruth.memory_compare``,
``measure.checks``).
"""
from __future__ import annotations

from primus_ext.memory.act_layer import Dims
from primus_ext.spec import RunSpec


def cpu_delta_bytes(spec: RunSpec, items: dict[str, int]) -> int:
    """CPU-minus-GPU bytes of ``items`` (the norms; the per-expert fused quick-GeGLU
    offsets): see the module docstring."""
    d = Dims.of(spec.parallel, spec.train)
    e = d.e
    rms = spec.model.normalization == "RMSNorm"
    delta = _qk_rms_delta(spec, items, d) if rms else 0
    if "experts.glu_offset" in items:
        local = spec.model.num_moe_experts // spec.parallel.ep
        delta += (local - 1) * items["experts.glu_offset"]
    for key, stats in items.items():
        if not key.endswith(".stats") or key.startswith(("q_layernorm.", "k_layernorm.")):
            continue
        rows = stats // (4 if rms else 8)
        width = items.get(key[:-len(".stats")] + ".input", 0) // (rows * e) if rows else 0
        delta += (8 - e) * rows * width if rms else (2 * e - 8) * rows
    return delta


def _qk_rms_delta(spec: RunSpec, items: dict[str, int], d: Dims) -> int:
    """q/k RMSNorms (``--qk-layernorm``): on a CPU each keeps its fp32 upcast and fp32
    normalised input (8 bytes per element of q and k) and, being copies, not the views of
    the QKV output that a fused GPU norm keeps. Where V is repeated to all heads (unfused
    GQA attention saved by autograd, ``act_layer._unfused_core``) nothing else keeps that
    storage, so it is the GPU's alone; under core_attn recompute the checkpoint keeps V,
    a view of it."""
    q_rows = items.get("q_layernorm.stats", 0) // 4
    k_rows = items.get("k_layernorm.stats", 0) // 4
    if not q_rows:
        return 0
    delta = 8 * (q_rows + k_rows) * spec.model.head_dim
    if not d.flash and "v.repeated" in items:
        delta -= items.get("qkv.output", 0)
    return delta
