"""Version-gated patches to megatron-core, one file per concern.

``apply_cpu_patches()`` (in ``patches.apply``) makes megatron-core 0.14-0.19 run on a
CPU-only machine with the gloo backend; it is a no-op where CUDA is available.
"""
from patches.apply import apply_cpu_patches

__all__ = ["apply_cpu_patches"]
