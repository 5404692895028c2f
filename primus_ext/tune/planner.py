"""Seed planner: the baseline, then one axis at a time around it (deterministic).

The baseline is the user's layout (the composed config's parallel and train groups).
When it is illegal, the nearest legal point stands in (fewest axes changed, ties broken
by axis order); when it does not fit in memory, memory relief is applied (heavier
recompute, FSDP, a smaller micro batch) until it does. Around the baseline every axis is
swept alone, in the order of its usual impact on step time (recompute and micro batch
first, as in the reference agent's plan), and a sweep value that does not fit gets the
same memory relief once.
"""
from __future__ import annotations

from primus_ext.memory.fit_ladder import cheapest_fit
from primus_ext.tune.evaluate import BudgetExhausted, Evaluator, Trial
from primus_ext.tune.points import recompute_label
from primus_ext.tune.space import AXES, IDX, Point, SearchSpace, parse_recompute

# Sweep order: what usually moves step time most first.
SWEEP_ORDER = ("recompute", "micro_batch_size", "pp", "vpp", "tp", "cp", "ep", "etp",
               "sharding", "schedule", "sequence_parallel", "tp_comm_overlap",
               "overlap_grad_reduce", "overlap_param_gather", "precision", "num_nodes",
               "hardware")
assert set(SWEEP_ORDER) == set(AXES)

_RELIEF_RANK = {None: 0, "selective": 1, "full": 2}


def _relief(space: SearchSpace, point: Point) -> list[Point]:
    """Variants of ``point`` that use less memory, gentlest first."""
    d = dict(zip(AXES, point))
    out = []
    rank = _RELIEF_RANK[parse_recompute(d["recompute"])[0]]
    heavier = [r for r in space.axes["recompute"] if _RELIEF_RANK[parse_recompute(r)[0]] > rank]
    for r in heavier:
        out.append(space.vary(point, recompute=r))
    if d["sharding"] != "fsdp" and "fsdp" in space.axes["sharding"]:
        out.append(space.vary(point, sharding="fsdp"))
        out += [space.vary(point, sharding="fsdp", recompute=r) for r in heavier]
    for m in sorted(space.axes["micro_batch_size"], reverse=True):
        if m < d["micro_batch_size"]:
            out.append(space.vary(point, micro_batch_size=m))
            out += [space.vary(point, micro_batch_size=m, recompute=r) for r in heavier]
    return [p for p in out if p != point]


def _ladder(ev: Evaluator, point: Point) -> list[Point]:
    """The point with the fit ladder's recompute (memory/fit_ladder.py: selective, the
    fewest block-recomputed layers, full), as the published-run reader chooses it; it
    may be off the recompute axis (e.g. 'full-block-3'). Empty when the evaluator's
    memory model is not a MemoryReport (a test double) or nothing fits."""
    spec = ev.space.spec(point)
    if spec is None or ev.memory_options is None or spec.framework == "torchtitan":
        # torchtitan's relief is its activation-checkpoint axis (none, selective, full),
        # which _relief walks; the ladder's rungs are megatron-core's recompute flags.
        return []
    # A point's recompute label carries no module list: selective keeps the spec's own.
    choice = cheapest_fit(spec, memory_fn=ev.memory_fn,
                          module_sets=[tuple(spec.train.recompute_modules)])
    if not choice.fits or choice.step == "as_stated":
        return []
    t = choice.spec.train
    d = dict(zip(AXES, point))
    d["recompute"] = recompute_label(t.recompute_granularity, t.recompute_method,
                                     t.recompute_num_layers)
    return [ev.space.normalize(tuple(d[a] for a in AXES))]


def relieve(ev: Evaluator, trial: Trial, source: str, best: bool = False) -> Trial:
    """``trial`` if it fits, else a memory-relief variant that does: the first one, or
    with ``best`` the best-scoring of them (the cheapest relief is not known upfront:
    FSDP may cost less than recompute on one cluster and more on another). The fit
    ladder's choice comes first: the cheapest recompute that fits."""
    if trial.verdict != "oom":
        return trial
    found = trial
    ladder = _ladder(ev, trial.point)
    for p in ladder + [q for q in _relief(ev.space, trial.point) if q not in ladder]:
        if ev.space.spec(p) is None:
            continue
        t = ev.evaluate(p, source)
        if t.verdict == "ok":
            if not best:
                return t
            if found.verdict != "ok" or t.score > found.score:
                found = t
    return found


def _by_distance(space: SearchSpace, point: Point) -> list[Point]:
    """Legal points, fewest changed axes first (then the least model parallelism)."""
    def key(p):
        d = dict(zip(AXES, p))
        return (sum(a != b for a, b in zip(p, point)), d["tp"] * d["pp"] * d["cp"], d["pp"])
    return sorted(space.legal_points(), key=key)


# How many of the nearest legal points the planner tries for a fitting baseline.
MAX_BASELINE_TRIES = 256


def working_start(ev: Evaluator, user: Trial) -> Trial:
    """The legal, fitting layout nearest the user's baseline (the planner's centre)."""
    snapped = ev.space.snap(user.point)
    start = user if snapped == user.point else ev.evaluate(snapped, "planner")
    start = relieve(ev, start, "planner") if start.verdict == "oom" else start
    if start.verdict in ("ok", "error"):
        return start
    # Illegal, or no memory relief is enough: the nearest legal layouts that fit.
    for i, p in enumerate(_by_distance(ev.space, user.point)):
        if i >= MAX_BASELINE_TRIES:
            break
        t = relieve(ev, ev.evaluate(p, "planner"), "planner")
        if t.verdict == "ok":
            return t
    if not ev.space.legal_points():
        raise ValueError("the search space has no legal layout for this job; widen "
                         "tune.space axes or change the global batch / cluster")
    return start


def sweep_points(space: SearchSpace, center: Point, fixed: tuple[str, ...] = ()
                 ) -> list[Point]:
    """Every other value of each axis with the rest at ``center``, legal ones only."""
    out, seen = [], {center}
    for axis in SWEEP_ORDER:
        if axis in fixed:
            continue
        for v in space.axes[axis]:
            if v == center[IDX[axis]]:
                continue
            p = space.vary(center, **{axis: v})
            if p not in seen and space.spec(p) is not None:
                seen.add(p)
                out.append(p)
    return out


def plan(ev: Evaluator, baseline: Point, source: str = "baseline",
         fixed: tuple[str, ...] = ()) -> tuple[Trial, Trial, list[Trial]]:
    """Evaluate the seeds: (user baseline, working baseline, every seed trial). The
    user's baseline is always evaluated; the budget may cut the rest short. ``fixed``
    axes are not swept (the cluster, when each cluster is planned on its own)."""
    user = ev.evaluate(baseline, source, enforce_budget=False)
    try:
        start = working_start(ev, user)
    except BudgetExhausted:
        return user, ev.best or user, [t for t in ev.trials if t.verdict == "ok"]
    seeds = [start]
    try:
        for p in sweep_points(ev.space, start.point, fixed):
            seeds.append(relieve(ev, ev.evaluate(p, "planner"), "planner"))
    except BudgetExhausted:
        pass
    return user, start, seeds
