"""The activation bytes megatron-core's local spec saves on a CPU beyond what it saves on
a GPU: torch's composite RMSNorm keeps the fp32 upcast and the fp32 normalised input
(4 + 4 bytes per element, where the fused GPU kernel keeps the input in the compute
dtype), and CPU LayerNorm keeps mean and rstd in the input dtype (CUDA: fp32). Used where
CPU measurements are set beside the model (``groundtruth.memory_compare``,
``measure.checks``).
"""
from __future__ import annotations

from primus_ext.memory.act_layer import Dims
from primus_ext.spec import RunSpec


def norm_cpu_delta(spec: RunSpec, items: dict[str, int]) -> int:
    """CPU-minus-GPU bytes of the norms among ``items`` (see the module docstring)."""
    e = Dims.of(spec.parallel, spec.train).e
    rms = spec.model.normalization == "RMSNorm"
    delta = 0
    for key, stats in items.items():
        if not key.endswith(".stats") or key.startswith(("q_layernorm.", "k_layernorm.")):
            continue
        rows = stats // (4 if rms else 8)
        width = items.get(key[:-len(".stats")] + ".input", 0) // (rows * e) if rows else 0
        delta += (8 - e) * rows * width if rms else (2 * e - 8) * rows
    return delta
