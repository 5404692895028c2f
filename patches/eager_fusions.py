"""Eager megatron-core fusions: undo ``jit_fuser`` (``torch.compile``) on a CPU.

What it fixes (megatron-core 0.14-0.19 with torch >= 2.2, where ``jit_fuser`` is
``torch.compile``): on a CPU every fused helper (bias-dropout-add, bias-SwiGLU/GeLU, the
MoE expert GLU, the router expert bias) is compiled by inductor through the host C++
compiler on first use -- seconds per function and shape, per process -- and inside a
compiled region the AOT partitioner, not the code, decides which tensors are saved for
backward. Eager execution keeps the ``torch.autograd.Function`` boundaries
(``BiasSwiGLUFunction`` saves its input, ``GeLUFunction`` input and bias), which is what
the memory model describes.

``import megatron.core`` already imports the fusion modules, so the patch cannot run
before them: it sets ``jit_fuser`` to the no-op decorator in ``megatron.core.jit`` and in
every loaded megatron module that bound it (decorators applied later, e.g. inside
``experts.py`` constructors, are then eager), and replaces every already-compiled module
function by the original (``_torchdynamo_orig_callable``). Call sites look the
functions up as module globals, so they get the eager ones.
"""
from __future__ import annotations

import sys


def apply() -> list[str]:
    try:
        from megatron.core import jit
    except ImportError:
        return []
    jit.disable_jit_fuser()
    unwrapped = 0
    for name, module in list(sys.modules.items()):
        if not name.startswith("megatron.core") or module is None:
            continue
        if hasattr(module, "jit_fuser"):
            module.jit_fuser = jit.noop_decorator
        for attr, value in list(vars(module).items()):
            orig = getattr(value, "_torchdynamo_orig_callable", None)
            if orig is not None and callable(value):
                setattr(module, attr, orig)
                unwrapped += 1
    return [f"megatron.core jit_fuser=noop ({unwrapped} compiled functions made eager)"]
