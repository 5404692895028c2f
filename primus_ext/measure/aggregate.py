"""Aggregation of a measured run: hook samples -> per-kind medians, traced calls ->
collectives per layer kind, and the merge over ranks (pure Python over torch.distributed
object gathers).
"""
from __future__ import annotations

import dataclasses
from collections import defaultdict

import torch.distributed as dist

from primus_ext.measure.hooks import LayerTimer, _median
from primus_ext.project.profile import CollectiveSeen
from primus_ext.spec import RunSpec

IN_LAYER_AXES = ("tp", "cp", "ep", "etp", "tp_ep")
_BYTES_SIDE = {"all_gather": "out", "reduce_scatter": "in", "all_reduce": "in",
               "all_to_all": "in", "p2p": "in", "broadcast": "in", "reduce": "in"}


def _kind_of(spec: RunSpec, scope: str) -> tuple[str, str]:
    """(kind, part) of a tracer/timer scope."""
    if scope.startswith("layer."):
        bits = scope.split(".")
        i = int(bits[1])
        return ("moe" if spec.model.is_moe_layer(i) else "dense"), (
            bits[2] if len(bits) > 2 else "layer")
    if scope in ("embedding", "output"):
        return scope, "layer"
    return "step", "step"


def _timings(spec: RunSpec, timer: LayerTimer) -> dict[str, dict]:
    """kind -> {fwd, bwd, parts, n_layers, n_samples}: per step, the mean over the
    kind's layers and microbatches (what a step pays: rare slow calls such as a oneDNN
    kernel compiled for a new MoE expert shape included), then the median over steps."""
    per_step: dict[tuple[str, str, str], dict[int, list[float]]] = defaultdict(
        lambda: defaultdict(list))
    layers: dict[str, set] = defaultdict(set)
    counts: dict[tuple[str, str, str], int] = defaultdict(int)
    for (scope, phase), steps in timer.per_step.items():
        kind, part = _kind_of(spec, scope)
        for k, xs in enumerate(steps):
            per_step[(kind, part, phase)][k].extend(xs)
            counts[(kind, part, phase)] += len(xs)
        layers[kind].add(scope.split(".")[1] if scope.startswith("layer.") else scope)
    out: dict[str, dict] = {}
    for (kind, part, phase), steps in per_step.items():
        value = _median([sum(xs) / len(xs) for xs in steps.values() if xs])
        d = out.setdefault(kind, {"parts": {}, "n_layers": len(layers[kind])})
        if part == "layer":
            d[phase] = value
            d["n_samples"] = max(d.get("n_samples", 0), counts[(kind, part, phase)])
        else:
            d["parts"].setdefault(part, {})[phase] = value
    return out


def _collectives(spec: RunSpec, records, n_layers: dict[str, int], samples: int,
                 steps: int, timed_records=None
                 ) -> tuple[list[CollectiveSeen], dict[str, dict[str, dict[str, float]]]]:
    """Collectives seen per kind; and their seconds per layer per microbatch by
    kind -> axis -> phase. ``timed_records`` (a step traced with device syncs, on CUDA)
    gives the seconds when the plain records only hold launch times. Otherwise (the
    host's clock, a CPU) each kind's collective seconds are the time the rank was blocked
    in them (an async op overlapped with a GEMM counts its ``wait()`` only), as the mean
    per call (what a step pays), and ``CollectiveSeen.blocked_s`` keeps it per call."""
    groups: dict[tuple, list] = defaultdict(list)
    secs_of: dict[tuple, list] = defaultdict(list)
    blocked_of: dict[tuple, list] = defaultdict(list)
    comm_s: dict = defaultdict(lambda: defaultdict(lambda: {"fwd": 0.0, "bwd": 0.0}))
    cp = spec.parallel.cp

    def key_of(r):
        kind, part = _kind_of(spec, r.scope)
        axis = "dp" if r.axis == "dp_cp" and cp == 1 else r.axis
        phase = r.phase if kind != "step" else "step"
        return (kind, part, r.op, r.collective, axis, phase, r.group_size, r.dtype)

    for r in records:
        nbytes = r.out_bytes if _BYTES_SIDE.get(r.collective) == "out" else r.in_bytes
        groups[key_of(r)].append(nbytes)
        secs_of[key_of(r)].append((nbytes, r.seconds))
        if r.blocked_s is not None:
            blocked_of[key_of(r)].append((nbytes, r.blocked_s))
    if timed_records:
        secs_of = defaultdict(list)
        for r in timed_records:
            nbytes = r.out_bytes if _BYTES_SIDE.get(r.collective) == "out" else r.in_bytes
            secs_of[key_of(r)].append((nbytes, r.seconds))
    seen = []
    for key, xs in sorted(groups.items()):
        kind, part, op, coll, axis, phase, size, dtype = key
        per = steps if kind == "step" else max(n_layers.get(kind, 1), 1) * samples
        for lo, hi in _size_classes(xs):
            cls = [x for x in xs if lo <= x <= hi]
            count = len(cls) / per
            secs = _median([t for b, t in secs_of.get(key, []) if lo <= b <= hi] or [0.0])
            held = [t for b, t in blocked_of.get(key, []) if lo <= b <= hi]
            blocked = sum(held) / len(held) if held and not timed_records else None
            seen.append(CollectiveSeen(kind=kind, part=part, op=op, collective=coll,
                                       axis=axis, phase=phase, group_size=size,
                                       num_bytes=sum(cls) / len(cls), count=count,
                                       seconds=secs, dtype=dtype, blocked_s=blocked))
            if kind != "step" and phase in ("fwd", "bwd"):
                comm_s[kind][axis][phase] += count * (secs if blocked is None else blocked)
    return seen, {k: {a: dict(v) for a, v in d.items()} for k, d in comm_s.items()}


