"""Candidate evaluation split over workers, merged so the result is a one-process run's.

An exhaustive search knows its candidates up front: ``SearchSpace.legal_points()``, in
enumeration order. Shard ``i`` of ``n`` scores points ``i, i + n, i + 2n, ...`` (memory
model, then the projector: a pure function of the point) and writes them, one trial
record a line, to ``shard-<i>-of-<n>.jsonl``. The driver then runs the tuner as in one
process, with every shard's scores at hand (``Evaluator(prefetched=...)``): the search
visits the points in its own order, takes each point's verdict and figures from the
shards instead of computing them, and writes the journal, report and recipe it would
have written alone. A guided search decides each step from the last one, so it has
nothing to hand out ahead and runs in the driver (``planned_points`` returns None).
"""
from __future__ import annotations

import json
from pathlib import Path

from primus_ext.spec import RunSpec
from primus_ext.tune.settings import TuneSettings
from primus_ext.tune.space import AXES, Point, SearchSpace

SHARD_KIND = "shard"


def shard_file(out_dir: str | Path, index: int, count: int) -> Path:
    return Path(out_dir) / f"shard-{index:04d}-of-{count:04d}.jsonl"


def check_count(count) -> int:
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"shards={count!r} must be an integer >= 1 (the number of "
                         "workers that score the candidates)")
    return count


def planned_points(space: SearchSpace, settings: TuneSettings) -> list[Point] | None:
    """The candidates a search will score, when known before it starts: every legal
    point for the exhaustive strategy (``auto`` picks it when the legal points fit the
    candidate budget of every cluster, as ``tune.run.tune`` does), else None."""
    strategy = settings.strategy
    if strategy == "auto":
        clusters = len(space.axes["num_nodes"]) * len(space.axes["hardware"])
        strategy = ("exhaustive" if space.num_legal <= settings.max_candidates * clusters
                    else "guided")
    return list(space.legal_points()) if strategy == "exhaustive" else None


def shard_points(points: list[Point], index: int, count: int) -> list[Point]:
    """Shard ``index`` of ``count``: every count-th point from ``index`` (round robin
    spreads the expensive corners of the space over the workers)."""
    check_count(count)
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < count:
        raise ValueError(f"shard index={index!r} must be an integer in [0, {count})")
    return points[index::count]


def evaluate_shard(spec: RunSpec, settings: TuneSettings, index: int, count: int,
                   out_dir: str | Path, *, memory_fn=None, project_fn=None) -> Path:
    """Score shard ``index`` of ``count`` of the planned points; write its journal."""
    from primus_ext.tune.evaluate import Evaluator
    from primus_ext.util.files import atomic_write_text

    space = SearchSpace(spec, settings.space)
    points = planned_points(space, settings)
    if points is None:
        raise ValueError("sharded evaluation needs the exhaustive strategy (the guided "
                         "search picks each candidate from the last one)")
    ev = Evaluator(space, settings, memory_fn=memory_fn, project_fn=project_fn)
    lines = [json.dumps({"kind": SHARD_KIND, "index": index, "count": count,
                         "num_points": len(points)})]
    for point in shard_points(points, index, count):
        trial = ev.evaluate(point, "exhaustive", enforce_budget=False)
        lines.append(json.dumps(_record(trial)))
    return atomic_write_text(shard_file(out_dir, index, count), "\n".join(lines) + "\n")


def _record(trial) -> dict:
    from primus_ext.util.values import json_safe
    return json_safe(trial.to_record())


def read_shards(out_dir: str | Path, count: int) -> dict[Point, dict]:
    """Every shard's records by point. Raises ValueError naming a missing or foreign
    shard file, or a point scored twice."""
    check_count(count)
    merged: dict[Point, dict] = {}
    sizes = set()
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
        for rec in rows[1:]:
            point = tuple(rec["candidate"].get(a) for a in AXES)
            if point in merged:
                raise ValueError(f"{path}: point {rec['candidate']} scored by two shards")
            merged[point] = rec
    if len(sizes) != 1 or len(merged) != sizes.pop():
        raise ValueError(f"shards in {out_dir}: {len(merged)} points scored, the shards "
                         "planned different spaces (another job's shard files?)")
    return merged
