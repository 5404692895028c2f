"""Megatron-LM / megatron-core: ``args`` (Megatron-LM flags -> RunSpec), ``flags``
(RunSpec -> flags and a torchrun line), ``model`` and ``build`` (a real GPTModel with its
process groups, DDP and optimizer), ``step`` (one training step on synthetic data),
``runner`` / ``probes`` / ``contention`` (a measurement run), ``launch`` (the body of
``launch/pretrain_gpt.py``). The CPU patches are in the top-level ``patches/`` package
(``patches/apply.py`` is their registry)."""
