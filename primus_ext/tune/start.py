"""The starting layout of a job whose given layout is illegal.

A job is fixed by its model, cluster, global batch and sequence; the layout is the
tuner's to choose. When the composed layout cannot run the job (most often: 512 GPUs
and a global batch of 256, so TP 1 leaves a data-parallel size of 512 that does not
divide the batch), the tuner starts from the smallest model-parallel size TP x PP x CP
whose layout is legal (its DP divides the global batch), preferring TP, then PP, then
CP at equal size; or it fails with one line saying why no layout exists.
"""
from __future__ import annotations

from typing import Callable

from primus_ext.spec import RunSpec
from primus_ext.tune.space_util import _pow2_upto
from primus_ext.tune.splits import megatron_split, pp_sizes


def start_candidates(*, world: int, node_size: int, num_layers: int) -> list[tuple]:
    """(tp, pp, cp) by model-parallel size, TP first, then PP, then CP."""
    out = [(tp, pp, cp) for tp in _pow2_upto(node_size) for pp in pp_sizes(num_layers, world)
           for cp in _pow2_upto(node_size) if world % (tp * pp * cp) == 0]
    return sorted(out, key=lambda t: (t[0] * t[1] * t[2], t[2], t[1]))


def starting_spec(build: Callable[[dict], RunSpec], *, world: int, node_size: int,
                  num_layers: int, global_batch_size: int, error: Exception) -> RunSpec:
    """The first legal spec of ``start_candidates``; ``build(parallel_fields)`` makes a
    RunSpec of the job with these parallel fields (ValueError when illegal). ``error``:
    why the job's own layout is illegal, repeated when no layout is legal."""
    last = None
    for tp, pp, cp in start_candidates(world=world, node_size=node_size,
                                       num_layers=num_layers):
        fields = {"tp": tp, "pp": pp, "cp": cp, "vpp": 1,
                  **(megatron_split(num_layers, pp, 1) or {})}
        try:
            return build(fields)
        except ValueError as exc:
            last = exc
    raise ValueError(
        f"no layout exists for this job: {error}; no TP x PP x CP on {world} GPUs (TP and "
        f"CP up to the node's {node_size}, PP a split of the {num_layers} layers) leaves a "
        f"legal layout for global_batch_size={global_batch_size}"
        + (f" (the last tried: {last})" if last is not None else "")) from None
