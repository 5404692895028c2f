"""The host's share of a step outside the layers: the optimizer step, the iteration's
synchronisations and Megatron-LM's training loop.

Per pipeline stage (every rank runs its own optimizer):

- **Optimizer**: megatron-core's step issues multi-tensor kernels (TE / Apex FusedAdam,
  ``multi_tensor_l2norm``, ``multi_tensor_scale``) but loops over the parameter tensors in
  Python (gradient lists for the norm and clipping, main-gradient copies): the reference
  host's fixed and per-tensor seconds (``compute/host.py optimizer_python``) over the
  target's ``host_speed``. The device's optimizer time (``dp_sync``) and this run side
  by side: the longer one counts. Muon's weights add their per-weight loop and its
  Newton-Schulz kernels (``project/muon_step.py``).
- **Synchronisations** (Megatron-LM ``training.py`` train_step / train, megatron-core
  ``optimizer.py``, ``clip_grads.py``): the gradient norm's ``total_norm.item()``
  (``get_grad_norm_fp32``), the ``logical_and`` / ``reduce_max_stat`` across the
  model-parallel group of ``update_successful`` and the grad norm (an all-reduce and a
  read-back each), ``optimizer.get_loss_scale().item()`` before logging; fp16 adds the
  found-inf all-reduce and read-back (``_unscale_main_grads_and_check_for_nan``).
  ``--log-num-zeros-in-grad``: ``count_zeros_fp32`` counts each gradient
  (``numel - count_nonzero``: two kernels per tensor), all-reduces and reads back;
  ``--log-params-norm``: ``calc_params_l2_norm`` walks every parameter (the optimizer's
  per-tensor Python once more), one multi-tensor norm, an all-reduce and a read-back.
  The MoE router's terms add their per-step reductions (``router_step_work``).
- ``--check-weight-hash-across-dp-replicas-interval``: every parameter copied to the
  host and hashed there (``project/weight_hash.py``), over its interval.
- **Training loop**: ``hardware.step_host_s`` per iteration (scheduler, timers, logging,
  the loop's own Python): a property of the node's host, fitted with the other host
  constants.
"""
from __future__ import annotations

from dataclasses import dataclass

from primus_ext.compute.host import optimizer_python
from primus_ext.memory.muon import MUON_OPTIMIZERS
from primus_ext.memory.rank_params import chunk_param_tensors
from primus_ext.project.muon_step import muon_step
from primus_ext.project.weight_hash import weight_hash_s
from primus_ext.spec import RunSpec

# Read-backs of every iteration (module docstring): grad norm, update_successful and the
# grad norm across the model-parallel group, the loss scale.
BASE_SYNCS = 4
BASE_COLLECTIVES = 3


@dataclass(frozen=True, slots=True)
class StepHost:
    optimizer_s: float  # host seconds of the optimizer step
    other_s: float  # syncs, logging reductions and the training loop


def num_param_tensors(spec: RunSpec, stage: int) -> int:
    p = spec.parallel
    return sum(len(chunk_param_tensors(spec.model, p, stage, c)) for c in range(p.vpp))


def step_host(spec: RunSpec, stage: int) -> StepHost:
    hw = spec.cluster.hardware
    if not hw.host_clock:
        return StepHost(0.0, 0.0)
    tensors = num_param_tensors(spec, stage)
    per_tensor = optimizer_python(tensors) - optimizer_python(0)
    opt = optimizer_python(tensors) / hw.host_speed
    if spec.train.optimizer in MUON_OPTIMIZERS:
        opt += muon_step(spec, stage).host_s
    t = spec.train
    syncs, colls, kernels, python = BASE_SYNCS, BASE_COLLECTIVES, 0, 0.0
    if t.precision == "fp16":
        syncs, colls = syncs + 1, colls + 1
    if t.log_num_zeros_in_grad:
        syncs, colls, kernels = syncs + 1, colls + 1, kernels + 2 * tensors
    if t.log_params_norm:
        syncs, colls, kernels, python = syncs + 1, colls + 1, kernels + 2, python + per_tensor
    s_, c_, k_ = router_step_work(spec, stage)
    syncs, colls, kernels = syncs + s_, colls + c_, kernels + k_
    other = (python / hw.host_speed + kernels * hw.launch_s + syncs * hw.sync_s
             + colls * hw.collective_host_s + hw.step_host_s + weight_hash_s(spec, stage))
    return StepHost(optimizer_s=opt, other_s=other)


def moe_layers_on_stage(spec: RunSpec, stage: int) -> int:
    lay, m = spec.layout, spec.model
    return sum(1 for c in range(lay.vpp)
               for i in range(lay.first_layer(stage, c),
                              lay.first_layer(stage, c) + lay.num_layers(stage, c))
               if m.is_moe_layer(i))


def router_step_work(spec: RunSpec, stage: int) -> tuple[int, int, int]:
    """(read-backs, collectives, kernels) the router's terms add per iteration:
    Megatron-LM's ``track_moe_metrics`` reduces each tracked loss (aux, z) over the
    ranks and reads it back; ``--moe-per-layer-logging`` reads every layer's value;
    the expert bias is updated once per step from the tokens per expert all-reduced
    over data parallelism (``finalize_model_grads`` ``_update_router_expert_bias``) and
    one update per layer."""
    terms = spec.parallel.moe_router_terms
    layers = moe_layers_on_stage(spec, stage)
    if not terms or not layers:
        return 0, 0, 0
    tracked = sum(1 for t in ("aux_loss", "z_loss") if t in terms)
    syncs, colls, kernels = tracked, tracked, 0
    if "per_layer_logging" in terms:
        syncs += layers * max(tracked, 1)
    if "expert_bias" in terms:
        colls, kernels = colls + 1, kernels + 2 * layers
    return syncs, colls, kernels


def p2p_host_s(spec: RunSpec) -> float:
    """The host's part of one pipeline send/receive: the ``batch_isend_irecv`` call and,
    without interleaving, the ``torch.cuda.synchronize()`` megatron-core issues after
    every batched p2p (p2p_communication.py ``_communicate``, ``batch_p2p_sync``, on
    unless ``--overlap-p2p-communication`` with the interleaved schedule turns batching
    off: Megatron-LM sets ``batch_p2p_comm = not overlap_p2p_comm``)."""
    p, hw = spec.parallel, spec.cluster.hardware
    if p.pp == 1 or not hw.host_clock:
        return 0.0
    return hw.collective_host_s + (hw.sync_s if p.vpp == 1 else 0.0)
