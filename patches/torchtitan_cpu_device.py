"""torchtitan on a CPU-only machine: its device type and device module.

What it fixes (torchtitan 0.3.x, torch 2.13 CPU build): ``torchtitan.tools.utils`` sets
``device_type = _get_available_device_type() or "cuda"`` and ``device_module =
torch.cuda`` at import time, and the Trainer, the metrics' ``DeviceMemoryMonitor``
(``get_device_name``, ``get_device_properties``, ``memory_stats``,
``reset_peak_memory_stats``, ``empty_cache``), ``set_pg_timeouts`` (``current_device``,
``synchronize``) and the gloo/nccl backend choice read them. Here the device type is
``cpu`` (gloo is torch's default backend for it) and the device module a small stand-in
that answers those calls for the host (total memory from /proc/meminfo; no peak
statistics: the CPU allocator keeps none).

Must run before any torchtitan module binds the names (``from torchtitan.tools.utils
import device_type``); already imported torchtitan modules are rebound.
"""
from __future__ import annotations

import sys
import types

import torch


def _host_memory_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class _Properties:
    def __init__(self) -> None:
        self.name = "cpu"
        self.total_memory = _host_memory_bytes()


def cpu_device_module() -> types.ModuleType:
    m = types.ModuleType("torchtitan_cpu_device_module")
    m.get_device_name = lambda *a, **k: "cpu"
    m.get_device_properties = lambda *a, **k: _Properties()
    m.current_device = lambda: 0
    m.device_count = lambda: 1
    m.set_device = lambda *a, **k: None
    m.synchronize = lambda *a, **k: None
    m.is_available = lambda: True
    m.reset_peak_memory_stats = lambda *a, **k: None
    m.empty_cache = lambda: None
    m.memory_stats = lambda *a, **k: {}
    return m


def apply() -> list[str]:
    import torch._utils as tu
    original = tu._get_available_device_type
    tu._get_available_device_type = lambda: "cpu"
    try:
        import torchtitan.tools.utils as tt_utils
    finally:
        tu._get_available_device_type = original
    if getattr(tt_utils, "__primus_cpu__", False):
        return ["torchtitan device_type=cpu"]
    module = cpu_device_module()
    tt_utils.device_type, tt_utils.device_module = "cpu", module
    tt_utils.__primus_cpu__ = True
    import torchtitan.trainer  # noqa: F401 - binds the names in its imports
    for name, mod in list(sys.modules.items()):
        if not name.startswith("torchtitan") or mod is None:
            continue
        if "device_module" in mod.__dict__ and mod.__dict__["device_module"] is torch.cuda:
            mod.device_module = module
        if mod.__dict__.get("device_type") == "cuda":
            mod.device_type = "cpu"
    return ["torchtitan device_type=cpu", "torchtitan device_module (host stand-in)"]
