"""HardwareSpec: datasheet figures and physical efficiency constants of one GPU kind.

Datasheet fields come from a cited source; the efficiency constants are physical
(a fraction of peak, a latency, a per-kernel overhead) and are fitted per hardware by
``primus-ext mode=calibrate`` from measured runs, never per model or per row.
"""
from __future__ import annotations

from dataclasses import dataclass

from primus_ext.spec._check import non_negative, positive

_OWNER = "hardware"


@dataclass(frozen=True, kw_only=True, slots=True)
class HardwareSpec:
    name: str
    vendor: str = ""
    source: str = ""
    # Dense peaks (no sparsity), TFLOP/s.
    bf16_tflops: float
    fp8_tflops: float | None = None
    fp32_tflops: float | None = None  # None -> bf16 / 2 (TF32 tensor cores)
    hbm_bytes: int
    hbm_gbps: float  # HBM bandwidth, GB/s (1e9)
    gpus_per_node: int = 8
    scale_up_domain_gpus: int = 8  # GPUs in one NVLink / Infinity Fabric domain
    scale_up_gbps: float  # per-GPU unidirectional scale-up bandwidth, GB/s
    scale_out_gbps: float  # per-GPU NIC bandwidth, GB/s (400 Gb/s -> 50)
    scale_up_latency_s: float = 3e-6
    scale_out_latency_s: float = 10e-6
    # Physical efficiency constants (defaults are priors; calibration refines them).
    gemm_efficiency: float = 0.80  # large-GEMM fraction of dense peak
    attention_efficiency: float = 0.55  # flash-attention fraction of bf16 peak
    hbm_efficiency: float = 0.80  # achieved fraction of HBM bandwidth
    scale_up_efficiency: float = 0.75  # achieved fraction of link bandwidth (bus bw)
    scale_out_efficiency: float = 0.75
    kernel_overhead_s: float = 4e-6  # launch and tail per kernel
    tdp_w: float | None = None

    def __post_init__(self) -> None:
        for f in ("bf16_tflops", "hbm_gbps", "scale_up_gbps", "scale_out_gbps"):
            v = getattr(self, f)
            non_negative(_OWNER, f, v)
            if v == 0:
                raise ValueError(f"hardware.{f}={v} must be positive")
        positive(_OWNER, "hbm_bytes", self.hbm_bytes)
        positive(_OWNER, "gpus_per_node", self.gpus_per_node)
        positive(_OWNER, "scale_up_domain_gpus", self.scale_up_domain_gpus)
        for f in ("gemm_efficiency", "attention_efficiency", "hbm_efficiency",
                  "scale_up_efficiency", "scale_out_efficiency"):
            v = getattr(self, f)
            if not 0 < v <= 1:
                raise ValueError(f"hardware.{f}={v} must be in (0, 1]")
        for f in ("scale_up_latency_s", "scale_out_latency_s", "kernel_overhead_s"):
            non_negative(_OWNER, f, getattr(self, f))

    def peak_tflops(self, precision: str) -> float:
        """Dense peak for a run's precision (fp8 falls back to bf16 where there is none)."""
        if precision == "fp8" and self.fp8_tflops:
            return self.fp8_tflops
        if precision == "fp32":
            return self.fp32_tflops or self.bf16_tflops / 2
        return self.bf16_tflops
