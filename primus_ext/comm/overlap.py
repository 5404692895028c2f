"""The overlap rule: how much of a collective stays on the critical path.

A collective that runs concurrently with compute of ``window_s`` seconds (the GEMM it is
pipelined with, the attention step of a CP ring, the backward of later layers) is hidden
up to that window; the rest is exposed. Hidden communication is not free: its kernels
occupy SMs / CUs that the compute would have used (DeepSeek-V3 reserved 20 of 132 SMs;
DeepEP V2 needs 4-24; achievable-performance.md 4.3 and 8), which slows the overlapped
compute by ``hardware.comm_overlap_penalty`` per second of overlap::

    base = max(tail_s, comm_s - window_s);  exposed = base + penalty * (comm_s - base)

``tail_s`` is a part that can never overlap (e.g. the last gradient bucket, issued after
the last backward finishes). Without overlap (``window_s`` None) all of it is exposed.
A collective whose kernels hold a known number of SMs (DeepEP) passes its own
``penalty``, the share of the SMs it takes (``sm_share_penalty``).
"""
from __future__ import annotations

from primus_ext.spec.hardware import HardwareSpec


def exposed_s(hw: HardwareSpec, comm_s: float, window_s: float | None,
              tail_s: float = 0.0, penalty: float | None = None) -> float:
    if comm_s <= 0:
        return 0.0
    if window_s is None:
        return comm_s
    hidden = min(comm_s, max(window_s, 0.0))
    base = max(min(tail_s, comm_s), comm_s - hidden)
    pen = hw.comm_overlap_penalty if penalty is None else penalty
    return base + pen * (comm_s - base)


def sm_share_penalty(hw: HardwareSpec, comm_sms: int) -> float:
    """Compute lost per second of overlap by a communication kernel that holds
    ``comm_sms`` SMs: the overlapped compute runs on the other SMs, so a second of overlap
    loses ``comm_sms / sm_count`` of a second of compute. Never below the generic
    penalty (NCCL channels); the generic one where the SM count is unknown."""
    if not hw.sm_count:
        return hw.comm_overlap_penalty
    return max(hw.comm_overlap_penalty, min(comm_sms / hw.sm_count, 1.0))
