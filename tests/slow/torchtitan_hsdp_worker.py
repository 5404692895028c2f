"""Worker for tests/slow/test_torchtitan_hsdp.py (4 processes under torchrun): torchtitan's
llama3 debugmodel sharded by torchtitan's own ``apply_fsdp_to_decoder`` on a 2 x 2
``(dp_replicate, dp_shard)`` mesh (HSDP), two microbatches' forward and backward; every
``torch.distributed.all_reduce`` FSDP2 issues is recorded (group size, dtype, elements).

    torchrun --nproc-per-node 4 tests/slow/torchtitan_hsdp_worker.py OUT
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> None:
    import torch
    from patches.torchtitan_apply import apply_torchtitan_cpu_patches
    apply_torchtitan_cpu_patches()
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torchtitan.distributed.fsdp import apply_fsdp_to_decoder
    from torchtitan.models.llama3 import model_registry

    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_replicate", "dp_shard"))
    torch.manual_seed(0)
    model = model_registry("debugmodel").model.build()
    apply_fsdp_to_decoder(model, mesh, param_dtype=torch.bfloat16,
                          reduce_dtype=torch.float32, pp_enabled=False)
    calls: list = []
    original = dist.all_reduce

    def all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        calls.append([dist.get_world_size(group), str(tensor.dtype), tensor.numel()])
        return original(tensor, op=dist.ReduceOp.SUM, group=group, async_op=async_op)

    dist.all_reduce = all_reduce
    per_microbatch = []
    for _ in range(2):
        before = len(calls)
        tokens = torch.randint(0, 2048, (1, 32))
        model(tokens).float().sum().backward()
        per_microbatch.append(calls[before:])
    dist.all_reduce = original
    if dist.get_rank() == 0:
        Path(sys.argv[1]).write_text(json.dumps(per_microbatch))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
