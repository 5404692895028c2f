"""Weights, gradients and optimizer state on the GPU stack (Transformer Engine), beside
the local-spec figures of ``states.py``. Source-derived (TE cannot run on a CPU).

FP8 weights (``train.precision == "fp8"``), only for the weights of TE's linear modules
(QKV, projections, fc1/fc2, MLA projections, experts; not the embedding, the output
layer, the router or norms, which megatron-core keeps in bf16):

- without ``--fp8-param-gather`` the bf16 weights stay and TE caches their FP8 copy
  between microbatches (megatron-core passes ``is_first_microbatch``, so TE's
  ``Linear.forward`` keeps ``self._fp8_workspaces["weight"]``): a row-wise copy for the
  forward GEMM and a column-wise copy for dgrad, one byte each;
- with ``--fp8-param-gather`` the weights themselves are FP8 (``fp8_model_init``):
  megatron-core's DDP stores them in a uint8 buffer (``param_and_grad_buffer.py``
  ``_param_uses_quantized_storage`` -> ``torch.uint8``), one byte per element, and no
  bf16 copy exists; after each all-gather ``megatron/core/fp8_utils.py``
  ``post_all_gather_processing`` calls TE's ``post_all_gather_processing``
  (``transformer_engine/pytorch/tensor/utils.py``), which creates the transpose of a
  tensorwise/delayed Float8Tensor where the GPU has no non-TN FP8 GEMM (Hopper,
  ``is_non_tn_fp8_gemm_supported``) and the column-wise copy of a blockwise one: one
  more byte per element (MXFP8 keeps both directions from the start).

Gradients: the DDP buffer holds them in bf16 when ``parallel.grad_reduce_in_fp32`` is
false or ``train.main_grads_dtype == "bf16"`` (Megatron-LM ``arguments.py``:
``--main-grads-dtype bf16`` turns ``accumulate_allreduce_grads_in_fp32`` off); the
gradient of an FP8 parameter is in its nominal dtype, bf16.

Precision-aware optimizer (``--use-precision-aware-optimizer``, megatron-core
``optimizer/__init__.py`` passes ``exp_avg_dtype`` / ``exp_avg_sq_dtype`` /
``master_weight_dtype`` to TE's ``FusedAdam``, ``optimizers/fused_adam.py``):
``_initialize_state`` allocates each moment in its dtype (fp8 as a Float8Tensor, one
byte, plus one fp32 scale per tensor), and the fp32 master weight of a bf16 parameter as
its 16 trailing bits (``store_param_remainders``, on by default in megatron-core's
``OptimizerConfig``: an int16 per element). FP8 parameters with a non-delayed recipe keep
megatron-core's own fp32 master copy (``use_precision_aware_optimizer_no_fp8_or_ds_fp8``).
"""
from __future__ import annotations

from primus_ext.memory.rank_params import chunk_param_tensors
from primus_ext.spec.model import ModelSpec
from primus_ext.spec.parallel import ParallelSpec
from primus_ext.spec.train import TrainSpec

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}


def is_te_linear_weight(name: str) -> bool:
    """A weight that TE's Linear / LayerNormLinear / GroupedLinear holds (FP8-castable)."""
    leaf = name.rsplit(".", 2)
    return name.endswith(".weight") and ("linear_" in name or "eh_proj" in name) \
        and "layernorm" not in leaf[-2] and not name.startswith("output_layer")


def stage_fp8_weight_elements(model: ModelSpec, par: ParallelSpec, stage: int) -> int:
    """Elements of TE linear weights one rank of ``stage`` holds (all its chunks)."""
    return sum(t.numel for c in range(par.vpp)
               for t in chunk_param_tensors(model, par, stage, c)
               if is_te_linear_weight(t.name))


def fp8_weight_bytes_per_element(train: TrainSpec, non_tn_fp8_gemm: bool) -> int:
    """Bytes one rank holds per element of a TE linear weight in an FP8 run: the weight
    (bf16, or the uint8 FP8 storage with ``fp8_param_gather``) plus TE's FP8 copies. The
    per-block scales of mxfp8 / blockwise (1/32 of a byte per element or less) are left
    out."""
    # A second (column-wise) FP8 copy unless the GPU runs the transposed GEMM directly
    # on the row-wise data (tensorwise / delayed on Blackwell).
    two_ways = train.fp8_recipe in ("blockwise", "mxfp8") or not non_tn_fp8_gemm
    copies = 2 if two_ways else 1
    if train.fp8_param_gather:
        return copies  # the FP8 parameter is the row-wise copy
    return train.param_bytes + copies  # bf16 weight + TE's cached FP8 workspace


def precision_aware_optimizer_bytes(train: TrainSpec) -> int:
    """Optimizer bytes per parameter element this rank owns, TE FusedAdam."""
    moments = DTYPE_BYTES[train.exp_avg_dtype] + DTYPE_BYTES[train.exp_avg_sq_dtype]
    fp8_params = train.precision == "fp8" and train.fp8_param_gather
    if fp8_params and train.fp8_recipe != "delayed":
        master = 4  # megatron-core's own fp32 master copy
    elif fp8_params:
        master = 4  # FusedAdam master for a non-bf16 param: no remainder trick
    else:
        master = 2  # store_param_remainders: int16 trailing bits of the fp32 master
    return moments + master
