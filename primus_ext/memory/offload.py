"""Fine-grained activation offloading (megatron-core ``--fine-grained-activation-offloading
--offload-modules``; transformer_config.py ``TransformerConfig.offload_modules``): the
tensors a module saves for backward are copied to host memory after its forward and
brought back before its backward.

Which saved items each module's offload moves (its inputs, as the config documents:
"offload the input of ..."; names of ``act_layer.py`` / ``te_layer.py``):

- ``attn_norm`` / ``mlp_norm``: the norm's input (the residual stream);
- ``qkv_linear``: the QKV GEMM's saved input;
- ``core_attn``: q, k, v (and the QKV storage they keep alive) and, under FP8 delayed
  scaling, the attention output it saves; the softmax statistics stay (below
  ``min_offloaded_tensor_size``, 1M elements, for any real shape);
- ``attn_proj``: the projection's saved input (megatron-core requires ``core_attn`` with
  it: the same tensor is core attention's output);
- ``expert_fc1`` / ``moe_act`` / ``fused_group_mlp``: the experts' fc1 input, the
  activation's input (fc1 output), or every saved tensor of the grouped MLP.

At the peak (the end of a microbatch's forward, the start of its backward) the GPU
still holds the offloaded bytes of about two layers: the last layer's copy still in
flight and the next layer's reload prefetched for backward; every other layer's, and
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

OFFLOAD_ITEMS: dict[str, tuple[str, ...]] = {
    "attn_norm": ("input_norm.input",),
    "qkv_linear": ("qkv.input", "down_proj.input"),
    "core_attn": ("q.rotated", "k.rotated", "v.contiguous", "qkv.output", "q.saved",
                  "k.saved", "k.repeated", "v.repeated", "q", "k", "v", "core_attn.out"),
    "attn_proj": ("proj.input",),
    "mlp_norm": ("mlp_norm.input",),
    "expert_fc1": ("experts.input",),
    "moe_act": ("experts.fc1_output",),
    "fused_group_mlp": ("experts.input", "experts.probs", "experts.fc1_output",
                        "experts.silu_output", "experts.linear_half",
                        "experts.act_output", "experts.scaled_output"),
}


def offloaded_bytes(items: tuple[tuple[str, int], ...], modules: tuple[str, ...]) -> int:
    """Bytes of a layer's saved ``items`` that ``modules`` move to host memory."""
    names = {n for m in modules for n in OFFLOAD_ITEMS[m]}
    return sum(v for k, v in items if k in names)


def layer_offload_split(per_layer: list[int], num_offloaded: int) -> tuple[int, int]:
    """(bytes resident, transient bytes) of a chunk's layers when the first
    ``num_offloaded`` layers' activations go to the host (module docstring): resident
    are the other layers' bytes, transient one offloaded layer in flight."""
    k = min(num_offloaded, len(per_layer))
    return sum(per_layer[k:]), max(per_layer[:k], default=0)
