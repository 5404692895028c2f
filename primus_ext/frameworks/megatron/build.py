"""Build a real megatron-core GPT training setup from a RunSpec.

Process groups (gloo on the CPU, nccl on CUDA), ``initialize_model_parallel(tp, pp, vpp,
cp, ep, etp)``, a GPTModel per virtual pipeline chunk (local spec; the Transformer Engine
spec when TE imports on a CUDA machine), Float16Module for bf16/fp16, mcore
DistributedDataParallel and ``get_megatron_optimizer``, wired as Megatron-LM's training
loop wires them (reference/megatron-on-cpu.md Sec. 3): ``no_sync_func``,
``grad_sync_func`` (overlap), ``finalize_model_grads_func``.

Import order matters: call ``primus_ext.measure.tracer.install_tracer()`` and then
``prepare_runtime()`` before anything imports megatron.core.
"""
from __future__ import annotations

import datetime
import os
import socket
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from primus_ext.spec import RunSpec, padded_vocab


def prepare_runtime(num_threads: int | None = None) -> list[str]:
    """Install the collective tracer, apply the CPU patches (no-op on CUDA); returns the
    patches applied. Threads: ``num_threads`` or $OMP_NUM_THREADS if set."""
    from primus_ext.measure.tracer import install_tracer
    install_tracer()
    threads = num_threads or int(os.environ.get("OMP_NUM_THREADS", "0") or 0)
    if threads > 0 and not torch.cuda.is_available():
        torch.set_num_threads(threads)
    from patches.apply import apply_cpu_patches
    return apply_cpu_patches()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed() -> tuple[int, int]:
    """Init the default process group from torchrun's env (or a 1-process group)."""
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0",
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if cuda else "gloo",
                            timeout=datetime.timedelta(minutes=10))
    return dist.get_rank(), dist.get_world_size()


def _dtype(precision: str) -> torch.dtype:
    return {"bf16": torch.bfloat16, "fp8": torch.bfloat16, "fp16": torch.float16,
            "fp32": torch.float32}[precision]


def use_transformer_engine() -> bool:
    if not torch.cuda.is_available():
        return False
    try:
        import transformer_engine  # noqa: F401
    except Exception:  # noqa: BLE001 - the bare meta package raises RuntimeError
        return False
    return True


def not_built(spec: RunSpec) -> str | None:
    """Why the measured backend cannot build ``spec``'s layers (None: it can).
    megatron-core's local spec, the only one on a CPU, has no sliding window
    (``DotProductAttention`` asserts ``window_size is None``)."""
    if spec.model.window_size is not None:
        return ("model.window_size: sliding-window attention is not built by the "
                "measured backend in this version")
    return None


def transformer_config(spec: RunSpec):
    """megatron-core TransformerConfig for a run: the memory probe's config (Megatron-LM's
    fusion flags, MLA, MTP; ``model.transformer_config``, shared with the memory probe so that measured
    activations are the ones the memory model is checked against) with the training
    settings a real run needs on top."""
    from primus_ext.frameworks.megatron.model import transformer_config as probe_config

    m, p, t = spec.model, spec.parallel, spec.train
    why = not_built(spec)
    if why:
        raise ValueError(why + " (use backend=simulate)")
    if p.pipeline_layout is not None:
        raise ValueError("parallel.pipeline_layout: explicit layouts are not built by the "
                         "measured backend in this version")
    dtype = _dtype(t.precision)
    kw = dict(params_dtype=dtype, pipeline_dtype=dtype, bf16=dtype == torch.bfloat16,
              fp16=dtype == torch.float16,
              use_cpu_initialization=not torch.cuda.is_available(),
              deallocate_pipeline_outputs=True, cross_entropy_loss_fusion=False,
              init_method_std=0.02, apply_query_key_layer_scaling=False)
    if p.pp > 1 and p.decoder_first_pipeline_num_layers is not None:
        kw["num_layers_in_first_pipeline_stage"] = p.decoder_first_pipeline_num_layers
    if p.pp > 1 and p.decoder_last_pipeline_num_layers is not None:
        kw["num_layers_in_last_pipeline_stage"] = p.decoder_last_pipeline_num_layers
    if torch.cuda.is_available():
        # On a GPU the fused kernels exist: Megatron-LM's defaults.
        kw.update(masked_softmax_fusion=True, gradient_accumulation_fusion=False)
    return probe_config(spec, **kw)


@dataclass
class Built:
    """What a measured or trained run needs after building."""
    spec: RunSpec
    config: object  # TransformerConfig
    model: list  # DDP-wrapped chunks
    optimizer: object
    padded_vocab_size: int
    use_te: bool
    groups: dict[str, object] = field(default_factory=dict)

    def bare(self, chunk: int = 0):
        from primus_ext.measure.saved_tensors import unwrap
        return unwrap(self.model[chunk])


def _groups() -> dict[str, object]:
    from megatron.core import parallel_state as ps
    out = {}
    for axis, fn in (("tp", ps.get_tensor_model_parallel_group),
                     ("cp", ps.get_context_parallel_group),
                     ("ep", ps.get_expert_model_parallel_group),
                     ("etp", ps.get_expert_tensor_parallel_group),
                     ("tp_ep", ps.get_expert_tensor_and_model_parallel_group),
                     ("dp", lambda: ps.get_data_parallel_group(with_context_parallel=False)),
                     ("dp_cp", lambda: ps.get_data_parallel_group(with_context_parallel=True)),
                     ("edp", ps.get_expert_data_parallel_group),
                     ("pp", ps.get_pipeline_model_parallel_group),
                     ("embd", ps.get_embedding_group)):
        try:
            out[axis] = fn()
        except (AssertionError, RuntimeError, AttributeError, TypeError):
            pass
    return out


