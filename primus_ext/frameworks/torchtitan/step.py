"""Timed training steps of an in-process torchtitan Trainer.

A step is the Trainer's own ``train_step`` (zero grads, the microbatches' forward and
backward -- gradient accumulation or the pipeline schedule --, grad-norm clipping,
optimizer and LR-scheduler steps) on its own data loader. ``fwd_bwd`` time is the sum of
the Trainer's ``fwd_bwd_fn`` calls (one per accumulated microbatch); the rest of the step
is reported as the optimizer's.

A pipeline target's microbatches run through FSDP2 as torch's pipeline stage runs them
(``torch/distributed/pipelining/stage.py``: ``backward_maybe_with_nosync`` turns gradient
sync and resharding after backward off for every microbatch, ``perform_reduce_grad``
turns them on for the step's reduction; torchtitan keeps the parameters gathered after
forward under PP, ``distributed/fsdp.py get_fsdp_reshard_after_forward_policy``). The
measured run is one stage whose microbatches are accumulated gradients, so with
``pipeline_microbatches`` the runner does the same: sync and reshard on the step's last
microbatch only.
"""
from __future__ import annotations

import time


class StepRunner:
    """Runs ``trainer.train_step`` and records step and forward-backward seconds."""

    def __init__(self, trainer, timer=None, pipeline_microbatches: int = 0) -> None:
        self.trainer = trainer
        self.timer = timer
        self.pipeline_microbatches = pipeline_microbatches
        self._microbatch = 0
        self.data_iterator = trainer.batch_generator(trainer.dataloader)
        self._fwd_bwd_s = 0.0
        self._original_fwd_bwd = trainer.fwd_bwd_fn
        trainer.fwd_bwd_fn = self._fwd_bwd
        if timer is not None:
            trainer.loss_fn = timer.wrap_loss(trainer.loss_fn)

    def _fwd_bwd(self, *args, **kwargs):
        if self.pipeline_microbatches:
            self._pipeline_sync(self._microbatch == self.pipeline_microbatches - 1)
        self._microbatch += 1
        t0 = time.perf_counter()
        out = self._original_fwd_bwd(*args, **kwargs)
        if self.timer is not None:
            self.timer.end_backward()
        self._fwd_bwd_s += time.perf_counter() - t0
        return out

    def step(self) -> dict:
        t = self.trainer
        t.step += 1
        self._fwd_bwd_s = 0.0
        self._microbatch = 0
        t0 = time.perf_counter()
        t.train_step(self.data_iterator)
        step_s = time.perf_counter() - t0
        if self.timer is not None and self.timer.enabled:
            self.timer.collect()
        return {"step_s": step_s, "zero_grad_s": 0.0, "fwd_bwd_s": self._fwd_bwd_s,
                "optimizer_s": max(step_s - self._fwd_bwd_s, 0.0)}

    def _pipeline_sync(self, last: bool) -> None:
        from torch.distributed.fsdp import FSDPModule
        for part in self.trainer.model_parts:
            if isinstance(part, FSDPModule):
                part.set_is_last_backward(last)
                part.set_reshard_after_backward(last)
                part.set_requires_gradient_sync(last)

    def close(self) -> None:
        self.trainer.fwd_bwd_fn = self._original_fwd_bwd
        loss = getattr(self.trainer.loss_fn, "__wrapped__", None)
        if loss is not None:
            self.trainer.loss_fn = loss
