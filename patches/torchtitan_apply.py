"""The registry of torchtitan CPU patches (torchtitan 0.3.x, torch 2.13 CPU build, gloo).

``apply_torchtitan_cpu_patches()`` makes torchtitan's own Trainer (``torchtitan.train``)
run on a CPU-only machine: FSDP2, TP (with and without SP), PP schedules, activation
checkpointing. It is a no-op where CUDA is available, and idempotent. Call it after
``import torch`` and before ``import torchtitan`` anything (the device patch must see
torchtitan's first import). Beside the patches, the Trainer needs two of its own flags on
the CPU (``CPU_FLAGS``): the DTensor SPMD backend (the default ``spmd_types`` fails with
DP or TP on torch 2.13) and CUDA graphs off.

One file per concern, each saying what it fixes and for which versions:

- ``torchtitan_cpu_device``: device type ``cpu`` and a host device-module stand-in;
- ``torchtitan_sdpa``: FlexAttention (no CPU backward) -> SDPA in the model configs;
- ``torchtitan_gloo_sum``: FSDP2's PREMUL_SUM gradient reduction -> SUM then divide;
- ``torchtitan_set_timeout``: ``dist.set_timeout`` (called after the first step);
- ``torchtitan_pp_step``: pipeline ``step(arg_mbs=...)`` on torch's whole-batch ``step``.
"""
from __future__ import annotations

import torch

# The versions the patches were written against and checked with (the CPU proof and
# tests/slow run them). Outside them the patches still apply, with a warning line.
TORCHTITAN_VERSIONS = ("0.3.",)
TORCH_VERSIONS = ("2.13.",)
CPU_FLAGS = ("--parallelism.spmd_backend", "partial_dtensor",
             "--training.disable_cuda_graphs")

_APPLIED: list[str] = []


def version_note() -> str | None:
    """A warning line when the installed versions are outside the checked ones."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        tt = version("torchtitan")
    except PackageNotFoundError:
        return "torchtitan is not installed (pip install primus-ext[torchtitan])"
    if not tt.startswith(TORCHTITAN_VERSIONS) or \
            not torch.__version__.startswith(TORCH_VERSIONS):
        return (f"torchtitan {tt} / torch {torch.__version__}: the CPU patches were "
                f"checked with torchtitan {TORCHTITAN_VERSIONS} and torch {TORCH_VERSIONS}")
    return None


def apply_torchtitan_cpu_patches() -> list[str]:
    """Patch torchtitan and torch for a CPU run; returns what was patched."""
    if torch.cuda.is_available():
        return []
    if _APPLIED:
        return list(_APPLIED)
    from patches import (torchtitan_cpu_device, torchtitan_gloo_sum, torchtitan_pp_step,
                         torchtitan_sdpa, torchtitan_set_timeout)
    # The device patch first: it must see torchtitan's first import.
    for mod in (torchtitan_cpu_device, torchtitan_sdpa, torchtitan_gloo_sum,
                torchtitan_set_timeout, torchtitan_pp_step):
        _APPLIED.extend(mod.apply())
    return list(_APPLIED)


def with_cpu_flags(argv: list[str]) -> list[str]:
    """``argv`` plus the CPU flags it lacks, before a trailing subcommand (tyro wants
    ``activation-checkpoint:...`` last). No-op with CUDA."""
    if torch.cuda.is_available():
        return list(argv)
    argv = list(argv)
    cut = next((i for i, a in enumerate(argv) if a.startswith("activation-checkpoint:")),
               len(argv))
    head, tail = argv[:cut], argv[cut:]
    extra = []
    if not any(a.startswith("--parallelism.spmd_backend") for a in head):
        extra += list(CPU_FLAGS[:2])
    if not any(a.startswith("--training.disable_cuda_graphs") for a in head):
        extra.append(CPU_FLAGS[2])
    return head + extra + tail
