"""The memory model's ground truth: real megatron-core models built on the CPU and what
they allocate and save (``memory_probe``), run in worker processes (``memory_runner``)
over the configurations of ``memory_cases``, and set beside the model row by row
(``memory_compare``); and what a fused attention kernel saves, measured on PyTorch's
CPU flash kernel (``fused_attention``). Used by tests and ``scripts/``, never by a
projection."""
