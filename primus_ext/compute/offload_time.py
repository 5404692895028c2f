"""Time of activation offloading: the copies to host memory and their reloads.

megatron-core's fine-grained activation offloading (``--fine-grained-activation-
offloading --offload-modules``; ``memory/offload.py`` says which saved tensors each
module moves) copies a module's saved inputs to pinned host memory on a side stream
after its forward, and brings them back on that stream ahead of its backward. The
copies share the host link (``hardware.host_link_gbps``, PCIe or NVLink-C2C) and overlap
the layer's compute of the same phase; what a layer's copies take beyond that compute is
exposed. Each tensor is one ``copy_`` (a launch on the host) per direction.
"""
from __future__ import annotations

from primus_ext.compute.ops import OpCost


def offload_op(spec, moe: bool, fwd_s: float, bwd_s: float) -> OpCost | None:
    """The exposed copy time of one decoder layer (forward: to the host; backward: the
    reload), or None without fine-grained offloading."""
    t = spec.train
    if not t.offload_modules:
        return None
    from primus_ext.memory.activations import layer_items
    from primus_ext.memory.offload import OFFLOAD_ITEMS
    from primus_ext.memory.options import DEFAULT_OPTIONS
    from primus_ext.memory.report import resolved_train
    names = {n for m in t.offload_modules for n in OFFLOAD_ITEMS[m]}
    items = [(k, v) for k, v in layer_items(spec.model, spec.parallel, resolved_train(spec),
                                            moe, DEFAULT_OPTIONS) if k in names]
    moved = sum(v for _, v in items)
    if not moved:
        return None
    copy_s = moved / (spec.cluster.hardware.host_link_gbps * 1e9)
    n = len(items)
    return OpCost("activation_offload", "offload", max(copy_s - fwd_s, 0.0),
                  max(copy_s - bwd_s, 0.0), 0.0, fwd_bytes=moved, bwd_bytes=moved,
                  fwd_kernels=n, bwd_kernels=n)
