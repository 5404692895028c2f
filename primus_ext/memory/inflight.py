"""How many microbatches' activations a pipeline stage holds at its peak.

- 1F1B (``forward_backward_pipelining_without_interleaving``): stage ``r`` runs
  ``min(pp - r - 1, m)`` warmup forwards, then one more forward before its first
  backward, so ``min(pp - r, m)`` microbatches are alive at the peak.
- Interleaved 1F1B (``forward_backward_pipelining_with_interleaving``): megatron-core's
  warmup count per rank is ``(pp - r - 1) * 2 + (vpp - 1) * g`` chunk-microbatches, with
  ``g`` = ``microbatch_group_size_per_vp_stage`` (default pp), clamped to ``m * vpp``; one
  more forward runs before the first backward. Chunks hold different layers (the first
  has the embedding, the last the loss), so the count is kept per chunk: forward ``k``
  runs chunk ``(k mod (g * vpp)) // g`` and backward ``k`` the mirror chunk. The schedule
  is stepped until the pattern repeats and the largest byte total is the peak.
"""
from __future__ import annotations

from functools import lru_cache


def inflight_1f1b(pp: int, stage: int, num_microbatches: int) -> int:
    return max(min(pp - stage, num_microbatches), 0)


def _chunk(k: int, group: int, vpp: int, forward: bool) -> int:
    c = (k % (group * vpp)) // group
    return c if forward else vpp - 1 - c


@lru_cache(maxsize=4096)
def inflight_interleaved(pp: int, vpp: int, stage: int, num_microbatches: int,
                         chunk_bytes: tuple[int, ...], group: int | None = None
                         ) -> tuple[int, ...]:
    """Chunk-microbatches alive per chunk at the stage's activation peak."""
    g = group or pp
    total = num_microbatches * vpp
    warmup = warmup_forwards(pp, vpp, stage, num_microbatches, g)
    if any(b <= 0 for b in chunk_bytes):
        return _inflight_stepped(vpp, g, total, warmup, chunk_bytes)
    # Every forward adds bytes, so the warmup's peak is its last state: count the
    # forwards of each chunk in the first `warmup` (chunk c holds g of every g * vpp).
    gv = g * vpp
    alive = [(warmup // gv) * g + min(max(warmup % gv - c * g, 0), g) for c in range(vpp)]
    cur = sum(a * b for a, b in zip(alive, chunk_bytes))
    best, best_alive = (cur, tuple(alive)) if warmup else (-1, tuple(alive))
    # Steady 1F1B: forward k + warmup, then backward k. The chunk pattern repeats every
    # g * vpp steps, so two periods cover every state the peak can be in.
    for j in range(min(total - warmup, 2 * gv + 1)):
        c = _chunk(j + warmup, g, vpp, True)
        alive[c] += 1
        cur += chunk_bytes[c]
        if cur > best:
            best, best_alive = cur, tuple(alive)
        c = _chunk(j, g, vpp, False)
        alive[c] -= 1
        cur -= chunk_bytes[c]
    return best_alive


def _inflight_stepped(vpp: int, g: int, total: int, warmup: int,
                      chunk_bytes: tuple[int, ...]) -> tuple[int, ...]:
    # Chunks without activation bytes: the first state at the peak is kept, as the
    # schedule reaches it (step by step).
    alive = [0] * vpp
    best, best_alive = -1, tuple(alive)

    def note() -> None:
        nonlocal best, best_alive
        cur = sum(a * b for a, b in zip(alive, chunk_bytes))
        if cur > best:
            best, best_alive = cur, tuple(alive)

    for k in range(warmup):
        alive[_chunk(k, g, vpp, True)] += 1
        note()
    steps = min(total - warmup, 2 * g * vpp + 1)
    for j in range(steps):
        alive[_chunk(j + warmup, g, vpp, True)] += 1
        note()
        alive[_chunk(j, g, vpp, False)] -= 1
    if warmup == total and steps == 0:
        note()
    return best_alive


def warmup_forwards(pp: int, vpp: int, stage: int, num_microbatches: int,
                    group: int | None = None) -> int:
    """Forwards megatron-core runs before a stage's first backward (module docstring)."""
    if vpp == 1:
        return min(pp - stage - 1, num_microbatches)
    return min((pp - stage - 1) * 2 + (vpp - 1) * (group or pp), num_microbatches * vpp)


@lru_cache(maxsize=4096)
def peak_with_gradients(pp: int, vpp: int, stage: int, num_microbatches: int,
                        chunk_bytes: tuple[int, ...], chunk_grad_bytes: tuple[int, ...],
                        group: int | None = None) -> tuple[tuple[int, ...], int]:
    """(chunk-microbatches alive, gradient bytes alive) at the stage's peak when a chunk's
    unsharded gradients are allocated at its first backward and freed after its last
    (``ParallelSpec.grad_buffer='on_backward'``): the schedule is stepped whole (warmup
    forwards, steady forward/backward pairs, cool-down backwards) and a backward counts
    with its chunk's gradients allocated and its activations still alive."""
    g = group or pp
    total = num_microbatches * vpp
    warmup = warmup_forwards(pp, vpp, stage, num_microbatches, g)
    alive = [0] * vpp
    done = [0] * vpp  # backwards run per chunk
    grads = 0
    best = (-1, tuple(alive), 0)

    def note() -> None:
        nonlocal best
        cur = sum(a * b for a, b in zip(alive, chunk_bytes)) + grads
        if cur > best[0]:
            best = (cur, tuple(alive), grads)

    for k in range(warmup):
        alive[_chunk(k, g, vpp, True)] += 1
        note()
    for j in range(total):
        if j + warmup < total:
            alive[_chunk(j + warmup, g, vpp, True)] += 1
            note()
        c = _chunk(j, g, vpp, False)
        if done[c] == 0:
            grads += chunk_grad_bytes[c]
        note()
        alive[c] -= 1
        done[c] += 1
        if done[c] == num_microbatches:  # reduce-scattered after its last microbatch
            grads -= chunk_grad_bytes[c]
    return best[1], best[2]
