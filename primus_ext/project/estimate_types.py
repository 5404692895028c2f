"""Estimate: the projector's answer for one RunSpec."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

BREAKDOWN_KEYS = ("compute_s", "recompute_s", "tp_comm_s", "cp_comm_s", "ep_comm_s",
                  "pp_bubble_s", "dp_comm_s", "optimizer_s", "host_s", "host_pause_s")


@dataclass(frozen=True, kw_only=True, slots=True)
class Estimate:
    step_time_s: float
    tokens_per_s_per_gpu: float
    tflops_per_gpu: float  # model TFLOP/s per GPU by flop_formula
    mfu: float  # against the dense peak of the run's precision
    flop_formula: str
    peak_tflops: float
    # Where the step goes, on the critical (slowest) pipeline stage; sums to step_time_s.
    breakdown: dict[str, float]
    critical_stage: int
    stage_busy_s: tuple[float, ...]
    num_microbatches: int
    schedule: str
    layout: str
    backend: str
    memory: Any  # MemoryReport
    notes: tuple[str, ...] = ()
    timeline: Any = field(default=None, compare=False)  # ScheduleResult with events
    # Per layer kind, one microbatch on one rank: the device's and the host's seconds of
    # its forward and backward (with recompute) and the share of the two phases the
    # host sets (what its clock takes beyond the device's, over their sum).
    layer_clocks: dict = field(default_factory=dict, compare=False)
    # What the error band of this projection depends on besides its breakdown
    # (project/bands.py spec_features: dense or MoE, hardware family, scale).
    band_features: dict = field(default_factory=dict, compare=False)

    @property
    def peak_memory_bytes(self) -> int:
        return self.memory.peak_bytes

    @property
    def fits(self) -> bool:
        return self.memory.fits

    def error_band(self, recompute_inferred: bool = False) -> dict | None:
        """The 80 % band of tokens/s/GPU and step time (project/bands.py), from the
        held-out errors of comparable runs; None without band features."""
        if not self.band_features:
            return None
        from primus_ext.project.bands import estimate_bands
        return estimate_bands(self, recompute_inferred)

    def to_dict(self) -> dict:
        return {
            "step_time_s": self.step_time_s,
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
            "tflops_per_gpu": self.tflops_per_gpu,
            "mfu": self.mfu,
            "flop_formula": self.flop_formula,
            "peak_tflops": self.peak_tflops,
            "peak_memory_bytes": self.peak_memory_bytes,
            "fits": self.fits,
            "breakdown": dict(self.breakdown),
            "critical_stage": self.critical_stage,
            "stage_busy_s": list(self.stage_busy_s),
            "num_microbatches": self.num_microbatches,
            "schedule": self.schedule,
            "layout": self.layout,
            "backend": self.backend,
            "memory": self.memory.to_dict(),
            "notes": list(self.notes),
            "layer_clocks": dict(self.layer_clocks),
            "error_band": self.error_band(),
        }
