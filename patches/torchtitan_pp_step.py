"""Pipeline schedules' ``step(arg_mbs=..., kwarg_mbs=..., target_mbs=...)``.

What it fixes (torchtitan 0.3.x on torch 2.13): ``Trainer.pp_forward_backward_step``
hands the schedule pre-split microbatches (``step(arg_mbs=, kwarg_mbs=, target_mbs=,
losses=, loss_kwargs=, return_outputs=False)``), while torch 2.13's
``PipelineScheduleSingle.step`` / ``PipelineScheduleMulti.step``
(``torch/distributed/pipelining/schedules.py``) take a whole batch and split it; the
keywords end up as model kwargs ("Expecting 2 arg_mbs but got 1"). With those keywords
the stand-in does what ``step`` does after its split: set ``has_backward`` and clear the
stages' runtime state, then ``_step_microbatches`` on the given lists. Whole-batch calls
go to torch's own ``step``.
"""
from __future__ import annotations


def _pre_split_step(original):
    def step(self, *args, arg_mbs=None, kwarg_mbs=None, target_mbs=None, target=None,
             losses=None, return_outputs=True, loss_kwargs=None, **kwargs):
        if arg_mbs is None and kwarg_mbs is None and target_mbs is None:
            return original(self, *args, target=target, losses=losses,
                            return_outputs=return_outputs, loss_kwargs=loss_kwargs, **kwargs)
        stages = getattr(self, "_stages", None) or [self._stage]
        for stage in stages:
            stage.has_backward = self._has_backward
            stage.clear_runtime_states()
        self._step_microbatches(arg_mbs, kwarg_mbs, target_mbs, losses, return_outputs,
                                loss_kwargs=loss_kwargs)
        for stage in stages:
            if stage.is_last and return_outputs:
                return self._merge_outputs(stage.output_chunks)
        return None

    step.__primus_pre_split__ = True
    step.__wrapped__ = original
    return step


def apply() -> list[str]:
    import inspect

    from torch.distributed.pipelining import schedules
    patched = []
    for cls in (schedules.PipelineScheduleSingle, schedules.PipelineScheduleMulti):
        if getattr(cls.step, "__primus_pre_split__", False):
            patched.append(f"{cls.__name__}.step(arg_mbs=)")
            continue
        if "arg_mbs" in inspect.signature(cls.step).parameters:
            continue  # a torch that takes pre-split microbatches itself
        cls.step = _pre_split_step(cls.step)
        patched.append(f"{cls.__name__}.step(arg_mbs=)")
    return patched
