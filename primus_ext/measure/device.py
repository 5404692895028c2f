"""The local device's name as a profile records it (framework-neutral)."""
from __future__ import annotations

import platform


def cpu_name() -> str:
    """The CPU model from /proc/cpuinfo, else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def reference_host(with_megatron: bool = False) -> dict:
    """What a host-time data file records of the host that measured it: CPU, Python,
    torch (and megatron-core with the thread count, for the measurements that run it),
    and the UTC date."""
    import time

    import torch
    host = {"cpu": cpu_name(), "machine": platform.machine(),
            "python": platform.python_version(), "torch": torch.__version__}
    if with_megatron:
        import megatron.core
        host.update(megatron_core=megatron.core.__version__,
                    threads=torch.get_num_threads())
    host["measured"] = time.strftime("%Y-%m-%d", time.gmtime())
    return host
