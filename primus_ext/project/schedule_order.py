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
SCHEDULE_NAMES = ("1f1b", "interleaved", "zb")

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


def _order_zb(p: int, m: int, rank: int) -> list[Op]:
    # ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", 2023, section 3.1), which
    # megatron-core itself does not ship: the same forwards/backward-inputs as 1F1B (so
    # the same number of microbatches in flight), but each backward is split into B
    # (input grad, on the critical path) and W (weight grad, off it). Stage `rank` runs
    # the W of microbatch k only after the B of microbatch k + lag, lag = pp - rank - 1:
    # the first stages, which wait longest for gradients in the cooldown, keep a reserve
    # of W's that fill those waits; the last stage runs every W right after its B.
    warm = min(p - rank - 1, m)
    lag = p - rank - 1
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


@lru_cache(maxsize=128)
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
    else:
        raise ValueError(f"schedule={schedule!r} must be one of {SCHEDULE_NAMES}")
    return tuple(tuple(o) for o in orders)


@lru_cache(maxsize=64)
def compiled_plan(schedule: str, num_stages: int, num_chunks: int,
                  num_microbatches: int, group_size: int) -> tuple:
    """Flat plan for the simulator: per stage a tuple of (slot, dep_slot, lat_idx, cost_idx).

    slot = ((kind * v + chunk) * p + stage) * m + microbatch indexes the flat end-time
    array; dep_slot is the one op this op waits for (-1: none but the stage order);
    lat_idx indexes the p2p latency list (0..p-2: link s -> s+1, p-1: the wrap-around
    link from the last to the first stage, p: no latency); cost_idx = (kind * p + stage)
    * v + chunk indexes the flat cost list. Returns (plans, num_slots).
    """
    p, v, m = num_stages, num_chunks, num_microbatches
    orders = stage_op_orders(schedule, p, v, m, group_size)
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
                    dep, lat = -1, no_lat
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
            plan.append((slot(kind, s, mb, c), dep, lat, (kind * p + s) * v + c))
        plans.append(tuple(plan))
    num_kinds = 3 if schedule == "zb" else 2
    return tuple(plans), num_kinds * v * p * m
