"""Which ranks a process group spans: nodes, scale-up domains, ranks per domain.

Ranks are laid out as megatron-core's ``RankGenerator`` lays them out
(``megatron/core/parallel_state.py``): the axes of ``parallel.order`` (default
``tp-cp-ep-dp-pp``) vary fastest first, so an axis' stride is the product of the sizes
of the axes before it. megatron-core uses two generators over the same ranks:

- the dense one, ``tp, cp, ep=1, dp, pp`` (attention, dense MLPs, embedding);
- the expert one, ``tp=etp, cp=1, ep, dp=expert_dp, pp`` (routed experts).

Group axes: ``tp, cp, dp, pp`` and ``dp_cp`` (the gradient group of dense parameters:
data x context parallel) from the dense layout; ``ep, etp, edp`` from the expert layout.
All groups of one axis are translates of the group holding rank 0; that group is the
representative (exact when the degrees divide the node size, as they do in practice).

A scale-up domain is the set of GPUs one NVLink / Infinity Fabric fabric joins: the node
on DGX/HGX and MI300X (8 GPUs), 72 GPUs (18 four-GPU trays) on GB200 NVL72.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from primus_ext.spec.cluster import ClusterSpec
from primus_ext.spec.run import RunSpec

DENSE_AXES = ("tp", "cp", "dp", "pp", "dp_cp")
EXPERT_AXES = ("ep", "etp", "edp")


@dataclass(frozen=True, slots=True)
class GroupSpan:
    """Where the representative group of one axis lies."""
    axis: str
    size: int  # ranks in the group
    num_nodes: int  # distinct nodes it touches
    num_domains: int  # distinct scale-up domains it touches
    ranks_per_node: int  # most ranks of the group on one node
    ranks_per_domain: int  # most ranks of the group in one domain
    domain_size: int  # GPUs per scale-up domain (for mesh link counts)

    @property
    def intra_domain(self) -> bool:
        return self.num_domains == 1


def domain_size(cluster: ClusterSpec) -> int:
    """GPUs per scale-up domain in this cluster.

    A rack-scale domain (the preset's domain is larger than its node, GB200 NVL72) keeps
    its size; otherwise the domain is the node, capped by the cluster's node size (a
    4-GPU node of H100 is a 4-GPU NVLink domain). Never larger than the world.
    """
    hw = cluster.hardware
    node = cluster.node_size
    dom = hw.scale_up_domain_gpus
    if dom > hw.gpus_per_node and dom % node == 0:
        size = dom
    else:
        size = min(dom, node)
    return max(1, min(size, cluster.world_size))


def _layout(spec: RunSpec, expert: bool) -> tuple[tuple[str, int], ...]:
    p = spec.parallel
    if expert:
        sizes = {"tp": p.expert_tp, "cp": 1, "ep": p.ep, "dp": spec.expert_dp, "pp": p.pp}
    else:
        sizes = {"tp": p.tp, "cp": p.cp, "ep": 1, "dp": spec.dp, "pp": p.pp}
    return tuple((a, sizes[a]) for a in p.order.split("-"))


@lru_cache(maxsize=4096)
def _span(layout: tuple[tuple[str, int], ...], axes: tuple[str, ...], node: int,
          dom: int, name: str) -> GroupSpan:
    stride = 1
    dims = []  # (size, stride) of the group's axes
    for a, n in layout:
        if a in axes:
            dims.append((n, stride))
        stride *= n
    members = [0]
    for n, st in dims:
        members = [r + i * st for r in members for i in range(n)]
    nodes: dict[int, int] = {}
    doms: dict[int, int] = {}
    for r in members:
        nodes[r // node] = nodes.get(r // node, 0) + 1
        doms[r // dom] = doms.get(r // dom, 0) + 1
    return GroupSpan(axis=name, size=len(members), num_nodes=len(nodes),
                     num_domains=len(doms), ranks_per_node=max(nodes.values()),
                     ranks_per_domain=max(doms.values()), domain_size=dom)


_SPANS: dict = {}


def group_span(spec: RunSpec, axis: str) -> GroupSpan:
    """The span of the group of ``axis`` (see the module docstring for the names)."""
    c = spec.cluster
    hw = c.hardware
    # Memoised on what the span depends on (layout, world, node and domain sizes): hashing
    # a whole RunSpec or HardwareSpec per call would cost more than the lookup saves.
    key = (spec.parallel, c.num_nodes, c.gpus_per_node, hw.gpus_per_node,
           hw.scale_up_domain_gpus, axis)
    hit = _SPANS.get(key)
    if hit is None:
        if len(_SPANS) > 16384:
            _SPANS.clear()
        hit = _SPANS[key] = _group_span_uncached(spec, axis)
    return hit


def _group_span_uncached(spec: RunSpec, axis: str) -> GroupSpan:
    if axis in DENSE_AXES:
        layout = _layout(spec, expert=False)
        axes = ("dp", "cp") if axis == "dp_cp" else (axis,)
    elif axis in EXPERT_AXES:
        layout = _layout(spec, expert=True)
        axes = {"ep": ("ep",), "etp": ("tp",), "edp": ("dp",)}[axis]
    else:
        raise ValueError(f"group axis {axis!r} must be one of "
                         f"{', '.join(DENSE_AXES + EXPERT_AXES)}")
    return _span(layout, axes, spec.cluster.node_size, domain_size(spec.cluster), axis)


@lru_cache(maxsize=1024)
def _pp_crossings(layout: tuple[tuple[str, int], ...], dom: int) -> tuple[bool, ...]:
    stride = 1
    pp = 1
    for a, n in layout:
        if a == "pp":
            pp = n
            break
        stride *= n
    return tuple((s * stride) // dom != ((s + 1) * stride) // dom for s in range(pp - 1))


def pp_boundary_crosses_domain(spec: RunSpec) -> tuple[bool, ...]:
    """For each boundary between stage i and i+1: whether the send leaves the domain."""
    return _pp_crossings(_layout(spec, expert=False), domain_size(spec.cluster))
