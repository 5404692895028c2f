"""Points: one value per search axis, and how they map to and from a RunSpec's fields.

The recompute axis folds three TrainSpec fields into one label ('none', 'selective',
'full-<method>-<num_layers>'); the sharding axis folds ParallelSpec's fsdp and
use_distributed_optimizer ('fsdp', 'torch_fsdp2', 'distributed_optimizer', 'none').
"""
from __future__ import annotations

import re
from typing import Mapping

from primus_ext.spec import RunSpec

AXES = ("num_nodes", "hardware", "tp", "pp", "vpp", "cp", "ep", "etp",
        "micro_batch_size", "recompute", "sharding", "sequence_parallel",
        "overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap", "schedule",
        "precision")
IDX = {a: i for i, a in enumerate(AXES)}
(_TP, _PP, _VPP, _EP, _ETP, _SHARD, _SP, _OPG, _TPO, _SCHED) = (
    IDX[a] for a in ("tp", "pp", "vpp", "ep", "etp", "sharding", "sequence_parallel",
                     "overlap_param_gather", "tp_comm_overlap", "schedule"))
# Megatron-LM's sharding choices: its distributed optimizer, Megatron-FSDP ('fsdp':
# --use-megatron-fsdp with optim_grads_params), PyTorch FSDP2 ('torch_fsdp2': no PP, no
# EP, untied embeddings; spec/legal_megatron.py) and plain DDP ('none').
SHARDINGS = ("distributed_optimizer", "fsdp", "torch_fsdp2", "none")
# framework=torchtitan: the recompute axis holds the activation-checkpoint policy and the
# sharding axis FSDP2 (dp_shard = all data-parallel ranks) or HSDP (one replica per
# node: dp_replicate = num_nodes, FSDP2 inside the node).
TITAN_CHECKPOINTS = ("none", "selective", "full")
TITAN_SHARDINGS = ("fsdp", "hsdp")

Point = tuple


# ---- recompute labels ---------------------------------------------------------------
def recompute_label(granularity: str | None, method: str | None = None,
                    num_layers: int | None = None) -> str:
    """'none', 'selective' or 'full-<method>-<num_layers>' (one axis for three fields)."""
    if granularity is None:
        return "none"
    if granularity == "selective":
        return "selective"
    return f"full-{method}-{num_layers}"


def parse_recompute(label: str) -> tuple[str | None, str | None, int | None]:
    m = re.fullmatch(r"full-(uniform|block)-(\d+)", str(label))
    if m:
        return "full", m.group(1), int(m.group(2))
    if label in ("none", None):
        return None, None, None
    if label == "selective":
        return "selective", None, None
    if label == "full":  # torchtitan's FullAC: every block, i.e. full-uniform-1
        return "full", "uniform", 1
    raise ValueError(f"recompute={label!r} must be 'none', 'selective' or "
                     "'full-<uniform|block>-<num_layers>', e.g. 'full-uniform-1'")


def sharding_of(par, framework: str = "megatron") -> str:
    if framework == "torchtitan":
        return "hsdp" if par.dp_replicate > 1 else "fsdp"
    if par.fsdp:
        return "torch_fsdp2" if par.fsdp_impl == "torch_fsdp2" else "fsdp"
    return "distributed_optimizer" if par.use_distributed_optimizer else "none"


def point_of(spec: RunSpec) -> Point:
    """The (unnormalised) point of any spec: the baseline, a reference layout."""
    p, t, c = spec.parallel, spec.train, spec.cluster
    values = dict(num_nodes=c.num_nodes, hardware=c.hardware.name, tp=p.tp, pp=p.pp,
                  vpp=p.vpp, cp=p.cp, ep=p.ep, etp=p.etp,
                  micro_batch_size=t.micro_batch_size,
                  recompute=(t.activation_checkpoint if spec.framework == "torchtitan"
                             else recompute_label(t.recompute_granularity,
                                                  t.recompute_method,
                                                  t.recompute_num_layers)),
                  sharding=sharding_of(p, spec.framework),
                  sequence_parallel=p.sequence_parallel,
                  overlap_grad_reduce=p.overlap_grad_reduce,
                  overlap_param_gather=p.overlap_param_gather,
                  tp_comm_overlap=p.tp_comm_overlap, schedule=p.schedule,
                  precision=t.precision)
    return tuple(values[a] for a in AXES)


def as_dict(point: Point) -> dict:
    return dict(zip(AXES, point))


def describe(point: Point) -> str:
    d = as_dict(point)
    etp = "" if d["etp"] is None else f" ETP{d['etp']}"
    ep = f" EP{d['ep']}{etp}" if d["ep"] > 1 or d["etp"] is not None else ""
    flags = [d["sharding"].replace("distributed_optimizer", "distopt")]
    if d["sequence_parallel"]:
        flags.append("SP")
    if d["tp_comm_overlap"]:
        flags.append("tp-overlap")
    if d["schedule"] not in ("auto", "1f1b", "interleaved"):
        flags.append(d["schedule"])
    if d["precision"] != "bf16":
        flags.append(d["precision"])
    return (f"TP{d['tp']} PP{d['pp']} VPP{d['vpp']} CP{d['cp']}{ep} MBS"
            f"{d['micro_batch_size']} rc={d['recompute']} {' '.join(flags)}")


def candidate_from_dict(space, values: Mapping, start: Point) -> Point:
    """A point of ``space`` (a SearchSpace) from a partial dict of axis values (unnamed
    axes keep ``start``'s)."""
    d = as_dict(start)
    for k, v in values.items():
        if k not in IDX:
            raise ValueError(f"{k!r} is not a search axis ({', '.join(AXES)})")
        if not (v is None or isinstance(v, (bool, int, float, str))):
            raise ValueError(f"{k}={v!r} must be a single value")
        d[k] = v
    return space.normalize(tuple(d[a] for a in AXES))
