"""Count FSDP2's collectives per training step on a real 2-process gloo run (imported by
file name from test_fsdp_reshard_after_forward.py; argv[1]: 1 reshards after forward)."""
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

reshard = sys.argv[1] == "1"
torch.set_num_threads(1)
dist.init_process_group("gloo")
counts = {"all_gather": 0, "reduce_scatter": 0}
# torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py DefaultAllGather /
# DefaultReduceScatter call these two.
_ag, _rs = dist.all_gather_single, dist.reduce_scatter_single


def _count_ag(*a, **k):
    counts["all_gather"] += 1
    return _ag(*a, **k)


def _count_rs(*a, **k):
    counts["reduce_scatter"] += 1
    return _rs(*a, **k)


dist.all_gather_single, dist.reduce_scatter_single = _count_ag, _count_rs
torch.manual_seed(0)
BLOCKS = 3
blocks = [torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU()) for _ in range(BLOCKS)]
model = torch.nn.Sequential(*blocks)
for b in blocks:
    fully_shard(b, reshard_after_forward=reshard)
fully_shard(model, reshard_after_forward=reshard)  # the root holds no parameters
x = torch.randn(4, 64)
model(x).sum().backward()  # first step: lazy initialisation
counts.update(all_gather=0, reduce_scatter=0)
model(x).sum().backward()
dist.barrier()  # both ranks done before the group goes
if dist.get_rank() == 0:
    print(json.dumps({"blocks": BLOCKS, **counts}), flush=True)
# Leave without tearing gloo down: its teardown at interpreter exit can abort
# ("terminate called without an active exception") after the counts are out.
os._exit(0)
