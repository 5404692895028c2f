"""Fine-grained activation offloading (megatron-core ``--fine-grained-activation-offloading
--offload-modules``; transformer_config.py ``TransformerConfig.offload_modules``;
pipeline_parallel/fine_grained_activation_offload.py): each listed module's forward runs
inside an offload group (``FineGrainedActivationOffloadingInterface``), a
``saved_tensors_hooks`` context that records every tensor autograd saves in it; at the
group's commit (``bulk_offload_group``) every recorded tensor that is a CUDA
non-parameter of at least ``min_offloaded_tensor_size`` elements (1024 * 1024, its
default) is copied to the host and its device memory released; the backward reloads
it. So a module moves everything it saves, not only its input:

- ``attn_norm`` / ``mlp_norm``: the norm's saved input and statistics; only where the
  norm is its own module (``TransformerLayer._set_offload_modules``: not when it is an
  ``IdentityOp`` because TE fuses it into the next linear, i.e. the attention norm of
  non-MLA layers and the MLP norm of dense layers on the TE stack, whose bytes belong
  to ``qkv_linear`` / the MLP then);
- ``qkv_linear``: what ``get_query_key_value_tensors`` saves (the QKV GEMM input; for
  MLA the down projections, q/kv norms and up projections; the q/k norms);
- ``core_attn``: q, k, v (and the QKV storage they keep alive), the s x s tensors of an
  unfused attention, the fused attention's output and softmax statistics, unless core
  attention is recomputed (``checkpoint_core_attention`` takes the other branch);
- ``attn_proj``: the projection's saved input (megatron-core requires ``core_attn`` with
  it: the same tensor is core attention's output);
- ``expert_fc1`` / ``moe_act`` / ``fused_group_mlp``: the experts' fc1 input, what the
  activation saves (fc1 output, and for the unfused GeLU the activation output the
  probs multiply keeps), or every saved tensor of the grouped MLP.

At the peak (the end of a microbatch's forward, the start of its backward) the GPU
still holds the offloaded bytes of about two layers: the last layer's copy still in
flight and the next layer's reload prefetched for backward (``should_bulk_offload``
keeps the last group of the chunk about to run its backward); every other layer's, and
every other in-flight microbatch's, are on the host.

Whole-layer CPU offloading (megatron-core ``TransformerConfig.cpu_offloading`` with
``cpu_offloading_num_layers`` N, ``cpu_offloading_weights=False``; Megatron-LM
``--cpu-offloading --cpu-offloading-num-layers N``) runs every decoder layer under
Transformer Engine's ``get_cpu_offload_context`` (``TransformerBlock.__init__``;
TE ``cpu_offload_v1.py`` ``AsyncDoubleBufferGroupOffloadHandler``): one offload group per
layer, and the tensors TE's modules mark for activation offloading in the first N groups
(``current_group < num_offload_group``) are copied to pinned host memory on a side
stream, each group's copy finished within its ``layer_window_map`` window of later
layers. The remaining layers keep their activations on the GPU; at the peak (the end
of the forward, the start of the backward) the GPU also holds about one offloaded
layer's tensors (the last copy out, or the first reload prefetched). megatron-core
allows it only with PP 1 and without recompute (``spec/run.py``).
"""
from __future__ import annotations

from primus_ext.memory.act_layer import GLU_EXTRAS

MIN_OFFLOADED_ELEMENTS = 1024 * 1024  # init_model_chunk_offload_handler default

_CORE_ATTN = ("q", "k", "v", "q.rotated", "k.rotated", "v.contiguous", "qkv.output",
              "q.saved", "k.saved", "k.repeated", "v.repeated", "softmax_lse",
              "softmax.output", "softmax.cast", "attn_dropout.mask", "attn_dropout.output",
              "causal_mask", "core_attn.out")
_QKV_LINEAR = ("qkv.input", "down_proj.input", "q_norm.input", "q_norm.stats",
               "q_up.input", "kv_norm.input", "kv_norm.stats", "kv_up.input",
               "q_layernorm.stats", "k_layernorm.stats")
_EXPERT_ACT = ("experts.fc1_output", "experts.silu_output", "experts.linear_half",
               "experts.probs", *(f"experts.{k}" for k in GLU_EXTRAS))
OFFLOAD_ITEMS: dict[str, tuple[str, ...]] = {
    "attn_norm": ("input_norm.input", "input_norm.stats"),
    "qkv_linear": _QKV_LINEAR,
    "core_attn": _CORE_ATTN,
    "attn_proj": ("proj.input",),
    "mlp_norm": ("mlp_norm.input", "mlp_norm.stats"),
    "expert_fc1": ("experts.input",),
    "moe_act": _EXPERT_ACT,
    "fused_group_mlp": ("experts.input", "experts.act_output", "experts.scaled_output")
    + _EXPERT_ACT,
}


def _element_bytes(name: str, e: int) -> int:
    if name.endswith(("mask", "routing_map_t")):
        return 1
    if name.endswith(("stats", "lse", "indices", "topk_softmax")):
        return 4 if not name.endswith("indices") else 8
    return e


def offloaded_names(items: tuple[tuple[str, int], ...], modules: tuple[str, ...],
                    te: bool, mla: bool, moe: bool) -> set[str]:
    """The items of one layer that ``modules`` move to host memory (module docstring)."""
    names = {n for m in modules for n in OFFLOAD_ITEMS[m]}
    fused_attn_norm = te and not mla  # TELayerNormColumnParallelLinear holds the norm
    fused_mlp_norm = te and not moe  # TELayerNormMLP / LayerNormLinear fc1 holds it
    if fused_attn_norm and "qkv_linear" in modules:
        names |= set(OFFLOAD_ITEMS["attn_norm"])
    elif fused_attn_norm:
        names -= set(OFFLOAD_ITEMS["attn_norm"])
    if fused_mlp_norm:
        names -= set(OFFLOAD_ITEMS["mlp_norm"])
    if "moe_act" in modules:
        names |= {"experts.act_output"} if any(k == "experts.scaled_output"
                                               for k, _ in items) else set()
    return names


def offloaded_bytes(items: tuple[tuple[str, int], ...], modules: tuple[str, ...],
                    e: int = 2, te: bool = True, mla: bool = False,
                    moe: bool = False) -> int:
    """Bytes of a layer's saved ``items`` that ``modules`` move to host memory: those
    recorded in an offloaded group and of at least ``MIN_OFFLOADED_ELEMENTS``."""
    names = offloaded_names(items, modules, te, mla, moe)
    return sum(v for k, v in items if k in names
               and v // _element_bytes(k, e) >= MIN_OFFLOADED_ELEMENTS)


def layer_offload_split(per_layer: list[int], num_offloaded: int) -> tuple[int, int]:
    """(bytes resident, transient bytes) of a chunk's layers when the first
    ``num_offloaded`` layers' activations go to the host (module docstring): resident
    are the other layers' bytes, transient one offloaded layer in flight."""
    k = min(num_offloaded, len(per_layer))
    return sum(per_layer[k:]), max(per_layer[:k], default=0)