def _size_classes(sizes: list[float], gap: float = 16.0) -> list[tuple[float, float]]:
    """Split call sizes where consecutive sorted sizes jump by more than ``gap``x: the
    MoE dispatcher sends tokens (h values per row) and their routing weights (one value
    per row) through the same all-to-all, and routing makes both vary per call."""
    xs = sorted(sizes)
    classes, lo = [], xs[0]
    for a, b in zip(xs, xs[1:]):
        if b > gap * max(a, 1):
            classes.append((lo, a))
            lo = b
    classes.append((lo, xs[-1]))
    return classes


def _mean_over_ranks(values: dict[str, int]) -> dict[str, int]:
    """Mean over ranks: routed-expert activations vary per rank with the routing, their
    sum over the expert-parallel group does not."""
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, values)
    keys = set().union(*everyone)
    return {k: int(round(sum(r.get(k, 0) for r in everyone) / len(everyone))) for k in keys}


def _gather_collectives(seen: list[CollectiveSeen]) -> list[CollectiveSeen]:
    """Mean bytes and counts over ranks (routing makes MoE all-to-all sizes differ per
    rank; the mean over ranks is exact), the slowest rank's seconds, the mean blocked
    time (``_mean_comm`` takes the same mean of the seconds inside the layers)."""
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, [dataclasses.asdict(c) for c in seen])
    by: dict[tuple, list[dict]] = defaultdict(list)
    for rows in everyone:
        for c in rows:
            by[(c["kind"], c["part"], c["op"], c["collective"], c["axis"], c["phase"],
                c["group_size"], c["dtype"])].append(c)
    n = len(everyone)
    out = []
    for key, rows in sorted(by.items()):
        for lo, hi in _size_classes([r["num_bytes"] for r in rows]):
            cls = [r for r in rows if lo <= r["num_bytes"] <= hi]
            base = dict(cls[0])
            base["num_bytes"] = sum(r["num_bytes"] * r["count"] for r in cls) / max(
                sum(r["count"] for r in cls), 1e-12)
            base["count"] = sum(r["count"] for r in cls) / n
            base["seconds"] = max(r["seconds"] for r in cls)
            held = [r.get("blocked_s") for r in cls]
            base["blocked_s"] = None if None in held else sum(held) / len(held)
            out.append(CollectiveSeen(**base))
    return out


def _mean_comm(comm_s: dict[str, dict[str, dict[str, float]]]) -> dict:
    """kind -> axis -> phase collective seconds, the mean over ranks (the rank that
    reaches a collective first waits in it, the other computes meanwhile)."""
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, comm_s)
    out: dict = {}
    for rank in everyone:
        for kind, axes in rank.items():
            for axis, phases in axes.items():
                d = out.setdefault(kind, {}).setdefault(axis, {"fwd": 0.0, "bwd": 0.0})
                for ph, v in phases.items():
                    d[ph] = d.get(ph, 0.0) + v / len(everyone)
    return out


def _gather_max(local: dict[str, dict]) -> tuple[dict[str, dict], list[dict]]:
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, local)
    merged: dict[str, dict] = {}
    for kind in local:
        m = dict(local[kind])
        for phase in ("fwd", "bwd"):
            vals = [r[kind].get(phase, 0.0) for r in everyone if kind in r]
            m[phase] = max(vals)
            m[f"per_rank_{phase}"] = tuple(vals)
        merged[kind] = m
    return merged, everyone


def _part_comm(spec: RunSpec, records, n_layers: dict[str, int], samples: int,
               blocked: bool = False) -> dict[tuple[str, str, str], float]:
    """Collective seconds per (kind, part, phase), per layer per microbatch (``blocked``:
    the time the rank was blocked in them, as ``_collectives`` takes it on the host
    clock)."""
    out: dict[tuple[str, str, str], float] = defaultdict(float)
    for r in records:
        kind, part = _kind_of(spec, r.scope)
        if kind == "step" or r.phase not in ("fwd", "bwd"):
            continue
        t = r.blocked_s if blocked and r.blocked_s is not None else r.seconds
        out[(kind, part, r.phase)] += t / (max(n_layers.get(kind, 1), 1) * samples)
    return dict(out)
