"""Candidate evaluation split over workers, merged so the result is a one-process run's.

Shard ``i`` of ``n`` scores its share of the candidates (memory model, then the
projector: a pure function of the point) and writes them, one trial record a line, to
``shard-<i>-of-<n>.jsonl``. The driver then runs the tuner as in one process, with
every shard's scores at hand (``Evaluator(prefetched=...)``): the search visits the
points in its own order, takes each point's verdict and figures from the shards instead
of computing them (and computes any point no shard scored), and writes the journal,
report and recipe it would have written alone. The shares (``shard_plan``):

- ``points``: an exhaustive search knows its candidates up front, the legal points in
  enumeration order; shard i takes points i, i + n, i + 2n, ...
- ``clusters``: a guided search over several clusters (``num_nodes`` x ``hardware``)
  searches each cluster on its own from the same seeds (``tune.run._plan_clusters``);
  shard i runs the searches of clusters i, i + n, ...
- None: one guided search decides each step from the last: nothing to hand out.
"""
from __future__ import annotations

import json
from pathlib import Path

from primus_ext.spec import RunSpec
from primus_ext.tune.settings import TuneSettings
from primus_ext.tune.space import AXES, Point, SearchSpace, space_of

SHARD_KIND = "shard"


def shard_file(out_dir: str | Path, index: int, count: int) -> Path:
    return Path(out_dir) / f"shard-{index:04d}-of-{count:04d}.jsonl"


def check_count(count) -> int:
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"shards={count!r} must be an integer >= 1 (the number of "
                         "workers that score the candidates)")
    return count


def _clusters(space: SearchSpace) -> list[tuple]:
    # In tune.run.tune's order.
    return [(n, h) for n in space.axes["num_nodes"] for h in space.axes["hardware"]]


def _strategy(space: SearchSpace, settings: TuneSettings) -> str:
    # As tune.run.tune decides it: ``auto`` is exhaustive when the legal points fit the
    # candidate budget of every cluster.
    if settings.strategy != "auto":
        return settings.strategy
    budget = settings.max_candidates * len(_clusters(space))
    return "exhaustive" if space.num_legal <= budget else "guided"


def shard_plan(space: SearchSpace, settings: TuneSettings) -> str | None:
    """How the search splits over shards: "points", "clusters" or None (see above)."""
    if _strategy(space, settings) == "exhaustive":
        return "points"
    return "clusters" if len(_clusters(space)) > 1 else None


def planned_points(space: SearchSpace, settings: TuneSettings) -> list[Point] | None:
    """Every point an exhaustive search scores, in its order; None for a guided one."""
    return list(space.legal_points()) if shard_plan(space, settings) == "points" else None


def shard_points(points: list[Point], index: int, count: int) -> list[Point]:
    """Shard ``index`` of ``count``: every count-th point from ``index`` (round robin
    spreads the expensive corners of the space over the workers)."""
    check_count(count)
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < count:
        raise ValueError(f"shard index={index!r} must be an integer in [0, {count})")
    return points[index::count]


def evaluate_shard(spec: RunSpec, settings: TuneSettings, index: int, count: int,
                   out_dir: str | Path, *, memory_fn=None, project_fn=None) -> Path:
    """Score shard ``index`` of ``count`` (see ``shard_plan``); write its journal."""
    from primus_ext.tune.evaluate import Evaluator
    from primus_ext.util.files import atomic_write_text

    space = space_of(spec, settings)
    how = shard_plan(space, settings)
    if how is None:
        raise ValueError("sharded evaluation needs an exhaustive search or a guided one "
                         "over several clusters (tune.space.num_nodes / hardware): one "
                         "guided search picks each candidate from the last one")
    ev = Evaluator(space, settings, memory_fn=memory_fn, project_fn=project_fn)
    head = {"kind": SHARD_KIND, "index": index, "count": count, "plan": how}
    if how == "points":
        points = space.legal_points()
        head["num_points"] = len(points)
        ev.settings = settings.replace(max_candidates=10**12, max_seconds=None)
        if index == 0:  # the planner's seeds and the reference, as tune() scores them
            _seeds(ev, spec, fixed=())
        for point in shard_points(points, index, count):
            ev.evaluate(point, "exhaustive", enforce_budget=False)
    else:
        _search_clusters(ev, spec, _clusters(space),
                         shard_points(_clusters(space), index, count))
    lines = [json.dumps(head)] + [json.dumps(_record(t)) for t in ev.trials]
    return atomic_write_text(shard_file(out_dir, index, count), "\n".join(lines) + "\n")


def _search_clusters(ev, spec: RunSpec, clusters: list[tuple], mine: list[tuple]) -> None:
    """The guided searches of the clusters ``mine``, as ``tune.run.tune`` runs each of
    them: the planner's seeds at the user's layout, then one search per cluster under
    the same budget (a shard reaches each of its clusters with no more candidates spent
    than the whole search, so it scores at least what the whole search scores there)."""
    from primus_ext.tune.evaluate import BudgetExhausted
    from primus_ext.tune.run import CLUSTER_AXES, _plan_clusters
    from primus_ext.tune.space import point_of

    base = point_of(spec)
    seeds = _seeds(ev, spec, fixed=CLUSTER_AXES)
    if mine:
        try:
            _plan_clusters(ev, clusters, base, seeds, ev.settings.restarts, only=mine)
        except BudgetExhausted:
            pass


def _seeds(ev, spec: RunSpec, fixed: tuple) -> list:
    """What ``tune.run.tune`` scores before its search, in its order: the planner's seeds
    around the user's layout, then the reference layout of the same job."""
    from primus_ext.tune.planner import plan
    from primus_ext.tune.run import score_references
    from primus_ext.tune.space import point_of

    _, _, seeds = plan(ev, point_of(spec), fixed=fixed)
    score_references(ev, spec)
    return seeds


def _record(trial) -> dict:
    from primus_ext.util.values import json_safe
    return json_safe(trial.to_record())


def read_shards(out_dir: str | Path, count: int) -> dict[Point, dict]:
    """Every shard's records by point. Raises ValueError naming a missing or foreign
    shard file, or a point two shards scored differently."""
    check_count(count)
    merged: dict[Point, dict] = {}
    sizes, plans = set(), set()
    for index in range(count):
        path = shard_file(out_dir, index, count)
        if not path.is_file():
            raise ValueError(f"{path}: shard {index} of {count} wrote no results (its job "
                             "failed or has not finished)")
        rows = [json.loads(line) for line in path.read_text().splitlines() if line]
        head = rows[0] if rows else {}
        if head.get("kind") != SHARD_KIND or (head.get("index"), head.get("count")) != (
                index, count):
            raise ValueError(f"{path}: not the results of shard {index} of {count}")
        sizes.add(head.get("num_points"))
        plans.add(head.get("plan"))
        for rec in rows[1:]:
            point = tuple(rec["candidate"].get(a) for a in AXES)
            old = merged.get(point)
            if old is not None and _score_of(old) != _score_of(rec):
                raise ValueError(f"{path}: point {rec['candidate']} scored differently by "
                                 "two shards")
            merged.setdefault(point, rec)
    # points: every legal point (shard 0 adds the planner's, which may be off the axes)
    if len(plans) != 1 or len(sizes) != 1 or (
            plans == {"points"} and len(merged) < next(iter(sizes))):
        raise ValueError(f"shards in {out_dir}: {len(merged)} points scored, the shards "
                         "planned different searches (another job's shard files?)")
    return merged


def _score_of(rec: dict) -> tuple:
    return rec.get("verdict"), rec.get("reason"), json.dumps(rec.get("estimate"),
                                                              sort_keys=True)
