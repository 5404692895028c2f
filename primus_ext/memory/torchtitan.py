"""Per-rank memory of a torchtitan (0.3.0) run: the same MemoryReport as megatron-core's.

Parameters, gradients and optimizer state (FSDP2, ``torch.distributed.fsdp.fully_shard``
as ``torchtitan.distributed.fsdp.apply_fsdp_to_decoder`` applies it: one FSDP unit per
block, one for the embedding, one for the final norm with the output):

- sharded parameters in fp32 (``training.dtype`` float32; the mixed-precision policy
  casts to bf16 only for compute) over ``dp_shard * cp`` (the ``fsdp`` mesh; experts
  under EP over ``efsdp = dp_shard * cp * tp / ep``), after TP has sharded them over
  ``tp`` (routed experts too when EP is off; under EP they are split over ``ep`` and not
  over TP: ``spec/torchtitan.py expert_tp``);
  each tensor's shard rounded up (FSDP2 pads dim 0 to the mesh size, approximated per
  tensor here);
- sharded gradients in fp32 (``mixed_precision_reduce`` float32) and AdamW's two fp32
  moments over the same shard, plus its 4-byte ``step`` per parameter tensor; no
  separate master copy (the parameters are fp32);
- unsharded bf16 parameters in flight: with ``reshard_after_forward`` (torchtitan's
  default without PP) the block being computed and the next one, prefetched (FSDP2's
  implicit prefetch); without it (the default under PP, ``fsdp_reshard_after_forward``
  "default") every block of the stage stays gathered from its forward to its backward;
- in a block's backward, its unsharded bf16 gradient and the fp32 copy the
  reduce-scatter reads (``reduce_dtype`` float32); under PP the whole stage's unsharded
  gradients accumulate in fp32 until the last microbatch (gradient sync deferred by
  torch.distributed.pipelining).

Activations: ``torchtitan_act.py`` per block and microbatch, times the microbatches in
flight of the pipeline schedule (1F1B / ZB: ``pp - stage``; GPipe: all; interleaved as
megatron-core's count), plus one block's full activations while it is recomputed
(activation checkpointing) and, on the last stage, the chunked loss's transient.
Other terms (CUDA context, workspaces, NCCL communicators, fragmentation) are the
megatron-core model's, without megatron's global memory buffer.
"""
from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from primus_ext.memory.inflight import inflight_1f1b, inflight_interleaved
from primus_ext.memory.options import DEFAULT_OPTIONS, MemoryOptions
from primus_ext.memory.overhead import other_items
from primus_ext.memory.rank_params import chunk_param_tensors
from primus_ext.memory.report import MemoryReport, StageMemory
from primus_ext.memory.torchtitan_act import (block_items, embedding_items,
                                              loss_working_bytes, output_items)
from primus_ext.spec.run import RunSpec
from primus_ext.spec.torchtitan import (expert_tp, resolved_dp_shard,
                                        stage_layer_counts)

PARAM_BYTES = 4  # fp32 sharded parameters (TrainingConfig.dtype "float32")
GRAD_BYTES = 4  # fp32 sharded gradients (mixed_precision_reduce "float32")
ADAMW_BYTES = 8  # exp_avg and exp_avg_sq in fp32
UNSHARDED_BYTES = 2  # bf16 all-gathered parameters (mixed_precision_param "bfloat16")


def layout_par(spec: RunSpec):
    """The ParallelSpec with torchtitan's pipeline split as an explicit layout."""
    par = replace(spec.parallel, etp=expert_tp(spec.parallel))
    if par.pp == 1:
        return replace(par, pipeline_layout=None)
    counts = stage_layer_counts(par.pp * par.vpp, spec.model.num_layers)
    return replace(par, pipeline_layout=counts)


