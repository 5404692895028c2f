"""Communication microbenchmarks on the local process groups, fitted to alpha-beta.

For each collective (all-reduce, all-gather, reduce-scatter, all-to-all, p2p) and each
group size the local run has, a sweep over message sizes; the mean of ``repeats`` timed
calls per size (after a barrier and a warm-up call; a step pays every call, slow ones
included, as nccl-tests' average does) is fitted to
``t = alpha + bytes / bw`` by least squares on relative error (small messages weigh as
much as large ones). Bytes follow the comm model's convention (the full buffer): see
``profile.py``.

In situ (``burst_s > 0``, the default on a CPU): each timed call follows a burst of
compute of about ``burst_s`` seconds, as a collective inside a layer follows the layer's
GEMMs. On a CPU node the ranks then reach the collective at slightly different times
(the longer the compute since the last collective, the further apart) and the transport
threads compete with compute for the cores: on this project's 2-core machine a 32 KB
all-gather takes 0.26 ms idle but about 2 ms after compute, which is what a training
step pays. A caller that knows the target's compute between two collectives passes it
as ``burst_s``. On GPUs the idle sweep (``burst_s=0``) is the usual one.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from primus_ext.project.profile import CommFit, fit_alpha_beta  # noqa: F401 (re-export)

DEFAULT_SIZES = tuple(2 ** k for k in range(12, 25, 2))  # 4 KiB .. 16 MiB
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p")


def _dtype_size() -> tuple[torch.dtype, int]:
    return torch.bfloat16, 2


def _burst(seconds: float):
    """A compute burst of about ``seconds`` (bf16 matmuls; calibrated once)."""
    if seconds <= 0:
        return lambda: None
    a = torch.randn(256, 256, dtype=torch.bfloat16)
    b = torch.randn(256, 1024, dtype=torch.bfloat16)
    a @ b
    t0 = time.perf_counter()
    for _ in range(10):
        a @ b
    n = max(1, int(seconds / max((time.perf_counter() - t0) / 10, 1e-7)))

    def run():
        for _ in range(n):
            a @ b
    return run


def _time_one(fn, repeats: int, group, burst=lambda: None) -> float:
    dist.barrier(group=group)
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        dist.barrier(group=group)
        burst()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return sum(times) / len(times)


def _call(collective: str, nbytes: int, group, size: int, rank_in_group: int, ranks):
    dtype, esize = _dtype_size()
    dev = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() \
        else torch.device("cpu")
    n = max(nbytes // esize // size * size, size)
    if collective == "all_reduce":
        x = torch.ones(n, dtype=dtype, device=dev)
        return lambda: dist.all_reduce(x, group=group), n * esize
    if collective == "all_gather":
        out = torch.empty(n, dtype=dtype, device=dev)
        inp = torch.ones(n // size, dtype=dtype, device=dev)
        return lambda: dist.all_gather_into_tensor(out, inp, group=group), n * esize
    if collective == "reduce_scatter":
        inp = torch.ones(n, dtype=dtype, device=dev)
        out = torch.empty(n // size, dtype=dtype, device=dev)
        return lambda: dist.reduce_scatter_tensor(out, inp, group=group), n * esize
    if collective == "all_to_all":
        inp = torch.ones(n, dtype=dtype, device=dev)
        out = torch.empty(n, dtype=dtype, device=dev)
        return lambda: dist.all_to_all_single(out, inp, group=group), n * esize
    if collective == "p2p":
        # Ring exchange: each rank sends n elements to the next, receives from the
        # previous (what a pipeline stage boundary does in steady state).
        send = torch.ones(n, dtype=dtype, device=dev)
        recv = torch.empty(n, dtype=dtype, device=dev)
        nxt, prv = ranks[(rank_in_group + 1) % size], ranks[(rank_in_group - 1) % size]

        def fn():
            ops = [dist.P2POp(dist.isend, send, nxt, group=group),
                   dist.P2POp(dist.irecv, recv, prv, group=group)]
            for w in dist.batch_isend_irecv(ops):
                w.wait()
        return fn, n * esize
    raise ValueError(f"collective {collective!r} is not one of {', '.join(COLLECTIVES)}")


def run_microbenchmarks(groups: dict[str, object], *, sizes=DEFAULT_SIZES,
                        repeats: int = 5, collectives=COLLECTIVES,
                        burst_s: float | None = None) -> list[CommFit]:
    """Fits per (collective, group size) over the distinct group sizes in ``groups``
    (axis -> process group; the world is added). Every rank must call it. ``burst_s``:
    compute before each timed call (None: 2 ms on a CPU, 0 on a GPU)."""
    if burst_s is None:
        burst_s = 0.0 if torch.cuda.is_available() else 2e-3
    burst = _burst(burst_s)
    from primus_ext.measure.tracer import get_tracer
    tracer = get_tracer()
    was = tracer.enabled if tracer else False
    if tracer:
        tracer.enabled = False
    by_size: dict[int, object] = {}
    world = dist.get_world_size()
    cands = list(groups.values()) + [None]
    for g in cands:
        size = dist.get_world_size(g) if g is not None else world
        if size > 1 and size not in by_size:
            by_size[size] = g
    fits = []
    try:
        for size in sorted(by_size):
            group = by_size[size]
            ranks = dist.get_process_group_ranks(group) if group is not None \
                else list(range(world))
            me = ranks.index(dist.get_rank())
            for coll in collectives:
                pts = []
                for nbytes in sizes:
                    fn, real = _call(coll, nbytes, group, size, me, ranks)
                    pts.append((float(real), _time_one(fn, repeats, group, burst)))
                # The slowest rank decides: agree on the max per point.
                t = torch.tensor([p[1] for p in pts], dtype=torch.float64)
                if torch.cuda.is_available():
                    t = t.cuda()
                dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
                pts = [(x, float(v)) for (x, _), v in zip(pts, t.tolist())]
                a, gbps, err = fit_alpha_beta(pts)
                fits.append(CommFit(collective=coll, group_size=size, alpha_s=a, gbps=gbps,
                                    points=tuple(pts), max_rel_err=err))
    finally:
        if tracer:
            tracer.enabled = was
    return fits
