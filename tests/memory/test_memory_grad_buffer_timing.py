"""Gradients allocated at a chunk's first backward (``parallel.grad_buffer='on_backward'``,
PyTorch FSDP deferring its gradient sync to the last microbatch) against megatron-core's
persistent DDP buffer: the schedule is stepped whole (``memory/inflight.py``
``peak_with_gradients``); without gradients it gives megatron-core's in-flight counts
(``inflight_1f1b`` / ``inflight_interleaved``, which tests/slow checks against real
pipeline-schedule runs)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from memory_specs import LLAMA, run

from primus_ext.memory.inflight import (inflight_1f1b, inflight_interleaved,
                                        peak_with_gradients)
from primus_ext.memory.report import memory_report
from primus_ext.spec import ParallelSpec


@pytest.mark.parametrize("pp,vpp,stage,m", [(4, 2, 0, 8), (4, 2, 3, 4), (16, 8, 1, 16),
                                            (16, 8, 1, 32), (4, 1, 0, 8), (4, 1, 2, 3),
                                            (2, 2, 0, 4)])
def test_without_gradients_the_peak_is_megatron_cores(pp, vpp, stage, m):
    chunk = tuple(range(3, 3 + vpp))
    alive, grads = peak_with_gradients(pp, vpp, stage, m, chunk, (0,) * vpp)
    ref = (inflight_1f1b(pp, stage, m),) if vpp == 1 else inflight_interleaved(
        pp, vpp, stage, m, chunk)
    assert sum(a * b for a, b in zip(alive, chunk)) == sum(a * b for a, b in zip(ref, chunk))
    assert grads == 0


def test_gradients_made_after_the_warmup_peak_add_only_the_first_chunk():
    # pp 2, one chunk, 2 microbatches on stage 0: forward, forward (peak: 2 alive), then
    # the first backward allocates the gradients while both microbatches are still alive.
    alive, grads = peak_with_gradients(2, 1, 0, 2, (10,), (7,))
    assert (alive, grads) == ((2,), 7)
    # Interleaved, every forward in the warmup (m * vpp forwards): the first backward
    # (the last chunk) adds its gradients on top of the full warmup; the first chunk's
    # come once the last chunk's activations are freed and its gradients
    # reduce-scattered (after its last microbatch).
    assert peak_with_gradients(2, 2, 0, 2, (10, 10), (1, 100)) == ((2, 2), 100)
    assert peak_with_gradients(2, 2, 0, 2, (10, 10), (100, 1)) == ((2, 0), 100)


def test_on_backward_needs_the_distributed_optimizer_layout():
    with pytest.raises(ValueError, match="grad_buffer='on_backward'"):
        ParallelSpec(fsdp=True, grad_buffer="on_backward")
    with pytest.raises(ValueError, match="grad_buffer"):
        ParallelSpec(grad_buffer="lazy")


def test_lazy_gradients_lower_the_peak_when_the_warmup_holds_every_forward():
    spec = run(LLAMA, gpus=8, pp=4, vpp=2, gbs=8)  # dp 2, 4 microbatches = pp
    lazy = replace(spec, parallel=replace(spec.parallel, grad_buffer="on_backward"))
    persistent, on_backward = memory_report(spec), memory_report(lazy)
    assert on_backward.peak_bytes < persistent.peak_bytes
    st = on_backward.stages[0]
    assert st.grad_bytes < persistent.stages[0].grad_bytes
