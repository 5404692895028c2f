"""Megatron-LM's weight-hash check (``--check-weight-hash-across-dp-replicas-interval N``).

Every N iterations training.py ``post_training_step_callbacks`` calls megatron-core
utils.py ``check_param_hashes_across_dp_replicas(model, cross_check=True)`` and then
``torch.distributed.barrier()``. On each rank, for every parameter tensor it holds:

- ``param.data.to("cpu")``: a blocking device-to-host copy of the parameter (its model
  dtype) over the host link, a synchronisation each;
- ``.float().numpy(force=True)`` and ``hashlib.sha1(...)`` on the host: the reference
  host's seconds per tensor and per element (``data/host/weight_hash.json``, measured by
  ``scripts/hash_host_profile.py``) over ``host_speed``.

Then, for the dense parameters and (when the rank holds any) the expert ones: the
hashes stacked and copied to the device, one ``all_gather`` over the data-parallel
(expert-data-parallel) group, ``torch.equal`` with rank 0's and, with ``cross_check``,
with every rank's (a read-back each); and the barrier. The device is idle meanwhile.
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from primus_ext.comm.groups import group_span
from primus_ext.memory.muon import _tensors
from primus_ext.memory.states import is_local_spec
from primus_ext.spec import RunSpec

PROFILE_PATH = Path(__file__).resolve().parent.parent / "data" / "host" / "weight_hash.json"


@lru_cache(maxsize=1)
def reference_hash() -> tuple[float, float]:
    """(seconds per tensor, seconds per element) on the reference host."""
    d = json.loads(PROFILE_PATH.read_text())
    return d["per_tensor_s"], d["per_element_s"]


def weight_hash_s(spec: RunSpec, stage: int) -> float:
    """Host seconds per iteration of the check on a rank of this stage (its cost over
    the interval); 0 without the flag or without a host clock."""
    n = spec.train.check_weight_hash_interval
    hw = spec.cluster.hardware
    if n is None or not hw.host_clock:
        return 0.0
    tensors = _tensors(spec.model, spec.parallel, stage, is_local_spec(spec.train))
    elements = sum(t.numel for t in tensors)
    param_bytes = 4 if spec.train.precision == "fp32" else 2
    per_tensor, per_element = reference_hash()
    host = (len(tensors) * per_tensor + elements * per_element) / hw.host_speed
    copy = elements * param_bytes / (hw.host_link_gbps * 1e9) + len(tensors) * hw.sync_s
    groups = [group_span(spec, "dp").size]
    if any(t.expert for t in tensors):
        groups.append(group_span(spec, "edp").size)
    # Per group: the hashes' copy to the device, all_gather, equal with rank 0 and with
    # each rank (cross_check); then the barrier.
    syncs = sum(1 + 1 + g for g in groups)
    colls = len(groups) + 1
    check = host + copy + syncs * hw.sync_s + colls * hw.collective_host_s \
        + len(groups) * hw.launch_s
    return check / n
