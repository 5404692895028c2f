"""The target cluster of a launch line: ``--target-nodes`` / ``--target-gpus-per-node`` /
``--target-hardware``, else $NNODES and $GPUS_PER_NODE (and $PRIMUS_TARGET_HARDWARE),
else the cluster torchrun launched ($WORLD_SIZE / $LOCAL_WORLD_SIZE), else one node of
the preset, or as many as the model-parallel size needs (pure)."""
from __future__ import annotations

import math
import os

from primus_ext.presets import hardware_preset
from primus_ext.spec import ClusterSpec


def _env_int(name: str) -> int | None:
    v = os.environ.get(name)
    return int(v) if v and v.isdigit() else None


def target_cluster(ns, mp: int) -> ClusterSpec:
    for flag, v in (("--target-nodes", ns.target_nodes),
                    ("--target-gpus-per-node", ns.target_gpus_per_node)):
        if v is not None and v < 1:
            raise ValueError(f"{flag} {v}: must be a positive integer")
    hw = hardware_preset(ns.target_hardware or os.environ.get("PRIMUS_TARGET_HARDWARE",
                                                              "h100"))
    # Without target flags the target is the launched cluster (torchrun's env); with
    # any of them, the target's nodes have the preset's size unless said otherwise.
    targeted = any(v is not None for v in (ns.target_nodes, ns.target_hardware,
                                           ns.target_gpus_per_node))
    local, world = _env_int("LOCAL_WORLD_SIZE"), _env_int("WORLD_SIZE")
    gpn = ns.target_gpus_per_node or _env_int("GPUS_PER_NODE") or (
        None if targeted else local) or None
    nodes = ns.target_nodes or _env_int("NNODES") or (
        world // local if world and local and not targeted else None)
    if nodes is None:
        nodes = max(1, math.ceil(mp / (gpn or hw.gpus_per_node)))
    return ClusterSpec(hardware=hw, num_nodes=nodes, gpus_per_node=gpn)


def default_target_note(ns, cluster: ClusterSpec) -> str | None:
    """What the target defaults to, when no flag or environment variable names it: a
    rule broken by that default (a batch too small for its data parallelism) reads as
    the user's mistake unless the message says where the cluster came from."""
    named = bool(ns.target_nodes or ns.target_hardware or ns.target_gpus_per_node
                 or os.environ.get("PRIMUS_TARGET_HARDWARE") or _env_int("NNODES")
                 or _env_int("WORLD_SIZE"))
    if named:
        return None
    return (f"target: the default, {cluster.num_nodes} node(s) x {cluster.node_size} "
            f"{cluster.hardware.name}, since no --target-nodes / --target-gpus-per-node / "
            "--target-hardware was given; name the target, e.g. --target-hardware cpu "
            "--target-nodes 1 --target-gpus-per-node 1")
