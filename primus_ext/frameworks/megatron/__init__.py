"""Megatron-LM / megatron-core: ``table`` (the Megatron-LM flags read and written, with
Megatron-LM's defaults; ``no_effect`` the ones with no effect on step time or memory),
``args`` (flags -> RunSpec, with ``model_flags``, ``vocab``, ``layout_string`` and
``target``),
``flags`` (RunSpec -> flags and a torchrun line), ``model`` and ``build`` (a real GPTModel
with its process groups, DDP and optimizer), ``step`` (one training step on synthetic
data), ``runner`` / ``probes`` / ``contention`` (a measurement run), ``launch`` (the body
of ``launch/pretrain_gpt.py``). The CPU patches are in the top-level ``patches/`` package
(``patches/apply.py`` is their registry)."""
