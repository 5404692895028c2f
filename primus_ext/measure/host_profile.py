"""megatron-core's host issue time on this CPU: the reference host profile's measurement.

A real megatron-core GPTModel (local spec, bf16, one process, gloo) with tiny tensors
(hidden 32, sequence 8) does almost no arithmetic on a CPU: what its step takes is the
host's share of a GPU step -- Python, the module hooks and wrappers, the PyTorch
dispatcher and autograd -- without the CUDA launch (``launch_s`` on the target adds it).
For each variant (a Megatron-LM launch line: GPT-3 style, Llama style, MoE with 4 and 8
experts, MLA) the script runs the Megatron-LM step of ``frameworks/megatron/step.py``
at two depths (2 and 6 layers) without hooks, so a layer's cost is the difference per
layer, and once with the per-layer hooks of ``measure/hooks.py`` to split it into the
attention and MLP blocks, the embedding and the output layer with the loss. A
``TorchDispatchMode`` pass counts the aten ops each scope dispatches: those that are not
views are the kernels a GPU would launch; ``_local_scalar_dense`` (a scalar read back, a
synchronisation on a GPU) is counted apart. The optimizer step runs as a GPU run
issues it (``gpu_like_optimizer``): multi-tensor kernels, not the per-tensor loops of
megatron-core's CPU fallback.

``scripts/host_profile.py`` runs it and writes ``primus_ext/data/host/reference.json``
(the committed profile the simulate backend's host clock reads, ``compute/host.py``).
The caller has run ``frameworks.megatron.build.prepare_runtime`` and
``init_distributed`` (one process) and ``gpu_like_optimizer``.
"""
from __future__ import annotations

import statistics
from collections import defaultdict

BASE = ["--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "8",
        "--max-position-embeddings", "8", "--micro-batch-size", "1", "--bf16",
        "--vocab-size", "64", "--transformer-impl", "local", "--target-hardware", "cpu",
        "--target-nodes", "1", "--target-gpus-per-node", "1"]
LLAMA = ["--normalization", "RMSNorm", "--swiglu", "--position-embedding-type", "rope",
         "--disable-bias-linear", "--untie-embeddings-and-output-weights",
         "--group-query-attention", "--num-query-groups", "1", "--ffn-hidden-size", "64"]
VARIANTS = {
    # GPT-3 style (Megatron-LM's defaults: LayerNorm, GeLU, biases, learned positions).
    "gpt": [],
    "llama": LLAMA,
    "moe4": LLAMA + ["--num-experts", "4", "--moe-router-topk", "2",
                     "--moe-ffn-hidden-size", "32", "--moe-token-dispatcher-type",
                     "alltoall"],
    "moe8": LLAMA + ["--num-experts", "8", "--moe-router-topk", "2",
                     "--moe-ffn-hidden-size", "32", "--moe-token-dispatcher-type",
                     "alltoall"],
    "mla": [a for a in LLAMA if a not in ("--group-query-attention", "--num-query-groups",
                                           "1")] + ["--multi-latent-attention", "--q-lora-rank", "16", "--kv-lora-rank",
                    "16", "--qk-head-dim", "16", "--qk-pos-emb-head-dim", "8",
                    "--v-head-dim", "16"],
}
DEPTHS = (2, 6)
MICROBATCHES = 4
# aten ops that launch no kernel on a GPU besides views (allocation, metadata).
NO_KERNEL = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
             "detach", "lift_fresh", "alias", "_to_copy_noop", "set_", "resize_",
             "record_stream", "_has_compatible_shallow_copy_type", "is_same_size",
             "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "dim", "size",
             "stride", "numel", "is_contiguous"}
# Scalar reads back to the host (on a GPU, a host-device synchronisation when the tensor
# lives on the device; here every tensor is a CPU tensor, so they are only counted).
SCALAR_READS = {"_local_scalar_dense", "item", "nonzero", "equal", "is_nonzero"}


def gpu_like_optimizer() -> None:
    """The optimizer step as a GPU run issues it: torch's AdamW (megatron-core's
    fallback without TE and Apex) with ``fused=True`` (one multi-tensor kernel, the step
    count kept on the device, as TE / Apex FusedAdam), and megatron-core's multi-tensor
    L2 norm and scale as one ``torch._foreach_*`` call each (as ``amp_C``'s
    ``multi_tensor_l2norm`` / ``multi_tensor_scale`` through ``multi_tensor_applier``)
    instead of its CPU fallback's loop of one op per tensor."""
    import torch
    from megatron.core.optimizer import clip_grads
    from megatron.core.optimizer import optimizer as mcore_optimizer
    for cls in (torch.optim.Adam, torch.optim.AdamW):
        init = cls.__dict__.get("__init__")
        if init is None or getattr(init, "_fused_default", False):
            continue

        def patched(self, params, *args, _init=init, **kwargs):
            kwargs.setdefault("fused", True)
            _init(self, params, *args, **kwargs)
        patched._fused_default = True
        cls.__init__ = patched

    def l2_norm(chunk_size, noop_flag, tensor_lists, per_tensor, *args):
        norms = [n for lst in tensor_lists for n in torch._foreach_norm(lst)] \
            if any(tensor_lists) else [torch.zeros(())]
        return torch.linalg.vector_norm(torch.stack(norms)).reshape(1), None

    def scale(chunk_size, noop_flag, tensor_lists, factor):
        torch._foreach_mul_(tensor_lists[1], 0.0)
        torch._foreach_add_(tensor_lists[1], tensor_lists[0], alpha=factor)

    clip_grads.l2_norm_impl = l2_norm
    clip_grads.multi_tensor_scale_impl = scale
    mcore_optimizer.multi_tensor_scale_impl = scale


