"""Cluster planning: the Pareto front of throughput against cost.

When the space spans several cluster sizes or GPU kinds, each (hardware, num_nodes)
contributes its best layout; the front keeps those no other beats on both cluster
throughput (tokens/s, higher is better: time to train) and cost per million tokens
(lower is better; GPU-hours per million tokens when no price is known).
"""
from __future__ import annotations

from primus_ext.tune.evaluate import Trial
from primus_ext.tune.space import IDX


def gpu_hours_per_mtok(metrics: dict) -> float:
    return 1e6 / metrics["tokens_per_s_per_gpu"] / 3600.0


def _cost(t: Trial) -> float:
    c = t.metrics.get("cost_per_mtok")
    return c if c is not None else gpu_hours_per_mtok(t.metrics)


def pareto_front(ok_trials: list[Trial], space) -> list[Trial]:
    """Best layout per cluster, non-dominated ones only, by throughput (empty when the
    space holds a single cluster)."""
    if len(space.axes["num_nodes"]) * len(space.axes["hardware"]) < 2:
        return []
    per_cluster: dict = {}
    for t in ok_trials:  # best first
        key = (t.point[IDX["hardware"]], t.point[IDX["num_nodes"]])
        cur = per_cluster.get(key)
        if cur is None or t.metrics["tokens_per_s"] > cur.metrics["tokens_per_s"]:
            per_cluster[key] = t
    pts = list(per_cluster.values())
    front = [t for t in pts
             if not any(o is not t and o.metrics["tokens_per_s"] >= t.metrics["tokens_per_s"]
                        and _cost(o) <= _cost(t)
                        and (o.metrics["tokens_per_s"] > t.metrics["tokens_per_s"]
                             or _cost(o) < _cost(t)) for o in pts)]
    return sorted(front, key=lambda t: -t.metrics["tokens_per_s"])


def cluster_bests(ok_trials: list[Trial]) -> list[Trial]:
    """Best layout (by objective) of each cluster, in objective order."""
    seen, out = set(), []
    for t in ok_trials:
        key = (t.point[IDX["hardware"]], t.point[IDX["num_nodes"]])
        if key not in seen:
            seen.add(key)
            out.append(t)
    return out
