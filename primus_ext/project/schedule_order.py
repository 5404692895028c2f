"""Per-stage op orders of megatron-core's pipeline schedules, and their compiled plans.

An op is ``(kind, microbatch, chunk)`` with kind ``F`` (forward), ``B`` (backward; for
``1f1b``/``interleaved`` it is the whole backward, for ``zb`` only the input gradient)
or ``W`` (weight gradient, ``zb`` only). Every stage runs its ops in a fixed order;
``schedule.simulate`` times them. Orders only depend on (schedule, pp, vpp, m, group
size), so they are computed once and cached.
"""
from __future__ import annotations

from functools import lru_cache

KIND_F, KIND_B, KIND_W = 0, 1, 2
KIND_NAMES = ("F", "B", "W")
SCHEDULE_NAMES = ("1f1b", "interleaved", "zb", "fill_drain")

Op = tuple[int, int, int]  # (kind, microbatch, chunk)


def schedule_table(num_microbatches: int, num_chunks: int, group_size: int) -> tuple:
    """(microbatch, chunk) of each virtual microbatch, as megatron-core's
    ``get_schedule_table``: microbatches go in groups of ``group_size``
    (``microbatch_group_size_per_vp_stage``, default pp); inside a group all microbatches
    run chunk 0, then chunk 1, ...; the last group holds whatever is left."""
    table = []
    for start in range(0, num_microbatches, group_size):
        stop = min(start + group_size, num_microbatches)
        for chunk in range(num_chunks):
            table.extend((mb, chunk) for mb in range(start, stop))
    return tuple(table)


def _order_1f1b(p: int, m: int, rank: int) -> list[Op]:
    # forward_backward_pipelining_without_interleaving: num_warmup_microbatches =
    # min(pp - rank - 1, m) forwards, then (forward, backward) pairs, then the remaining
    # backwards (cooldown).
    warm = min(p - rank - 1, m)
    ops = [(KIND_F, i, 0) for i in range(warm)]
    for i in range(m - warm):
        ops.append((KIND_F, warm + i, 0))
        ops.append((KIND_B, i, 0))
    ops.extend((KIND_B, i, 0) for i in range(m - warm, m))
    return ops


def _order_interleaved(p: int, v: int, m: int, g: int, rank: int) -> list[Op]:
    # forward_backward_pipelining_with_interleaving + get_pp_rank_microbatches: the k-th
    # forward is schedule_table[k]; the k-th backward is the same microbatch in chunk
    # v - 1 - chunk (get_model_chunk_id(k, forward=False)). Warmup is
    # (pp - rank - 1) * 2 + (vpp - 1) * group_size forwards, clamped to m * vpp; the steady
    # phase runs forward k + warmup then backward k; the cooldown runs the last backwards.
    table = schedule_table(m, v, g)
    total = m * v
    warm = min((p - rank - 1) * 2 + (v - 1) * g, total)
    fwd = [(KIND_F, mb, c) for mb, c in table]
    bwd = [(KIND_B, mb, v - 1 - c) for mb, c in table]
    ops = fwd[:warm]
    for k in range(total - warm):
        ops.append(fwd[k + warm])
        ops.append(bwd[k])
    ops.extend(bwd[total - warm:])
    return ops


def _order_fill_drain(m: int) -> list[Op]:
    # GPipe (Huang et al. 2019; torch.distributed.pipelining ScheduleGPipe): every
    # microbatch's forward, then every backward, in order.
    return [(KIND_F, i, 0) for i in range(m)] + [(KIND_B, i, 0) for i in range(m)]


def _order_zb(p: int, m: int, rank: int) -> list[Op]:
    # ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", 2023, section 3.1), which
    # megatron-core itself does not ship: the forwards and backward-inputs (B) run in
    # 1F1B's order (same warmup, so the same forwards in flight), and each weight-grad
    # W, being off the critical path, is deferred: stage `rank` holds back W's for its
    # first `rank` B's (fewer when the cooldown starts sooner), then follows every B with
    # the oldest pending W, and runs the held-back W's at the end. The B chain reaches
    # stage `rank` (pp - 1 - rank) B-times after the last stage, so the later stages end
    # on their reserve of W's while the first stages fill their cooldown gradient waits
    # with their own W's. For uniform costs and free p2p the step is
    # m * (F + B + W) + (pp - 1) * (F + B - W) when W <= F + B and m >= pp (the paper's
    # ZB-H1 bubble) against 1F1B's (pp - 1) * (F + B + W).
    warm = min(p - rank - 1, m)
    lag = rank
    ops = [(KIND_F, i, 0) for i in range(warm)]
    next_w = 0
    for i in range(m):
        if warm + i < m:
            ops.append((KIND_F, warm + i, 0))
        ops.append((KIND_B, i, 0))
        if i >= lag or warm + i >= m:
            # steady state: one W per B; in the cooldown (no forwards left) too.
            ops.append((KIND_W, next_w, 0))
            next_w += 1
    ops.extend((KIND_W, i, 0) for i in range(next_w, m))
    return ops


