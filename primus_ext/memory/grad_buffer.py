"""megatron-core DDP's contiguous param/grad buffers, and the optimizer state they shard.

``DistributedDataParallel`` (megatron/core/distributed/distributed_data_parallel.py)
keeps one ``_ParamAndGradBuffer`` per (param dtype, grad dtype) for dense parameters and
another for expert parameters (``allreduce=False``, reduced over expert-data-parallel).
The layout follows ``param_and_grad_buffer.py``: parameters are walked in reverse
registration order; a bucket closes once it holds ``bucket_size`` elements, or around a
``shared_embedding`` parameter; with the distributed optimizer every parameter starts
64-element aligned and every bucket ends on a multiple of ``lcm(dp, 128)`` (``lcm(dp,
128, 2**16)`` with ``pad_buckets_for_high_nccl_busbw``) so that it shards evenly over DP.
Each model chunk is its own DDP instance; bucketing is off for chunks after the first and
for pipeline stages after the first.

With the distributed optimizer the parameters themselves also live in the buffer
(``param_data``, param dtype, padding included); without it they are separate tensors.
The optimizer shards each bucket evenly over DP and keeps state only for the real
parameter elements inside its shard (``DistributedOptimizer._build_model_gbuf_range``),
so ranks can differ by the padding that falls in their shard.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from functools import lru_cache

from primus_ext.memory.rank_params import ParamTensor, chunk_param_tensors
from primus_ext.spec.model import ModelSpec
from primus_ext.spec.parallel import ParallelSpec

DEFAULT_BUCKET_MIN = 40_000_000
DEFAULT_BUCKET_PER_DP = 1_000_000


@dataclass(frozen=True, slots=True)
class Bucket:
    start: int
    end: int  # padded end
    param_starts: tuple[int, ...]  # ascending
    param_ends: tuple[int, ...]
    covered_before: tuple[int, ...]  # parameter elements before param k (prefix sums)


@dataclass(frozen=True, slots=True)
class BufferLayout:
    numel: int  # padded elements of the buffer
    numel_unpadded: int
    buckets: tuple[Bucket, ...]

    def shard_real_elements(self, dp: int, rank: int) -> int:
        """Real (non-padding) parameter elements in DP rank ``rank``'s optimizer shard."""
        total = 0
        for b in self.buckets:
            size = (b.end - b.start) // dp
            lo, hi = b.start + rank * size, b.start + (rank + 1) * size
            total += _covered(b, hi) - _covered(b, lo)
        return total

    def max_shard_real_elements(self, dp: int) -> int:
        """The largest optimizer shard over the DP ranks (the peak rank): the shard size
        minus the fewest padding elements any rank's shards hold. Walks the padding gaps
        (one per parameter at most), not the ranks: a gap adds to the ranks at its two
        ends and, when it spans whole shards, to a range of ranks between them; the
        padding per rank is constant between those breakpoints, so the minimum is taken
        over them (the cost does not grow with dp)."""
        total = 0
        partial: dict[int, int] = {}
        spans: list[tuple[int, int, int]] = []  # (first rank, last rank + 1, pad each)
        for b in self.buckets:
            size = (b.end - b.start) // dp
            if size == 0:
                continue
            total += size
            prev = b.start
            for ps, pe in zip(b.param_starts, b.param_ends):
                if ps > prev:
                    _add_gap(partial, spans, b.start, size, prev, ps)
                prev = max(prev, pe)
            if b.end > prev:
                _add_gap(partial, spans, b.start, size, prev, b.end)
        points = {0} | set(partial) | {r + 1 for r in partial if r + 1 < dp}
        points |= {lo for lo, _, _ in spans} | {hi for _, hi, _ in spans if hi < dp}
        return total - min(partial.get(r, 0) + sum(p for lo, hi, p in spans if lo <= r < hi)
                           for r in points)


def _add_gap(partial: dict[int, int], spans: list, start: int, size: int, lo: int,
             hi: int) -> None:
    """Add the padding [lo, hi) to the ranks whose shards it falls in."""
    r_lo, r_hi = (lo - start) // size, (hi - 1 - start) // size
    if r_lo == r_hi:
        partial[r_lo] = partial.get(r_lo, 0) + hi - lo
        return
    first_end = start + (r_lo + 1) * size
    partial[r_lo] = partial.get(r_lo, 0) + first_end - lo
    last_start = start + r_hi * size
    partial[r_hi] = partial.get(r_hi, 0) + hi - last_start
    if r_hi > r_lo + 1:
        spans.append((r_lo + 1, r_hi, size))


