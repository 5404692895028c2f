"""FSDP2's gradient reduce-scatter with SUM (and a division) instead of PREMUL_SUM.

What it fixes (torch 2.13, gloo): torchtitan sets FSDP2's gradient divide factor to 1
(``torchtitan/distributed/fsdp.py``: ``set_gradient_divide_factor(1.0)``; the loss is
already normalised by the global token count), so FSDP2's
``_get_gradient_divide_factors`` (``torch/distributed/fsdp/_fully_shard/
_fsdp_collectives.py``) picks ``ReduceOp.PREMUL_SUM(1/factor)``, which gloo rejects
("Cannot use ReduceOp.PREMUL_SUM with Gloo"). Forcing the sum reduction (FSDP2's own
``force_sum_reduction_for_comms``, as it does for MTIA) reduces with SUM and divides by
the same factor afterwards: the same gradients, the same bytes on the wire.
"""
from __future__ import annotations


def apply() -> list[str]:
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives as coll
    original = coll._get_gradient_divide_factors
    if getattr(original, "__primus_sum__", False):
        return ["fsdp2 PREMUL_SUM->SUM"]

    def _get_gradient_divide_factors(reduce_scatter_group, all_reduce_group, reduce_dtype,
                                     device_type="", factor=None,
                                     force_sum_reduction_for_comms=False):
        return original(reduce_scatter_group, all_reduce_group, reduce_dtype, device_type,
                        factor, True)

    _get_gradient_divide_factors.__primus_sum__ = True
    coll._get_gradient_divide_factors = _get_gradient_divide_factors
    return ["fsdp2 PREMUL_SUM->SUM"]
