"""A recipe under --deterministic-mode exports what Megatron-LM requires with it
(core_v0.16.1 arguments.py validate_args: "NCCL_ALGO must be one of [...]"; megatron-core
transformer_engine.py: NVTE_ALLOW_NONDETERMINISTIC_ALGO must be 0)."""
import dataclasses

import primus_ext
from primus_ext.frameworks.megatron.flags import torchrun_script


def test_deterministic_recipe_exports_its_environment():
    spec = primus_ext.compose(["model=tiny_dense", "cluster.hardware=h100",
                               "train.global_batch_size=64"])
    plain = torchrun_script(spec)
    det = torchrun_script(dataclasses.replace(
        spec, train=dataclasses.replace(spec.train, deterministic_mode=True)))
    assert "NCCL_ALGO" not in plain
    assert "export NCCL_ALGO=${NCCL_ALGO:-Ring}" in det
    assert "export NVTE_ALLOW_NONDETERMINISTIC_ALGO=0" in det
    assert "--deterministic-mode" in det


def test_recipe_exports_the_hardware_queues_it_was_projected_with():
    # train.device_hw_queues (HIP GPU_MAX_HW_QUEUES) caps the grouped GEMM's concurrent
    # streams in the projection; the recipe runs with the same setting.
    spec = primus_ext.compose(["model=tiny_dense", "cluster.hardware=h100",
                               "train.global_batch_size=64"])
    assert "GPU_MAX_HW_QUEUES" not in torchrun_script(spec)
    two = torchrun_script(dataclasses.replace(
        spec, train=dataclasses.replace(spec.train, device_hw_queues=2)))
    assert "export GPU_MAX_HW_QUEUES=2" in two
