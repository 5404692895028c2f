"""Time of activation offloading: the copies to host memory and their reloads.

megatron-core's fine-grained activation offloading (``--fine-grained-activation-
offloading --offload-modules``; ``memory/offload.py`` says which saved tensors each
module moves) groups a layer's saved tensors by module (``attn_norm``, ``qkv_linear``,
``core_attn``, ``attn_proj``, ``mlp_norm``, ``expert_fc1``, ``moe_act``) and, in
``pipeline_parallel/fine_grained_activation_offload.py`` (core_v0.16.1):

- every save is its own copy: the saved-tensor hook (``on_save_for_backward`` ->
  ``tensor_push``) tags each tensor autograd saves with a fresh (group, index) and keeps
  no identity, so a tensor two ops save is copied out, and reloaded, twice. On the
  unfused attention path the probabilities are one such tensor: the softmax saves its
  output and, without dropout or a cast between them, the ``bmm`` with V saves the same
  tensor as its input (TE ``UnfusedDotProductAttention``; ``memory/attn_unfused.py``);
- forward: at a group's commit the device-to-host stream waits for the compute stream
  and copies the group to pinned host memory (``on_group_commit_forward``,
  ``bulk_offload_group``); the compute stream goes on, so the copies overlap the layer's
  forward and only what they take beyond it is exposed;
- backward: a group's reload is issued when the backward of the group after it ends
  (``on_group_start_backward``: the host-to-device stream first waits for the compute
  stream, then ``bulk_reload``), and the compute stream waits for it before the group's
  own backward (``on_group_commit_backward``: ``wait_reload_event``). Nothing runs
  between the two, so the reloads are on the critical path whole.

The copies run at the host link (``hardware.host_link_gbps``, PCIe or NVLink-C2C). Each
save is one ``copy_`` (a launch on the host) per direction.
"""
from __future__ import annotations

from primus_ext.compute.ops import OpCost

# Saved by two ops as one tensor (module docstring): the softmax output when the PV bmm
# takes it as it is (no dropout output, no cast back between them).
_SAVED_TWICE = {"softmax.output": ("softmax.cast", "attn_dropout.output")}


def saves(items: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """The (name, bytes) the offload hook receives: each saved tensor once per op that
    saves it."""
    names = {k for k, _ in items}
    twice = [(k, v) for k, v in items
             if k in _SAVED_TWICE and not names & set(_SAVED_TWICE[k])]
    return list(items) + twice


def offload_op(spec, moe: bool, fwd_s: float, bwd_s: float) -> OpCost | None:
    """The exposed copy time of one decoder layer (forward: the copies to the host beyond
    the layer's forward; backward: the reloads, whole), or None without fine-grained
    offloading. ``bwd_s`` is kept for the callers; the reloads do not hide behind it."""
    t = spec.train
    if not t.offload_modules:
        return None
    from primus_ext.memory.activations import layer_items
    from primus_ext.memory.offload import OFFLOAD_ITEMS
    from primus_ext.memory.options import DEFAULT_OPTIONS
    from primus_ext.memory.report import resolved_train
    names = {n for m in t.offload_modules for n in OFFLOAD_ITEMS[m]}
    items = saves([(k, v) for k, v in layer_items(
        spec.model, spec.parallel, resolved_train(spec), moe, DEFAULT_OPTIONS) if k in names])
    moved = sum(v for _, v in items)
    if not moved:
        return None
    copy_s = moved / (spec.cluster.hardware.host_link_gbps * 1e9)
    n = len(items)
    return OpCost("activation_offload", "offload", max(copy_s - fwd_s, 0.0), copy_s, 0.0,
                  fwd_bytes=moved, bwd_bytes=moved, fwd_kernels=n, bwd_kernels=n)
