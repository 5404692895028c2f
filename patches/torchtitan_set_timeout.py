"""``torch.distributed.set_timeout`` for torchtitan's ``set_pg_timeouts``.

What it fixes (torchtitan 0.3.x on torch 2.13): after the first step the Trainer calls
``dist_utils.set_pg_timeouts`` (``torchtitan/distributed/utils.py``), which calls
``torch.distributed.set_timeout(timeout, group)``, a function torch 2.13 does not have
(``AttributeError``). The stand-in sets the timeout on the group object
(``ProcessGroup.set_timeout``, the world group for ``None``).
"""
from __future__ import annotations

import torch.distributed as dist


def apply() -> list[str]:
    if hasattr(dist, "set_timeout"):
        return []

    def set_timeout(timeout, group=None):
        g = group if group is not None else dist.group.WORLD
        setter = getattr(g, "set_timeout", None)
        if setter is not None:
            setter(timeout)

    dist.set_timeout = set_timeout
    return ["dist.set_timeout"]