def variant_spec(name: str, layers: int):
    from primus_ext.frameworks.megatron.args import parse_launch_args
    argv = BASE + VARIANTS[name] + ["--num-layers", str(layers), "--global-batch-size",
                                    str(MICROBATCHES)]
    return parse_launch_args(argv).spec


def _run(spec, steps: int, hooked: bool) -> dict:
    from primus_ext.frameworks.megatron.build import build, teardown
    from primus_ext.frameworks.megatron.step import data_iterators, train_step
    from primus_ext.measure.hooks import LayerTimer, CpuClock
    built = build(spec)
    iters = data_iterators(built)
    timer = None
    if hooked:
        timer = LayerTimer(built.bare(), CpuClock()).attach(parts=True)
    rows = []
    for i in range(steps):
        if timer is not None:
            timer.enabled = i >= 3
        rows.append(train_step(built, iters, spec.num_microbatches))
        if timer is not None:
            timer.collect()
    steady = rows[3:]
    # The minimum over steps: another process on the machine only ever adds time.
    out = {k: min(r[k] for r in steady)
           for k in ("step_s", "zero_grad_s", "fwd_bwd_s", "optimizer_s")}
    out["num_param_tensors"] = sum(1 for c in built.model for _ in c.parameters())
    if timer is not None:
        out["scopes"] = {f"{s}|{p}": v for (s, p), v in timer.medians().items()}
        timer.detach()
    teardown()
    return out


def count_ops(spec) -> dict:
    """Kernels and syncs each scope dispatches in one microbatch's forward + backward."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from primus_ext.frameworks.megatron.build import build, teardown
    from primus_ext.frameworks.megatron.step import data_iterators, train_step
    from primus_ext.measure.hooks import LayerTimer, CpuClock
    built = build(spec)
    iters = data_iterators(built)
    train_step(built, iters, 1)  # warm: lazily created state
    timer = LayerTimer(built.bare(), CpuClock()).attach(parts=True)
    timer.enabled = True
    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            scope, phase = timer.scope()
            key = f"{_scope_kind(scope)}|{phase}"
            if name in SCALAR_READS:
                counts[key]["scalar_reads"] += 1
            elif not (func.is_view or name in NO_KERNEL):
                counts[key]["kernels"] += 1
            return func(*args, **(kwargs or {}))

    with Count():
        train_step(built, iters, 1)
    timer.collect()
    timer.detach()
    teardown()
    torch.distributed.barrier()
    return {k: dict(v) for k, v in counts.items()}


def _scope_kind(scope: str) -> str:
    """layer.3.attn -> attn; layer.3 -> layer; embedding, output, step as they are."""
    parts = scope.split(".")
    if parts[0] == "layer":
        return parts[2] if len(parts) > 2 else "layer"
    return parts[0]


def _per_layer(shallow: dict, deep: dict, key: str) -> float:
    return (deep[key] - shallow[key]) / (DEPTHS[1] - DEPTHS[0])


def _split(hooked: dict, layers: int) -> dict:
    """Median seconds per scope kind and phase over the layers (hooked run)."""
    acc: dict[str, list[float]] = defaultdict(list)
    for key, v in hooked["scopes"].items():
        scope, phase = key.split("|")
        acc[f"{_scope_kind(scope)}|{phase}"].append(v)
    return {k: statistics.median(v) for k, v in acc.items()}


def measure_variant(name: str, steps: int) -> dict:
    shallow = _run(variant_spec(name, DEPTHS[0]), steps, hooked=False)
    deep = _run(variant_spec(name, DEPTHS[1]), steps, hooked=False)
    hooked = _run(variant_spec(name, DEPTHS[1]), steps, hooked=True)
    m = MICROBATCHES
    layer_s = _per_layer(shallow, deep, "fwd_bwd_s") / m
    parts = _split(hooked, DEPTHS[1])
    # The hooked layer's fwd : bwd and attention : MLP shares, applied to the unhooked
    # per-layer time (hooks cost Python of their own).
    hooked_layer = parts.get("layer|fwd", 0) + parts.get("layer|bwd", 0)
    scale = layer_s / hooked_layer if hooked_layer > 0 else 1.0
    blocks = {k: v * scale for k, v in parts.items()
              if k.split("|")[0] in ("layer", "attn", "mlp", "core_attn")}
    # Outside the layers, per microbatch: embedding, output + loss and the schedule's
    # own work (forward_step, loss function, bookkeeping), from the shallow run.
    outside = shallow["fwd_bwd_s"] / m - DEPTHS[0] * layer_s
    tensors = deep["num_param_tensors"] - shallow["num_param_tensors"]
    return {
        "argv": BASE + VARIANTS[name],
        "layer_s": layer_s,
        "blocks_s": blocks,
        "embedding_s": {k: v for k, v in parts.items() if k.startswith("embedding|")},
        "output_s": {k: v for k, v in parts.items() if k.startswith("output|")},
        "outside_layers_per_microbatch_s": outside,
        "optimizer_per_param_tensor_s": _per_layer(shallow, deep, "optimizer_s")
        * (DEPTHS[1] - DEPTHS[0]) / max(tensors, 1),
        "optimizer_fixed_s": shallow["optimizer_s"] - shallow["num_param_tensors"]
        * _per_layer(shallow, deep, "optimizer_s") * (DEPTHS[1] - DEPTHS[0])
        / max(tensors, 1),
        "zero_grad_s": shallow["zero_grad_s"],
        "param_tensors_per_layer": tensors / (DEPTHS[1] - DEPTHS[0]),
        "ops_per_microbatch": count_ops(variantvariant_spec(name, DEPTHS[0])),
    }
