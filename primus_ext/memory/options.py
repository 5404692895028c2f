"""MemoryOptions: knobs of the memory model that are not part of a run's spec.

Two kinds:

- implementation switches of megatron-core that change what is allocated
  (``grad_reduce_in_fp32``, DDP bucket size and padding, ``bias_activation_fusion``);
  defaults are Megatron-LM's defaults for a bf16 GPU run;
- memory that is real on a GPU but is not a model tensor: CUDA context, NCCL
  communicator buffers, allocator fragmentation (outside PyTorch's allocator), and the
  cuBLAS/TE workspaces (inside it, sized from the hardware preset unless overridden).
  The first three's defaults are round, documented priors (measure them once per
  machine: ``nvidia-smi`` used memory minus ``torch.cuda.memory_reserved()`` after init
  gives the context; the reserved minus allocated gap at peak gives fragmentation).
"""
from __future__ import annotations

from dataclasses import dataclass

MIB = 1 << 20
GIB = 1 << 30


# A peak this close to the device (and under it) is reported as tight, not as a failure.
TIGHT_FRACTION = 0.05


@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryOptions:
    # ---- fits verdict --------------------------------------------------------------
    # fits = peak * (1 + margin_fraction) <= device bytes. The verdict itself takes no
    # margin: the peak already holds the named overheads (CUDA context, workspaces, NCCL
    # buffers, allocator fragmentation), and a blanket margin on top called runs that ran
    # "does not fit" (NeMo's Llama 3 8B TP1 CP2 recipe; NVIDIA rows that published no
    # recompute then read as recomputing). A peak within TIGHT_FRACTION of the device is
    # reported as tight instead; the tuner keeps its own ``tune.memory_margin`` for the
    # layouts it recommends.
    margin_fraction: float = 0.0

    # ---- megatron-core implementation switches --------------------------------------
    # Megatron-LM turns --accumulate-allreduce-grads-in-fp32 on for bf16: the DDP grad
    # buffer (main_grad) is fp32. False: gradients in the parameter dtype. None: follow
    # the run's ``parallel.grad_reduce_in_fp32`` (the normal case).
    grad_reduce_in_fp32: bool | None = None
    # DDP bucket size in elements; None: megatron-core's default max(40M, 1M * dp).
    ddp_bucket_size: int | None = None
    # DistributedDataParallelConfig.pad_buckets_for_high_nccl_busbw (pads buckets to a
    # multiple of lcm(dp, 128, 2**16) instead of lcm(dp, 128)).
    pad_buckets_for_high_nccl_busbw: bool = False
    # TransformerConfig.bias_activation_fusion (Megatron-LM --bias-swiglu-fusion /
    # --bias-gelu-fusion, on by default). Fused SwiGLU saves only its input; unfused
    # (mcore 0.16 local path) also keeps the gate activation and a copy of the linear
    # half: 5 instead of 3 ffn-sized tensors.
    bias_activation_fusion: bool = True
    # Transformer Engine's fused cross entropy (--cross-entropy-fusion-impl te): False,
    # TE <= 2.17, writes the input gradient into the logits in place and saves them;
    # True, TE >= 2.18 (NVIDIA/TransformerEngine#3193, transformer_engine/pytorch/triton/
    # cross_entropy.py: "Store the input gradient in FP32"), saves a new fp32 gradient
    # (memory/head.py).
    te_cross_entropy_fp32_grad: bool = False

    # ---- torchtitan implementation switches -----------------------------------------
    # ChunkedLossWrapper num_chunks (torchtitan 0.3.0 components/loss.py, default 8):
    # lm_head and the loss run chunk by chunk; 1 = the whole-sequence logits and fp32
    # cross-entropy of torchtitan before the chunked loss (the Dec. 2024 benchmarks).
    torchtitan_loss_chunks: int = 8

    # ---- non-model memory on a GPU ---------------------------------------------------
    # CUDA context, kernels/modules loaded, cuBLAS/cuDNN handles (H100, CUDA 12: about
    # 0.5 GiB outside the PyTorch allocator).
    cuda_context_bytes: int = 512 * MIB
    # GEMM workspaces in the caching allocator. None: PyTorch's cuBLAS workspaces and
    # Transformer Engine's, sized by the hardware preset for the run's stack
    # (memory/overhead.py); an int replaces them all.
    workspace_bytes: int | None = None
    # NCCL buffers per communicator a rank belongs to (NCCL_BUFFSIZE 4 MiB x send/recv x
    # channels): counted for every parallel group of size > 1 (tp, cp, ep, dp, pp,
    # expert-dp, embedding).
    nccl_bytes_per_communicator: int = 64 * MIB
    # Caching-allocator fragmentation: reserved-but-unused bytes as a fraction of the
    # activation bytes (the tensors that are allocated and freed every microbatch).
    fragmentation_fraction: float = 0.05

    def __post_init__(self) -> None:
        for f in ("margin_fraction", "fragmentation_fraction"):
            v = getattr(self, f)
            if not 0 <= v < 1:
                raise ValueError(f"memory.{f}={v} must be in [0, 1)")
        for f in ("cuda_context_bytes", "workspace_bytes", "nccl_bytes_per_communicator"):
            if getattr(self, f) is not None and getattr(self, f) < 0:
                raise ValueError(f"memory.{f}={getattr(self, f)} must be >= 0")
        if self.torchtitan_loss_chunks < 1:
            raise ValueError(f"memory.torchtitan_loss_chunks={self.torchtitan_loss_chunks} "
                             "must be >= 1")
        if self.ddp_bucket_size is not None and self.ddp_bucket_size <= 0:
            raise ValueError(f"memory.ddp_bucket_size={self.ddp_bucket_size} must be > 0")


DEFAULT_OPTIONS = MemoryOptions()