def init_model_parallel(spec: RunSpec, seed: int = 1234) -> dict[str, object]:
    # The same group setup the memory probes use (one place for initialize_model_parallel).
    from primus_ext.frameworks.megatron.model import setup_parallel

    world = dist.get_world_size()
    if world != spec.world_size:
        raise ValueError(f"the run spec has world size {spec.world_size} but "
                         f"{world} processes were launched")
    setup_parallel(spec, seed)
    groups = _groups()
    from primus_ext.measure.tracer import get_tracer
    tracer = get_tracer()
    if tracer is not None:
        tracer.register_axes(groups)
    return groups


def build(spec: RunSpec, with_optimizer: bool = True, seed: int = 1234) -> Built:
    """Model chunks (DDP-wrapped) and optimizer for ``spec`` on the launched processes."""
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallel as DDP
    from megatron.core.distributed import DistributedDataParallelConfig, finalize_model_grads
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
    from megatron.core.transformer.module import Float16Module

    if spec.model.mtp_num_layers:
        raise ValueError("model.mtp_num_layers > 0: the measured backend builds no MTP "
                         "block in this version (measurements price MTP from the layers)")
    groups = init_model_parallel(spec, seed)
    cfg = transformer_config(spec)
    te = use_transformer_engine()
    m, p, t = spec.model, spec.parallel, spec.train
    vocab = padded_vocab(m.vocab_size, m.make_vocab_size_divisible_by, p.tp)
    pp_rank = ps.get_pipeline_model_parallel_rank()
    chunks = []
    for vp in range(p.vpp):
        vp_stage = vp if p.vpp > 1 else None
        kw = dict(vp_stage=vp_stage, pp_rank=pp_rank)
        block = get_gpt_decoder_block_spec(cfg, use_transformer_engine=te,
                                           normalization=m.normalization, **kw)
        pre = ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage)
        post = ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage)
        model = GPTModel(
            config=cfg, transformer_layer_spec=block, vocab_size=vocab,
            max_sequence_length=max(m.max_position_embeddings, t.seq_length),
            pre_process=pre, post_process=post,
            share_embeddings_and_output_weights=not m.untie_embeddings_and_output_weights,
            position_embedding_type=("none" if m.position_embedding_type == "alibi"
                                     else m.position_embedding_type),
            vp_stage=vp_stage)
        if torch.cuda.is_available():
            model.cuda(torch.cuda.current_device())
        if cfg.fp16 or cfg.bf16:
            model = Float16Module(cfg, model)
        chunks.append(model)
    ddp_cfg = DistributedDataParallelConfig(
        grad_reduce_in_fp32=t.precision != "fp32",  # Megatron-LM does this for bf16
        overlap_grad_reduce=p.overlap_grad_reduce,
        overlap_param_gather=p.overlap_param_gather and p.use_distributed_optimizer,
        use_distributed_optimizer=p.use_distributed_optimizer,
        check_for_nan_in_grad=False,
        bucket_size=(p.ddp_bucket_params or max(40_000_000, 1_000_000 * spec.dp))
        if p.overlap_grad_reduce else None)
    model = [DDP(cfg, ddp_cfg, c, disable_bucketing=(i > 0)) for i, c in enumerate(chunks)]
    for c in model:
        c.broadcast_params()
    optimizer = None
    if with_optimizer:
        optimizer = _optimizer(spec, model)
    _wire(cfg, model, p.overlap_grad_reduce, finalize_model_grads)
    return Built(spec=spec, config=cfg, model=model, optimizer=optimizer,
                 padded_vocab_size=vocab, use_te=te, groups=groups)


def _optimizer(spec: RunSpec, model: list):
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    t, p = spec.train, spec.parallel
    dtype = _dtype(t.precision)
    ocfg = OptimizerConfig(
        optimizer=t.optimizer, lr=1e-4, weight_decay=0.01, clip_grad=1.0,
        bf16=dtype == torch.bfloat16, fp16=dtype == torch.float16, params_dtype=dtype,
        use_distributed_optimizer=p.use_distributed_optimizer,
        overlap_param_gather=p.overlap_param_gather and p.use_distributed_optimizer)
    return get_megatron_optimizer(ocfg, model)


def _wire(cfg, model: list, overlap_grad_reduce: bool, finalize) -> None:
    """Megatron-LM training.py's hookup of DDP into the schedules."""
    one = len(model) == 1
    if overlap_grad_reduce:
        no_sync = [c.no_sync for c in model]
        cfg.no_sync_func = no_sync[0] if one else no_sync
        grad_sync = [c.start_grad_sync for c in model]
        cfg.grad_sync_func = grad_sync[0] if one else grad_sync
    cfg.finalize_model_grads_func = _timed(finalize)


# Seconds of the last finalize_model_grads call (the data-parallel gradient sync that
# megatron-core's schedules run at the end of forward_backward_func); step.py reports it
# so that the measured per-microbatch time outside the layers leaves it out.
FINALIZE_S = [0.0]


def _timed(finalize):
    def run(*args, **kwargs):
        import time
        t0 = time.perf_counter()
        try:
            return finalize(*args, **kwargs)
        finally:
            FINALIZE_S[0] = time.perf_counter() - t0
    return run


def teardown() -> None:
    """Destroy model-parallel groups (keeps the default group for another build)."""
    from megatron.core import parallel_state as ps
    if ps.model_parallel_is_initialized():
        ps.destroy_model_parallel()
