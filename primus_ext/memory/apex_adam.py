"""Optimizer state of NeMo 1's distributed Adam (``train.optimizer_impl =
'apex_distributed_fused_adam'``). Source-derived: Apex's kernels have no CPU build.

NeMo 1 (the NeMo Framework containers up to 24.07 run ``megatron_gpt_pretraining.py``
with NeMo-Framework-Launcher's ``conf/training/<family>/<model>.yaml``, every one of which
sets ``optim.name: distributed_fused_adam`` until launcher commit 3dd35614, 2024-12-05,
"switch to mcore's optimizer") builds NeMo's ``MegatronDistributedFusedAdam``
(``nemo/core/optim/distributed_adam.py``), a subclass of Apex's ``DistributedFusedAdam``
(``apex/contrib/optimizers/distributed_fused_adam.py``), with the keyword arguments that
``MegatronBaseModel.setup_optimization`` picks (NeMo r2.0.0rc1
``nemo/collections/nlp/models/language_modeling/megatron_base_model.py`` lines 775-804):

- ``dtype`` = ``optim.dtype`` (default ``torch.float32``): the dtype of the state;
- ``param_sync_dtype`` = the model's dtype (bf16 / fp16 under ``megatron_amp_O2``);
- the master copy: with ``fp8_params`` one in ``dtype`` (``store_params``); with
  ``dtype`` equal to the model's dtype none (``store_params=False``: Adam steps the
  bf16 parameters themselves); fp32 state over bf16 parameters only the 16 low bits of
  each fp32 master weight (``store_param_remainders=True``); otherwise one in ``dtype``.

Apex's ``StateBucket.__init__`` (apex f9f19d5c, lines 449-476) allocates over the rank's
shard of each bucket (1/dp of it): ``params_shard`` in ``dtype`` if ``store_params``,
``param_remainders_shard`` as int16 if ``store_param_remainders``, and ``exp_avg_shard``
and ``exp_avg_sq_shard`` in ``dtype``. Per element the rank owns:

- ``dtype`` fp32 over a bf16 model: 4 + 4 + 2 = 10 bytes (megatron-core's optimizer: 12);
- ``dtype`` bf16 over a bf16 model: 2 + 2 = 4 bytes, no master copy.

Gradients sit in Apex's contiguous grad buffer (``contiguous_grad_buffer``,
``_init_grad_buffer``: every local parameter, in ``grad_sync_dtype`` = NeMo
``optim.grad_sync_dtype``, i.e. ``parallel.grad_reduce_in_fp32``), parameters in the
model's own tensors (or ``contiguous_param_buffer`` views): the bytes of megatron-core's
DDP ``grad_data`` / ``param_data``, which ``states.py`` counts.

Not modelled: Apex pads its buckets (``bucket_cap_mb``, the last one allocated whole)
differently from megatron-core, at most one bucket apart; the reduce-scatter output shards
(``sync_grads_shard``, ``torch.empty`` in ``_start_bucket_grad_sync``, dropped by
``zero_grad``) appear from a model chunk's last backward on, after the activation peak;
the all-gather's shard buffers (``params_shard``, ``torch.empty`` in ``step`` without a
contiguous parameter buffer) are dropped as each bucket's gather finishes
(``_finish_bucket_param_sync``) in the next step's first forwards.
"""
from __future__ import annotations

from primus_ext.spec.train import TrainSpec

_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


def model_dtype(train: TrainSpec) -> str:
    """NeMo's ``autocast_dtype`` under ``megatron_amp_O2`` (FP8 runs keep bf16 weights)."""
    return {"fp8": "bf16"}.get(train.precision, train.precision)


def master_bytes(train: TrainSpec) -> int:
    """Bytes of the master copy per owned element (module docstring)."""
    dtype = train.exp_avg_dtype
    if train.precision == "fp8" and train.fp8_param_gather:
        return _BYTES[dtype]  # fp8_params: store_params
    if dtype == model_dtype(train):
        return 0
    if dtype == "fp32" and model_dtype(train) == "bf16":
        return 2  # store_param_remainders: int16
    return _BYTES[dtype]


def apex_adam_bytes_per_element(train: TrainSpec) -> int:
    """Optimizer bytes per parameter element this rank owns: the two moments in Apex's
    state dtype plus the master copy NeMo asks for."""
    return 2 * _BYTES[train.exp_avg_dtype] + master_bytes(train)


def apex_adam_step_bytes(train: TrainSpec, grad_bytes: int) -> int:
    """Bytes one owned element moves in Apex's fused step (``_local_step`` /
    ``_local_step_with_param_remainders``: ``distributed_adam_cuda.multi_tensor_fused_adam``
    and its remainder variant): the state, the parameter and the gradient read, the
    state and the parameter written."""
    state = apex_adam_bytes_per_element(train)
    return 2 * (state + train.param_bytes) + grad_bytes