def _covered(b: Bucket, x: int) -> int:
    """Parameter elements of bucket ``b`` below buffer index ``x``."""
    i = bisect.bisect_right(b.param_starts, x)
    if i == 0:
        return 0
    k = i - 1
    return b.covered_before[k] + min(x, b.param_ends[k]) - b.param_starts[k]


def _bucket(start: int, end: int, starts: list[int], ends: list[int]) -> Bucket:
    order = sorted(range(len(starts)), key=starts.__getitem__)
    s = tuple(starts[k] for k in order)
    e = tuple(ends[k] for k in order)
    before, acc = [], 0
    for a, b in zip(s, e):
        before.append(acc)
        acc += b - a
    return Bucket(start, end, s, e, tuple(before))


def buffer_layout(tensors: tuple[ParamTensor, ...], dp: int, distopt: bool,
                  bucket_size: int | None, pad_high_busbw: bool = False) -> BufferLayout:
    """The layout ``_ParamAndGradBuffer.__init__`` computes for these parameters."""
    divisor = math.lcm(dp, 128, 2 ** 16) if pad_high_busbw else math.lcm(dp, 128)

    def pad_end(i: int) -> int:
        return -(-i // divisor) * divisor if distopt else i

    def pad_start(i: int) -> int:
        return -(-i // 64) * 64 if distopt else i

    buckets: list[Bucket] = []
    starts: list[int] = []
    ends: list[int] = []
    bucket_start = param_start = param_end = 0
    unpadded = 0

    def close(end_index: int) -> int:
        nonlocal bucket_start, starts, ends, unpadded
        unpadded += end_index - bucket_start
        padded = pad_end(end_index)
        buckets.append(_bucket(bucket_start, padded, starts, ends))
        bucket_start, starts, ends = padded, [], []
        return padded

    for t in reversed(tensors):
        param_start = pad_start(param_start)
        new_bucket = t.shared_embedding and distopt
        if new_bucket and starts:
            param_start = close(param_start)
        param_end = param_start + t.numel
        starts.append(param_start)
        ends.append(param_end)
        if (bucket_size is not None and param_end - bucket_start >= bucket_size) or new_bucket:
            param_start = close(param_end)
        else:
            param_start = param_end
    if starts:
        close(param_end)
    numel = buckets[-1].end if buckets else 0
    return BufferLayout(numel=numel, numel_unpadded=unpadded, buckets=tuple(buckets))


@dataclass(frozen=True, kw_only=True, slots=True)
class ChunkBuffers:
    dense: BufferLayout
    expert: BufferLayout


def default_bucket_size(dp: int) -> int:
    return max(DEFAULT_BUCKET_MIN, DEFAULT_BUCKET_PER_DP * dp)


@lru_cache(maxsize=2048)
def chunk_buffers(model: ModelSpec, par: ParallelSpec, stage: int, chunk: int, dp: int,
                  expert_dp: int, bucket_size: int | None = None,
                  pad_high_busbw: bool = False, local_spec: bool = False) -> ChunkBuffers:
    """Dense and expert buffer layouts of one DDP-wrapped model chunk.

    ``dp`` is the dense gradient-reduction group (data x context parallel), ``expert_dp``
    the expert one. ``bucket_size`` None means megatron-core's default."""
    tensors = chunk_param_tensors(model, par, stage, chunk, local_spec)
    size = bucket_size if bucket_size is not None else (
        par.ddp_bucket_params or default_bucket_size(dp // par.cp))
    if not par.overlap_grad_reduce or stage > 0 or chunk > 0:
        size = None
    distopt = par.use_distributed_optimizer
    dense = tuple(t for t in tensors if not t.expert)
    expert = tuple(t for t in tensors if t.expert)
    return ChunkBuffers(dense=buffer_layout(dense, dp, distopt, size, pad_high_busbw),
                        expert=buffer_layout(expert, expert_dp, distopt, size,
                                             pad_high_busbw))