@lru_cache(maxsize=16)
def stage_op_orders(schedule: str, num_stages: int, num_chunks: int,
                    num_microbatches: int, group_size: int) -> tuple[tuple[Op, ...], ...]:
    """Per stage, the ops it runs, in order. Arguments must already be validated."""
    p, v, m = num_stages, num_chunks, num_microbatches
    if schedule == "1f1b":
        orders = [_order_1f1b(p, m, r) for r in range(p)]
    elif schedule == "interleaved":
        orders = [_order_interleaved(p, v, m, group_size, r) for r in range(p)]
    elif schedule == "zb":
        orders = [_order_zb(p, m, r) for r in range(p)]
    elif schedule == "fill_drain":
        orders = [_order_fill_drain(m) for _ in range(p)]
    else:
        raise ValueError(f"schedule={schedule!r} must be one of {SCHEDULE_NAMES}")
    return tuple(tuple(o) for o in orders)


# A plan for pp=8, vpp=8, m=192 (24,576 ops) takes about 2.5 MB.
@lru_cache(maxsize=32)
def compiled_plan(schedule: str, num_stages: int, num_chunks: int,
                  num_microbatches: int, group_size: int) -> tuple:
    """The ops of all stages as one flat, dependency-sorted sequence for the simulator.

    Returned as five parallel tuples (columns: zip() walks them faster, and they take
    less memory, than one tuple per op): slot, dep_slot, lat_idx, cost_idx, stage.
    slot = ((kind * v + chunk) * p + stage) * m + microbatch indexes the flat end-time
    array; dep_slot is the op it waits for besides its stage predecessor (num_slots, a
    slot that stays 0.0, when none); lat_idx indexes the p2p latency list (0..p-2: link
    s -> s+1, p-1: the wrap-around link from the last to the first stage, p: none);
    cost_idx = (kind * p + stage) * v + chunk indexes the flat cost list. Every op comes
    after its dependency and after the op before it on its stage, so one pass in this
    order times the whole step whatever the costs. Returns (columns, num_slots); raises
    ValueError if the orders deadlock.
    """
    p, v, m = num_stages, num_chunks, num_microbatches
    orders = stage_op_orders(schedule, p, v, m, group_size)
    num_slots = (3 if schedule == "zb" else 2) * v * p * m
    no_lat = p

    def slot(kind: int, stage: int, mb: int, chunk: int) -> int:
        return ((kind * v + chunk) * p + stage) * m + mb

    plans = []
    for s, order in enumerate(orders):
        plan = []
        for kind, mb, c in order:
            if kind == KIND_F:
                if s > 0:
                    dep, lat = slot(KIND_F, s - 1, mb, c), s - 1
                elif c > 0:
                    dep, lat = slot(KIND_F, p - 1, mb, c - 1), p - 1
                else:
                    dep, lat = num_slots, no_lat
            elif kind == KIND_B:
                if s < p - 1:
                    dep, lat = slot(KIND_B, s + 1, mb, c), s
                elif c < v - 1:
                    dep, lat = slot(KIND_B, 0, mb, c + 1), p - 1
                else:
                    # the loss: backward of the last virtual stage follows its forward.
                    dep, lat = slot(KIND_F, s, mb, c), no_lat
            else:
                dep, lat = slot(KIND_B, s, mb, c), no_lat
            plan.append((slot(kind, s, mb, c), dep, lat, (kind * p + s) * v + c, s))
        plans.append(plan)
    columns = tuple(tuple(col) for col in zip(*_topological(plans, num_slots)))
    return columns, num_slots


def _topological(plans: list, num_slots: int) -> tuple:
    # Kahn-style pass: run each stage down its order until an op whose dependency has
    # not been emitted yet, park the stage on that dependency, resume it when the
    # dependency is emitted. Each op is emitted once: O(ops).
    p = len(plans)
    done = [False] * (num_slots + 1)
    done[num_slots] = True
    waiter = [-1] * num_slots
    pos = [0] * p
    out = []
    work = list(range(p - 1, -1, -1))
    while work:
        s = work.pop()
        plan, i = plans[s], pos[s]
        while i < len(plan):
            op = plan[i]
            if not done[op[1]]:
                waiter[op[1]] = s
                break
            out.append(op)
            done[op[0]] = True
            if waiter[op[0]] >= 0:
                work.append(waiter[op[0]])
            i += 1
        pos[s] = i
    for s in range(p):
        if pos[s] < len(plans[s]):
            raise ValueError(f"schedule deadlocks: stage {s} waits forever at op {pos[s]} "
                             "of its order (the op orders are inconsistent)")
    return tuple(out)
