"""Unsynchronised host pauses, made everyone's by FSDP's per-layer collectives.

Each rank loses a small fraction of its time, ``hardware.host_pause_fraction``, to pauses
its peers do not share: OS daemons and interrupts, the Python runtime, the NCCL proxy
thread. A collective cannot finish before its last member arrives, so a pause on any
member delays all of them. When the collectives over a group are frequent (several per
layer and microbatch, as FSDP's parameter all-gathers and gradient reduce-scatters over
the data-parallel shard group are), nearly every pause of every member lands between two
of them and is paid by the whole group: a rank's step grows by the other ``n - 1``
members' pauses, ``(n - 1) * host_pause_fraction`` of the step, linear in the group
size (Hoefler, Schneider, Lumsdaine, SC10: noise propagated by collectives; the public
set's FSDP series, llm-foundry at 128-512 GPUs and torchtitan at 8-128, lose throughput
in proportion to the GPUs added, docs/accuracy.md).

Only FSDP's shard group is counted: a Megatron-style run (TP, CP, EP and PP groups inside
the microbatch loop, the data-parallel group once per step at its end) absorbs a
member's pause in the slack of its pipeline and its overlapped buckets, and the set's
Megatron-family runs at 1,024-16,384 GPUs show no such loss. A preset without a second
clock (``host_clock`` False: the CPU, where the device is the host) pays none.
"""
from __future__ import annotations

from primus_ext.comm.groups import group_span
from primus_ext.spec import RunSpec


def pause_group_size(spec: RunSpec) -> int:
    """Ranks whose pauses a rank waits for within the step: its FSDP shard group (the
    dense data x context-parallel group of an FSDP run; one HSDP replica's: Megatron-FSDP
    shards within each of ``num_distributed_optimizer_instances``), else 1.
    ``spec``: the costed view (a torchtitan run's megatron-equivalent layout, one HSDP
    replica)."""
    par = spec.parallel
    if not par.fsdp:
        return 1
    return max(group_span(spec, "dp_cp").size // par.num_distributed_optimizer_instances,
               1)


def host_pause_s(spec: RunSpec, step_s: float) -> float:
    """Seconds the other members' pauses add to a step of ``step_s``."""
    hw = spec.cluster.hardware
    n = pause_group_size(spec)
    if n <= 1 or not hw.host_clock:
        return 0.0
    return (n - 1) * hw.host_pause_fraction * step_s
