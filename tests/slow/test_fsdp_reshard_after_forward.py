"""FSDP's collectives per layer and step with and without resharding after forward,
against a real PyTorch FSDP2 run (2 CPU processes, gloo): ``reshard_after_forward=True``
gathers each block's parameters in forward and again in backward, ``False`` (ZeRO-2, as
FSDP1's SHARD_GRAD_OP) only in forward; one gradient reduce-scatter either way.
comm/layer_comm.fsdp_comms must issue the same collectives per layer."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import primus_ext
from primus_ext.comm.layer_comm import fsdp_comms

HERE = Path(__file__).resolve().parent
_TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                  "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT")


def _real_counts(reshard: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in _TORCHRUN_VARS}
    env.update(OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node=2", str(HERE / "fsdp_reshard_counts.py"), "1" if reshard else "0"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads([ln for ln in out.stdout.splitlines() if ln.startswith("{")][-1])


@pytest.mark.parametrize("reshard", [True, False])
def test_fsdp_collectives_per_layer_match_torch_fsdp(reshard):
    real = _real_counts(reshard)
    spec = primus_ext.compose(["model=tiny_dense", "cluster.hardware=cpu",
                               "cluster.num_nodes=1", "cluster.gpus_per_node=2",
                               "parallel.fsdp=true",
                               f"parallel.fsdp_reshard_after_forward={str(reshard).lower()}"])
    ops = [c for c, _ in fsdp_comms(spec, 1e6, 0.0, 1.0, 1.0, "dense")]
    assert sum(c.collective == "all_gather" for c in ops) * real["blocks"] == \
        real["all_gather"]
    assert sum(c.collective == "reduce_scatter" for c in ops) * real["blocks"] == \
        real["reduce_scatter"]
