"""Build a real megatron-core GPTModel from a RunSpec and read what it allocates.

The ground truth of the memory model: parameter elements per rank, the DDP grad/param
buffers and the optimizer state megatron-core actually allocates, the activation bytes
autograd saves per layer (``saved_tensors.SavedTensorCounter``) and the number of
microbatches alive at a pipeline stage's peak. Runs on CPU with gloo after
``patches.apply_cpu_patches()``; one process per rank, process groups re-created per case
so a test can share processes across many cases.

The mcore config is the local (non-TE) spec with Megatron-LM's fusion flags, run eagerly
(``patches/eager_fusions.py``): the fused autograd Functions decide what is saved, as on
a GPU. ``masked_softmax_fusion`` and ``apply_rope_fusion`` are off: their kernels are
CUDA/TE-only, and without them mcore takes the torch path it would take on a GPU too.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from patches import apply_cpu_patches
from primus_ext.frameworks.megatron.model import build_model
from primus_ext.measure.saved_tensors import SavedTensorCounter, gpt_scopes, unwrap
from primus_ext.spec import RunSpec

apply_cpu_patches()


def init_process(rank: int, world_size: int, port: int) -> None:
    """gloo process group, one thread per process (2-core machine, world size 2)."""
    torch.set_num_threads(1)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


def batch(spec: RunSpec, seed: int = 0) -> dict[str, torch.Tensor]:
    """One microbatch of token ids, positions and labels (same on every rank)."""
    g = torch.Generator().manual_seed(seed)
    b, s = spec.train.micro_batch_size, spec.train.seq_length
    tokens = torch.randint(0, spec.model.vocab_size, (b, s), generator=g)
    labels = torch.randint(0, spec.model.vocab_size, (b, s), generator=g)
    pos = torch.arange(s).unsqueeze(0).expand(b, s).contiguous()
    # Megatron-LM's get_batch gives a float loss mask (used by the MTP loss).
    mask = torch.ones(b, s, dtype=torch.float32)
    return {"input_ids": tokens, "position_ids": pos, "labels": labels, "loss_mask": mask}


# ---- what was allocated -----------------------------------------------------------
def param_elements(model) -> dict[str, int]:
    """Parameter elements held by this rank, dense vs expert (mcore's ``allreduce``)."""
    out = {"dense": 0, "expert": 0}
    for p in model.parameters():
        out["dense" if getattr(p, "allreduce", True) else "expert"] += p.numel()
    return out


def ddp_buffer_bytes(ddp) -> dict[str, int]:
    """Bytes of megatron-core DDP's contiguous param and grad buffers."""
    out = {"dense_grad": 0, "dense_param": 0, "expert_grad": 0, "expert_param": 0}
    for kind, buffers in (("dense", ddp.buffers), ("expert", ddp.expert_parallel_buffers)):
        for buf in buffers:
            out[f"{kind}_grad"] += buf.grad_data.numel() * buf.grad_data.element_size()
            if buf.param_data is not None:
                out[f"{kind}_param"] += buf.param_data.numel() * buf.param_data.element_size()
    return out


def optimizer_state_bytes(optimizer) -> dict[str, int]:
    """Bytes of optimizer state: fp32 main params (copies, not views of model params)
    and the torch Adam state tensors (moments; the per-tensor ``step`` scalars apart)."""
    from megatron.core.optimizer import ChainedOptimizer
    opts = optimizer.chained_optimizers if isinstance(optimizer, ChainedOptimizer) \
        else [optimizer]
    out = {"main_params": 0, "moments": 0, "step_scalars": 0}
    for opt in opts:
        inner = opt.optimizer
        model_ptrs = set()
        for group in getattr(opt, "model_float16_groups", []) + \
                getattr(opt, "model_fp32_groups", []):
            model_ptrs.update(p.untyped_storage().data_ptr() for p in group)
        for group in inner.param_groups:
            for p in group["params"]:
                if p.untyped_storage().data_ptr() not in model_ptrs:
                    out["main_params"] += p.numel() * p.element_size()
                for name, v in inner.state.get(p, {}).items():
                    if torch.is_tensor(v):
                        key = "step_scalars" if name == "step" else "moments"
                        out[key] += v.numel() * v.element_size()
    return out


@dataclass
class ActivationResult:
    by_scope: dict[str, int]  # live saved bytes per scope, one microbatch
    details: list  # SavedStorage records


def measure_activations(spec: RunSpec, model, data: dict[str, torch.Tensor],
                        gpu_like_dropout: bool = True,
                        record_sites: bool = False) -> ActivationResult:
    """Saved-for-backward bytes of one forward (then runs the backward to free them)."""
    inner = unwrap(model)
    counter = SavedTensorCounter(scopes=gpt_scopes(inner),
                                 params=list(model.parameters()),
                                 gpu_like_dropout=gpu_like_dropout,
                                 record_sites=record_sites)
    model.train()
    with counter.counting():
        out = model(data["input_ids"], data["position_ids"], None, labels=data["labels"],
                    loss_mask=data["loss_mask"])
    by_scope = counter.bytes_by_scope()
    details = counter.details()
    out.float().sum().backward()
    return ActivationResult(by_scope=by_scope, details=details)


# ---- training-loop pieces: chunks, DDP, optimizer, schedule ------------------------
def build_chunks(spec: RunSpec, config) -> list:
    """One model per virtual pipeline chunk of this rank (a single one without VPP)."""
    vpp = spec.parallel.vpp
    return [build_model(spec, config, vp_stage=c if vpp > 1 else None) for c in range(vpp)]


def wrap_ddp(spec: RunSpec, config, chunks: list, grad_reduce_in_fp32: bool = True,
             bucket_size: int | None = None) -> list:
    """megatron-core DDP per chunk, wired as Megatron-LM's training loop wires it."""
    from megatron.core.distributed import (DistributedDataParallel,
                                           DistributedDataParallelConfig,
                                           finalize_model_grads)
    p = spec.parallel
    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=grad_reduce_in_fp32, overlap_grad_reduce=p.overlap_grad_reduce,
        overlap_param_gather=p.overlap_param_gather and p.use_distributed_optimizer,
        use_distributed_optimizer=p.use_distributed_optimizer, bucket_size=bucket_size)
    wrapped = [DistributedDataParallel(config, ddp_config, chunk,
                                       disable_bucketing=i > 0)
               for i, chunk in enumerate(chunks)]
    config.no_sync_func = [w.no_sync for w in wrapped] if len(wrapped) > 1 \
        else wrapped[0].no_sync
    if p.overlap_grad_reduce:
        config.grad_sync_func = [w.start_grad_sync for w in wrapped] if len(wrapped) > 1 \
            else wrapped[0].start_grad_sync
    config.finalize_model_grads_func = finalize_model_grads
    return wrapped


