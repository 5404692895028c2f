"""Search points -> torchtitan specs (``framework=torchtitan``).

The tuner's axes keep their names; for a torchtitan job the ``recompute`` axis holds the
activation-checkpoint policy (none, selective, full) and ``sharding`` FSDP2 (``fsdp``:
dp_shard takes every data-parallel rank) or HSDP (``hsdp``: one replica per node,
FSDP2 inside it). The pipeline schedule follows the stages per rank: 1F1B with one,
Interleaved1F1B with more (torchtitan's default schedule and its looped one).
"""
from __future__ import annotations

import dataclasses

from primus_ext.spec import RunSpec
from primus_ext.tune.points import Point, as_dict


def build_titan_spec(space, point: Point) -> RunSpec:
    """The RunSpec of a normalised point of ``space`` (a SearchSpace of a torchtitan
    job); ValueError when torchtitan or the costed layout refuses it."""
    from primus_ext.project.torchtitan import simulated_view
    from primus_ext.tune.space_util import _memo
    d = as_dict(point)
    base = space.base
    pp, vpp = d["pp"], d["vpp"]
    sched = "1F1B" if pp == 1 or vpp == 1 else "Interleaved1F1B"
    kwargs = dict(tp=d["tp"], pp=pp, vpp=vpp, cp=d["cp"], ep=d["ep"], etp=None,
                  sequence_parallel=d["sequence_parallel"],
                  tp_comm_overlap=d["tp_comm_overlap"], schedule=sched,
                  dp_shard=-1, pipeline_layout=None,
                  dp_replicate=d["num_nodes"] if d["sharding"] == "hsdp" else 1)
    par = _memo(space._parts, ("parallel",) + tuple(kwargs.items()),
                lambda: dataclasses.replace(base.parallel, **kwargs))
    tkw = dict(micro_batch_size=d["micro_batch_size"],
               activation_checkpoint=d["recompute"], precision=d["precision"])
    train = _memo(space._parts, ("train",) + tuple(tkw.items()),
                  lambda: dataclasses.replace(base.train, **tkw))
    spec = RunSpec(model=base.model, parallel=par, train=train,
                   cluster=space.cluster(d["num_nodes"], d["hardware"]),
                   framework="torchtitan")
    simulated_view(spec)  # the costed layout must be legal too
    return spec
