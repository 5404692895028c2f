"""What the measuring device can give a measurement: memory and time budgets.

- CUDA: per device, ``--measure-memory-gib`` or 90% of the free device memory
  (``torch.cuda.mem_get_info``); the memory model's device peak (CUDA context, NCCL
  buffers and workspaces included) is set against it.
- CPU: for all the local processes together, ``--measure-memory-gib`` or half of the
  machine's available memory (``MemAvailable``), at most ``CPU_CAP_GIB``: a login node or
  a laptop stays usable; each process's own resident base (torch and megatron-core
  imported, measured from ``/proc/self/status``) is added to its modelled peak.
- Time: ``--measure-max-seconds`` or ``CPU_SECONDS`` / ``GPU_SECONDS`` of estimated
  compute (the simulate backend's model of the measuring hardware).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

GIB = 1 << 30
CPU_CAP_GIB = 6.0
CPU_SECONDS = 150.0
GPU_SECONDS = 300.0


@dataclass(frozen=True, kw_only=True, slots=True)
class Budget:
    memory_bytes: int
    seconds: float
    base_bytes: int  # per process, outside the model (CPU); 0 on CUDA (in the model)
    num_processes: int  # processes sharing ``memory_bytes``


def _meminfo_kib(key: str) -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def resident_bytes() -> int:
    """This process's resident set (0 where /proc is absent)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def local_budget(memory_gib: float | None, max_seconds: float | None, *, cuda: bool,
                 num_local_processes: int) -> Budget:
    if cuda:
        import torch
        free, _ = torch.cuda.mem_get_info()
        mem = int(memory_gib * GIB) if memory_gib else int(0.9 * free)
        return Budget(memory_bytes=mem, seconds=max_seconds or GPU_SECONDS, base_bytes=0,
                      num_processes=1)
    if memory_gib:
        mem = int(memory_gib * GIB)
    else:
        avail = _meminfo_kib("MemAvailable")
        half = avail * 1024 // 2 if avail else int(CPU_CAP_GIB * GIB)
        mem = min(half, int(CPU_CAP_GIB * GIB))
    return Budget(memory_bytes=mem, seconds=max_seconds or CPU_SECONDS,
                  base_bytes=resident_bytes(), num_processes=max(num_local_processes, 1))


def local_processes(world: int) -> int:
    return int(os.environ.get("LOCAL_WORLD_SIZE", world))