def build_optimizer(spec: RunSpec, chunks: list):
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    bf16 = spec.train.precision != "fp32"
    cfg = OptimizerConfig(optimizer="adam", lr=1e-4, bf16=bf16,
                          params_dtype=torch.bfloat16 if bf16 else torch.float32,
                          use_distributed_optimizer=spec.parallel.use_distributed_optimizer)
    return get_megatron_optimizer(cfg, chunks)


def _forward_step(data_iterator, model):
    data = next(data_iterator)
    out = model(data["input_ids"], data["position_ids"], None, labels=data["labels"],
                loss_mask=data["loss_mask"])

    def loss_func(output):
        loss = output.float().mean()
        return loss, {"loss": loss.detach()}
    return out, loss_func


def run_schedule(spec: RunSpec, chunks: list, num_microbatches: int, seed: int = 0):
    """One forward-backward over ``num_microbatches`` with mcore's pipeline schedule."""
    from megatron.core.pipeline_parallel import get_forward_backward_func
    data = [batch(spec, seed + i) for i in range(num_microbatches)]
    iters = [iter(list(data)) for _ in chunks]
    for c in chunks:
        c.train()
    return get_forward_backward_func()(
        forward_step_func=_forward_step, data_iterator=iters if len(chunks) > 1 else iters[0],
        model=chunks if len(chunks) > 1 else chunks[0], num_microbatches=num_microbatches,
        seq_length=spec.train.seq_length, micro_batch_size=spec.train.micro_batch_size,
        forward_only=False)


def measure_inflight(spec: RunSpec, chunks: list, num_microbatches: int) -> dict:
    """Microbatches (chunk-microbatches under VPP) whose saved activations are alive
    after each forward of a real pipeline-schedule run on this rank."""
    inners = [unwrap(c) for c in chunks]
    scopes = {}
    for i, inner in enumerate(inners):
        scopes.update({f"chunk{i}.{k}": v for k, v in gpt_scopes(inner).items()})
    params = [p for c in chunks for p in c.parameters()]
    counter = SavedTensorCounter(scopes=scopes, params=params, roots=inners)
    with counter.counting():
        run_schedule(spec, chunks, num_microbatches)
    return {"inflight_after_forward": counter.inflight_after_forward,
            "live_bytes_after_forward": counter.live_bytes_after_forward}