def fsdp_sizes(spec: RunSpec) -> tuple[int, int]:
    """(fsdp, efsdp) mesh sizes: dp_shard*cp, and dp_shard*cp*tp/ep for experts."""
    p = spec.parallel
    shard = resolved_dp_shard(p.dp_shard, p.dp_replicate, p.cp, p.tp, p.pp,
                              spec.world_size)
    fsdp = shard * p.cp
    return fsdp, max(fsdp * p.tp // p.ep, 1)


def reshard_after_forward(spec: RunSpec) -> bool:
    """torchtitan get_fsdp_reshard_after_forward_policy("default"): not under PP."""
    return spec.parallel.pp == 1


def _block_params(tensors) -> list[tuple[int, int]]:
    """(dense, expert) elements per FSDP unit of a chunk, in execution order: the
    embedding, one per decoder block, the final norm with the output."""
    units: dict[str, list[int]] = {}
    for t in tensors:
        parts = t.name.split(".")
        if t.name.startswith("decoder.layers."):
            key = ".".join(parts[:3])
        elif t.name.startswith("embedding."):
            key = "tok_embeddings"
        else:  # decoder.final_layernorm, output_layer: one unit [norm, lm_head]
            key = "norm_lm_head"
        u = units.setdefault(key, [0, 0])
        u[1 if t.expert else 0] += t.numel
    return [tuple(v) for v in units.values()]


def fsdp_units(spec: RunSpec, stage: int) -> list[tuple[int, int]]:
    """(dense, expert) elements on this rank per FSDP unit of a stage, in execution
    order over its chunks."""
    par = layout_par(spec)
    units: list[tuple[int, int]] = []
    for chunk in range(par.vpp):
        units += _block_params(chunk_param_tensors(spec.model, par, stage, chunk))
    return units


@lru_cache(maxsize=4096)
def num_param_tensors(model, tensors) -> int:
    """Parameter tensors as torchtitan registers them: megatron-core's list, with the
    fused gated fc1 split into w1 and w3 (models/common/feed_forward.py)."""
    split = sum(1 for t in tensors
                if model.gated and t.name.endswith("mlp.linear_fc1.weight"))
    return len(tensors) + split


def _states(spec: RunSpec, stage: int) -> tuple[int, int, int, int, int, int, int]:
    par = layout_par(spec)
    fsdp, efsdp = fsdp_sizes(spec)
    shard = total = expert = num_tensors = 0
    units: list[tuple[int, int]] = []
    for chunk in range(par.vpp):
        tensors = chunk_param_tensors(spec.model, par, stage, chunk)
        for t in tensors:
            total += t.numel
            expert += t.numel if t.expert else 0
            shard += -(-t.numel // (efsdp if t.expert else fsdp))
        units += _block_params(tensors)
        num_tensors += num_param_tensors(spec.model, tensors)
    sizes = [d + e for d, e in units]  # in execution order
    if reshard_after_forward(spec):
        # The unit computed and the next one, prefetched (forward: embedding, blocks,
        # [norm, lm_head]; backward the reverse): the largest neighbouring pair.
        in_flight = max((a + b for a, b in zip(sizes, sizes[1:])), default=sum(sizes))
    else:
        in_flight = total
    largest = max(sizes, default=0)
    return total, expert, shard, in_flight, largest, fsdp, num_tensors


def _chunk_activations(spec: RunSpec, stage: int, chunk: int, layers: int,
                       options: MemoryOptions) -> tuple[int, int]:
    """(saved bytes per microbatch, transient working bytes) of one model chunk."""
    model, par, train = spec.model, layout_par(spec), spec.train
    first = stage == 0 and chunk == 0
    last = stage == par.pp - 1 and chunk == par.vpp - 1
    saved = working = 0
    dense = sum(block_items(model, par, train, False, options).values())
    moe = sum(block_items(model, par, train, True, options).values()) if model.is_moe else 0
    lay = layout_par(spec)
    start = sum(lay.pipeline_layout[:chunk * par.pp + stage]) if lay.pipeline_layout else 0
    for layer in range(start, start + layers):
        saved += moe if model.is_moe_layer(layer) else dense
    if train.activation_checkpoint != "none" and layers:
        full = max(sum(block_items(model, par, train, m, options, ac="none").values())
                   for m in ({False, True} if model.is_moe else {False}))
        working = full
    if first:
        saved += sum(embedding_items(par, train).values())
    if last:
        saved += sum(output_items(model, par, train).values())
        chunks = train.loss_chunks or options.torchtitan_loss_chunks
        working = max(working, loss_working_bytes(model, par, train, chunks))
    return saved, working


def _inflight(spec: RunSpec, stage: int, per_mb: tuple[int, ...]) -> tuple[int, ...]:
    par, m = spec.parallel, spec.num_microbatches
    if par.pp == 1:
        return (1,)
    sim = par.resolved_schedule
    if sim == "fill_drain":
        return tuple(m for _ in per_mb)
    if par.vpp == 1 or sim == "zb":
        return tuple(inflight_1f1b(par.pp, stage, m) for _ in per_mb)
    return inflight_interleaved(par.pp, par.vpp, stage, m, per_mb)


def _stage(spec: RunSpec, stage: int, options: MemoryOptions) -> StageMemory:
    model, par, train = spec.model, spec.parallel, spec.train
    total, expert, shard, in_flight, largest, fsdp, num_tensors = _states(spec, stage)
    lay = layout_par(spec)
    counts = lay.pipeline_layout or (model.num_layers,)
    chunks = [_chunk_activations(spec, stage, c, counts[c * par.pp + stage], options)
              for c in range(par.vpp)]
    per_mb = tuple(c[0] for c in chunks)
    alive = _inflight(spec, stage, per_mb)
    act = sum(a * b for a, b in zip(alive, per_mb)) + max(c[1] for c in chunks)
    param_bytes = shard * PARAM_BYTES + in_flight * UNSHARDED_BYTES
    if par.pp > 1:
        # torch.distributed.pipelining (stage.py) turns FSDP2's gradient sync off for all
        # but the last microbatch: FSDPParam.to_accumulated_grad_if_needed keeps every
        # unsharded gradient of the stage, upcast to the reduce dtype (fp32), next to
        # the bf16 gradient of the unit being accumulated.
        grad_bytes = shard * GRAD_BYTES + total * GRAD_BYTES + largest * UNSHARDED_BYTES
    else:
        grad_bytes = shard * GRAD_BYTES + largest * (UNSHARDED_BYTES + GRAD_BYTES)
    # AdamW: two fp32 moments per element and a 4-byte fp32 ``step`` per parameter tensor
    # (torch.optim.AdamW state; with torchtitan's default "fused" implementation it is on
    # the device).
    opt_bytes = (shard * ADAMW_BYTES + 4 * num_tensors if train.optimizer == "adam"
                 else shard * 4)
    expert_dp = fsdp_sizes(spec)[1]
    other = other_items(model, par, replace(train, te=False), spec.dp,
                        expert_dp, act, options, spec.cluster.hardware)
    other.pop("global_memory_buffer", None)  # megatron-core's, not torchtitan's
    other_bytes = sum(other.values())
    return StageMemory(
        stage=stage, num_params=total, num_expert_params=expert, param_bytes=param_bytes,
        grad_bytes=grad_bytes, optimizer_bytes=opt_bytes,
        activation_bytes_per_microbatch=sum(per_mb),
        num_inflight_microbatches=-(-sum(alive) // par.vpp), activation_bytes=act,
        other_bytes=other_bytes,
        total_bytes=param_bytes + grad_bytes + opt_bytes + act + other_bytes,
        inflight_per_chunk=tuple(alive), other=tuple(other.items()))


@lru_cache(maxsize=4096)
def _report(spec: RunSpec, options: MemoryOptions) -> MemoryReport:
    stages = tuple(_stage(spec, s, options) for s in range(spec.parallel.pp))
    worst = max(range(len(stages)), key=lambda i: stages[i].total_bytes)
    peak = stages[worst].total_bytes
    device = spec.cluster.hardware.hbm_bytes
    notes = ["torchtitan: FSDP2 fp32 sharded params/grads/AdamW over dp_shard*cp; bf16 "
             "unsharded params of the blocks in flight"]
    if spec.train.precision == "fp8":
        notes.append("fp8: float8 linears counted with bf16 all-gathers and bf16 saved "
                     "inputs (torchao's fp8 casts and amax buffers not modelled)")
    if spec.model.is_moe or spec.model.multi_latent_attention:
        notes.append("torchtitan MoE / MLA blocks itemised as megatron-core's")
    return MemoryReport(stages=stages, peak_bytes=peak, worst_stage=worst,
                        device_bytes=device,
                        fits=peak * (1 + options.margin_fraction) <= device,
                        margin_fraction=options.margin_fraction, notes=tuple(notes))


def torchtitan_memory_report(spec: RunSpec, options: MemoryOptions | None = None
                             ) -> MemoryReport:
    """Per-stage, per-rank memory of a ``framework=torchtitan`` spec."""
    return _report(spec, options or DEFAULT_OPTIONS)
