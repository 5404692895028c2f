"""Search strategies over a SearchSpace, scored by an Evaluator.

- ``exhaustive``: every legal point, in enumeration order (no budget: it is the
  reference the guided search is measured against).
- ``guided``: coordinate descent with restarts, seeded by the planner. A move sweeps
  one axis, or a pair (or the TP x PP x CP triple) of axes that legality or memory couple (tp with pp: their product
  sets the data-parallel size the global batch must divide; recompute with the micro
  batch: memory), with the rest held; the best fitting point of the sweep becomes the
  incumbent when it improves. A descent ends when a whole round of sweeps finds nothing
  better; restarts begin from the best seeds of *other* layouts (tp, pp, cp, ep), so a
  second basin gets its chance. The candidate and time budgets stop it anywhere.
"""
from __future__ import annotations

import itertools

from primus_ext.tune.evaluate import BudgetExhausted, Evaluator, Trial
from primus_ext.tune.planner import SWEEP_ORDER, relieve
from primus_ext.tune.space import IDX, Point

# Pairs swept jointly, most coupled first.
PAIRS = (("tp", "pp"), ("pp", "vpp"), ("recompute", "micro_batch_size"), ("tp", "cp"),
         ("pp", "cp"), ("ep", "etp"), ("ep", "tp"), ("ep", "pp"), ("tp", "micro_batch_size"),
         ("pp", "micro_batch_size"), ("recompute", "tp"), ("recompute", "pp"),
         ("sharding", "recompute"), ("vpp", "micro_batch_size"), ("cp", "micro_batch_size"),
         ("num_nodes", "tp"), ("num_nodes", "pp"), ("hardware", "tp"),
         ("hardware", "pp"), ("precision", "recompute"),
         # The model-parallel split as a whole: TP x PP x CP trade against each other
         # at a fixed DP (a pair move cannot go from TP2 PP2 CP1 to TP1 PP4 CP2).
         ("tp", "pp", "cp"))
# A move must beat the incumbent by this fraction (float noise is no improvement).
MIN_GAIN = 1e-9
_LAYOUT = ("num_nodes", "hardware", "tp", "pp", "cp", "ep")


def exhaustive(ev: Evaluator, source: str = "exhaustive") -> None:
    for p in ev.space.legal_points():
        ev.evaluate(p, source)


def _sweeps(space, fixed: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    live = {a for a in SWEEP_ORDER if len(space.axes[a]) > 1 and a not in fixed}
    singles = [(a,) for a in SWEEP_ORDER if a in live]
    pairs = [p for p in PAIRS if p[0] in live and p[1] in live]
    return singles + pairs


# Axes whose legal values depend on others (vpp on pp and the layer count; the micro
# batch on the data-parallel size the global batch must divide): a swept point that is
# illegal only through them is moved to their nearest legal values.
DEPENDENT = ("vpp", "micro_batch_size")


def _nearest(values, current) -> list:
    return sorted(values, key=lambda v: (abs(v - current), v))


def _legalize(space, p: Point, swept: tuple[str, ...]) -> Point | None:
    if space.spec(p) is not None:
        return p
    free = [a for a in DEPENDENT if a not in swept]
    choices = [_nearest(space.axes[a], p[IDX[a]]) for a in free]
    for values in sorted(itertools.product(*choices),
                         key=lambda vs: sum(abs(v - p[IDX[a]]) / max(p[IDX[a]], 1)
                                            for a, v in zip(free, vs))):
        q = space.vary(p, **dict(zip(free, values)))
        if space.spec(q) is not None:
            return q
    return None


def _sweep(ev: Evaluator, center: Point, axes: tuple[str, ...]) -> list[Point]:
    space = ev.space
    out, seen = [], {center}
    for values in itertools.product(*(space.axes[a] for a in axes)):
        if all(center[IDX[a]] == v for a, v in zip(axes, values)):
            continue
        p = _legalize(space, space.vary(center, **dict(zip(axes, values))), axes)
        if p is not None and p not in seen:
            seen.add(p)
            out.append(p)
    return out


def descend(ev: Evaluator, start: Trial, source: str = "search",
            fixed: tuple[str, ...] = ()) -> Trial:
    """Coordinate descent from ``start`` (a fitting, scored trial); ``fixed`` axes stay."""
    current = start
    sweeps = _sweeps(ev.space, fixed)
    improved = True
    while improved:
        improved = False
        for axes in sweeps:
            best = current
            for p in _sweep(ev, current.point, axes):
                t = relieve(ev, ev.evaluate(p, source), source, best=True)
                if t.verdict == "ok" and t.score > best.score + abs(best.score) * MIN_GAIN:
                    best = t
            if best is not current:
                current, improved = best, True
    return current


def _layout(point: Point) -> tuple:
    return tuple(point[IDX[a]] for a in _LAYOUT)


def guided(ev: Evaluator, seeds: list[Trial], restarts: int,
           fixed: tuple[str, ...] = ()) -> Trial | None:
    """Descents from the best seeds of ``restarts`` distinct layouts (with ``fixed``
    axes held at the seeds' values: one cluster of a cluster-planning run)."""
    def same(t: Trial) -> bool:
        return all(t.point[IDX[a]] == seeds[0].point[IDX[a]] for a in fixed)

    ranked = sorted((t for t in seeds if t.verdict == "ok" and same(t)),
                    key=lambda t: (-t.score, t.index))
    best: Trial | None = ranked[0] if ranked else None
    tried: set = set()
    try:
        for _ in range(restarts):
            start = next((t for t in ranked if _layout(t.point) not in tried), None)
            if start is None:
                break
            tried.add(_layout(start.point))
            end = descend(ev, start, fixed=fixed)
            tried.add(_layout(end.point))
            if best is None or end.score > best.score:
                best = end
            # Later starts: seeds re-ranked with everything learnt so far.
            ranked = [t for t in ev.ok_trials() if same(t)]
    except BudgetExhausted:
        pass
    return best
