"""Sequence parallelism with the local (torch) norm.

What it fixes (megatron-core 0.14-0.19, local spec): ``WrappedTorchNorm`` asserts
``not config.sequence_parallel`` (``sequence parallel not supported by torch LayerNorm``),
so TP with SP -- and hence any MoE with TP > 1, which megatron-core requires to use SP --
cannot be built without Transformer Engine. Under SP a norm acts on the local sequence
shard; its weights are replicated over TP and their gradients must be all-reduced over
TP, which megatron-core does for parameters tagged ``.sequence_parallel = True``
(``finalize_model_grads._allreduce_layernorm_grads``), exactly as TE's norms are tagged.
"""
from __future__ import annotations


def apply() -> list[str]:
    try:
        from megatron.core.transformer import torch_norm
    except ImportError:
        return []
    cls = torch_norm.WrappedTorchNorm
    if getattr(cls, "__primus_sp__", False):
        return ["WrappedTorchNorm(sequence_parallel)"]
    original_new = cls.__new__

    def __new__(klass, config, hidden_size, eps=1e-5, *args, **kwargs):
        if not getattr(config, "sequence_parallel", False):
            return original_new(klass, config, hidden_size, eps, *args, **kwargs)
        # Build with SP switched off on the config itself (a copy would re-run
        # TransformerConfig.__post_init__, which rejects some SP-off combinations).
        config.sequence_parallel = False
        try:
            norm = original_new(klass, config, hidden_size, eps, *args, **kwargs)
        finally:
            config.sequence_parallel = True
        for p in norm.parameters():
            p.sequence_parallel = True
        return norm

    cls.__new__ = staticmethod(__new__)
    cls.__primus_sp__ = True
    return ["WrappedTorchNorm(sequence_parallel)"]
