"""ZeRO-2 (parallel.fsdp_reshard_after_forward=False, FSDP1 SHARD_GRAD_OP): each
layer's gathered parameters are held from its forward to its backward, so the whole
stage is unsharded at the backward's start; gradients and optimizer state as ZeRO-3."""
from __future__ import annotations

import pytest

import primus_ext
from primus_ext.memory.options import MemoryOptions
from primus_ext.memory.states import stage_states


def test_zero2_needs_fsdp_and_holds_the_whole_stage_gathered():
    base = ["model=tiny_dense", "cluster.hardware=cpu", "cluster.num_nodes=1",
            "cluster.gpus_per_node=8", "parallel.fsdp=true"]
    z3 = primus_ext.compose(base)
    z2 = primus_ext.compose(base + ["parallel.fsdp_reshard_after_forward=false"])
    m, t = z3.model, z3.train
    s3 = stage_states(m, z3.parallel, t, 0, 8, 8, MemoryOptions())
    s2 = stage_states(m, z2.parallel, t, 0, 8, 8, MemoryOptions())
    assert s2.param_bytes - s3.param_bytes > 0.5 * s3.num_params * t.param_bytes
    assert s2.grad_bytes == s3.grad_bytes and s2.optimizer_bytes == s3.optimizer_bytes
    with pytest.raises(Exception, match="fsdp_reshard_after_forward"):
        primus_ext.compose(["model=tiny_dense", "cluster.hardware=cpu",
                            "parallel.fsdp_reshard_after_forward=false"])
