"""Activation bytes per microbatch of one model chunk: layers (with recompute), the
embedding, the output layer with the loss, and MTP blocks.

Recompute follows megatron-core's TransformerConfig:

- ``selective`` drops what each module in ``recompute_modules`` would save and keeps the
  inputs its checkpoint saves instead (``core_attn``: Q, K, V and a 4-byte int32
  ``attn_mask_type`` tensor; ``mlp``/``moe``/``shared_experts``: the block input;
  ``moe_act``: the expert fc1 output; ``layernorm``: the norm input, the output being
  discarded and rebuilt; ``mla_up_proj``: the up-projection inputs);
- ``full`` with ``uniform`` checkpoints groups of ``recompute_num_layers`` layers, each
  saving only its input hidden state; ``block`` checkpoints the first
  ``recompute_num_layers`` layers of every chunk one by one and keeps the rest whole.
  With RoPE the rotary table (fp32) is a checkpoint argument too, saved once.

``working_bytes`` is what exists only transiently, the larger of two moments: the end
of a microbatch's forward (on the last stage the loss's transient, ``head.py``; offloaded
tensors in flight) and a layer's backward (one recompute unit's full activations,
rebuilt before its backward; context-parallel KV buffers).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from primus_ext.memory.act_layer import (GLU_EXTRAS, Dims, Items, attention_items,
                                         mlp_items, moe_items, norm_items)
from primus_ext.memory.attn_unfused import unfused_scores_bytes
from primus_ext.memory.head import head_items, loss_transient_bytes, te_cross_entropy  # noqa: F401
from primus_ext.memory.options import MemoryOptions
from primus_ext.memory.offload import layer_offload_split, offloaded_bytes
from primus_ext.memory.sac_op import OP_SAC, op_sac_items
from primus_ext.memory.te_layer import te_cp_working_bytes, te_layer_items
from primus_ext.spec.layout import pipeline_layout
from primus_ext.spec.model import ModelSpec
from primus_ext.spec.parallel import ParallelSpec
from primus_ext.spec.train import TrainSpec

CORE_ATTN_DROP = ("softmax.", "attn_dropout.", "causal_mask", "k.repeated", "v.repeated",
                  "q.saved", "k.saved", "softmax_lse", "v.contiguous", "core_attn.out")


def _drop(items: Items, prefixes: tuple[str, ...]) -> Items:
    return {k: v for k, v in items.items() if not k.startswith(prefixes)}


def _selective(items: Items, model: ModelSpec, d: Dims, modules: tuple[str, ...],
               moe: bool) -> Items:
    if OP_SAC in modules:  # torchtitan's op-level SAC (sac_op.py)
        op = op_sac_items(model, d, moe)
        if op is not None:
            return op
    h, e = model.hidden_size, d.e
    if "core_attn" in modules:
        items = _drop(items, CORE_ATTN_DROP)
        if not model.multi_latent_attention:
            hd, a, g = model.head_dim, model.num_attention_heads // d.tp, \
                model.num_groups // d.tp
            # The checkpoint saves q, k, v before GQA expansion: V is a view of the QKV
            # output (kept whole), Q/K are fresh only after RoPE or q/k norms.
            items["qkv.output"] = d.n * (a + 2 * g) * hd * e
            if model.position_embedding_type == "rope" or model.qk_layernorm:
                items["q.rotated"] = d.n * a * hd * e
                items["k.rotated"] = d.n * g * hd * e
        items["core_attn.mask_type"] = 4
    if "mla_up_proj" in modules and model.multi_latent_attention:
        items = {k: v for k, v in items.items() if k not in ("q", "k", "v")}
    if "layernorm" in modules:
        items = _drop(items, ("input_norm.stats", "mlp_norm.stats", "qkv.input",
                              "down_proj.input", "fc1.input", "router.input"))
    if moe and "moe" in modules:
        keep = ("mlp_norm.", "mlp.dropout_mask")
        items = {k: v for k, v in items.items()
                 if k.startswith(keep) or not k.startswith(("router.", "permute.",
                                                           "experts.", "shared."))}
        if "layernorm" not in modules:
            # The checkpoint's input is the pre-MLP norm's output; under layernorm
            # recompute that norm discards it (``discard_output_and_register_recompute``
            # resizes its storage to 0, megatron-core transformer_layer.py) and rebuilds
            # it before the MoE recompute.
            items["moe.checkpoint_input"] = d.n_sp * h * e
    if moe and "moe_act" in modules:
        items = _drop(items, ("experts.act_output", "experts.silu_output",
                              "experts.linear_half", "experts.scaled_output",
                              *(f"experts.{k}" for k in GLU_EXTRAS)))
    if moe and "shared_experts" in modules:
        items = _drop(items, ("shared.",))
    if not moe and "mlp" in modules:
        items = _drop(items, ("mlp.fc1_output", "mlp.act_output", "mlp.silu_output",
                              "mlp.linear_half", *(f"mlp.{k}" for k in GLU_EXTRAS)))
    return items


@lru_cache(maxsize=4096)
def layer_items(model: ModelSpec, par: ParallelSpec, train: TrainSpec, moe: bool,
                options: MemoryOptions, full: bool = True) -> tuple[tuple[str, int], ...]:
    """Itemised saved bytes of one decoder layer, one microbatch (no full recompute).
    ``full=False`` ignores selective recompute (what a recompute unit rebuilds).
    ``train.te`` True: the Transformer Engine stack (``te_layer.py``); None or False:
    megatron-core's local spec (``memory_report`` resolves None with ``uses_te``)."""
    d = Dims.of(par, train)
    items = attention_items(model, train, d)
    items |= moe_items(model, par, d, options) if moe else mlp_items(model, d, options)
    if train.te:
        items = te_layer_items(model, train, d, items)
    if full and train.recompute_granularity == "selective":
        items = _selective(items, model, d, train.recompute_modules, moe)
    return tuple((k, v) for k, v in items.items() if v)


def layer_bytes(model: ModelSpec, par: ParallelSpec, train: TrainSpec, moe: bool,
                options: MemoryOptions, full: bool = True) -> int:
    return sum(v for _, v in layer_items(model, par, train, moe, options, full))


def layer_offloaded_bytes(model: ModelSpec, par: ParallelSpec, train: TrainSpec,
                          moe: bool, options: MemoryOptions) -> int:
    """Saved bytes of one decoder layer that fine-grained offloading moves to the host."""
    if not train.offload_modules:
        return 0
    return offloaded_bytes(layer_items(model, par, train, moe, options),
                           train.offload_modules, Dims.of(par, train).e, bool(train.te),
                           model.multi_latent_attention, moe)


def embedding_items(model: ModelSpec, par: ParallelSpec, train: TrainSpec) -> Items:
    d = Dims.of(par, train)
    # VocabParallelEmbedding: with TP it saves the shifted (masked) ids and the
    # out-of-range mask; without, the ids themselves.
    it = {"embedding.token_ids": d.n * 8}
    if par.tp > 1:
        it["embedding.vocab_mask"] = d.n
    if model.position_embedding_type == "learned_absolute":
        it["embedding.position_ids"] = d.n * 8
    if model.hidden_dropout > 0:
        it["embedding.dropout_mask"] = d.n_sp * model.hidden_size
    return it


def mtp_items(model: ModelSpec, par: ParallelSpec, train: TrainSpec,
              options: MemoryOptions) -> Items:
    """One MTP block (DeepSeek-V3 Sec. 2.2): embedding of the shifted tokens, enorm and
    hnorm, eh_proj on their concatenation, a decoder layer, its norm, the shared output
    layer and loss."""
    d = Dims.of(par, train)
    h = model.hidden_size
    it = {f"mtp.{k}": v for k, v in embedding_items(model, par, train).items()}
    it |= norm_items(model, d, "mtp.enorm", d.n_sp, h)
    it |= norm_items(model, d, "mtp.hnorm", d.n_sp, h)
    it["mtp.eh_proj.input"] = d.n_sp * 2 * h * d.e
    moe = model.is_moe_layer(model.num_layers - 1)
    # The MTP block's decoder layer is a TransformerLayer of the same config: it
    # offloads what the decoder layers offload (offload.py).
    it["mtp.layer"] = layer_bytes(model, par, train, moe, options) \
        - layer_offloaded_bytes(model, par, train, moe, options)
    it |= {f"mtp.{k}": v for k, v in head_items(model, par, train,
                                                     options=options).items()}
    # GPTModel's MTP loss: loss_mask * loss keeps the (rolled, fp32) loss mask; the
    # MTPLossAutoScaler keeps the scaled per-token loss and the token count.
    it["mtp.loss.loss_mask"] = d.n * 4
    it["mtp.loss.scaled"] = d.n * 4
    it["mtp.loss.num_tokens"] = 4
    return it


@dataclass(frozen=True, kw_only=True, slots=True)
class ChunkActivations:
    bytes_per_microbatch: int  # saved for backward after the chunk's forward
    working_bytes: int  # transient extra during one microbatch's backward
    items: tuple[tuple[str, int], ...]  # per_microbatch broken down


def _full_recompute(model: ModelSpec, par: ParallelSpec, train: TrainSpec,
                    layers: list[int], options: MemoryOptions) -> tuple[Items, int]:
    d = Dims.of(par, train)
    per_layer = [layer_bytes(model, par, train, model.is_moe_layer(i), options)
                 for i in layers]
    hidden = d.n_sp * model.hidden_size * d.e
    k = train.recompute_num_layers or 1
    it: Items = {}
    working = 0
    if train.recompute_method == "block":
        r = min(k, len(layers))
        it["recompute.inputs"] = r * hidden
        it["layers"] = sum(per_layer[r:])
        working = max(per_layer[:r], default=0)
    else:
        groups = [per_layer[i:i + k] for i in range(0, len(layers), k)]
        it["recompute.inputs"] = len(groups) * hidden
        working = max((sum(g) for g in groups), default=0)
    if model.position_embedding_type == "rope" and not model.multi_latent_attention \
            and it["recompute.inputs"]:
        it["recompute.rope_freqs"] = d.s * model.head_dim * 4
    return it, working


@lru_cache(maxsize=4096)
def chunk_activations(model: ModelSpec, par: ParallelSpec, train: TrainSpec, stage: int,
                      chunk: int, options: MemoryOptions) -> ChunkActivations:
    """Activations of one microbatch in model chunk ``chunk`` of pipeline stage ``stage``."""
    layout = pipeline_layout(model.num_layers, par)
    start = layout.first_layer(stage, chunk)
    layers = list(range(start, start + layout.num_layers(stage, chunk)))
    first = stage == 0 and chunk == 0
    last = stage == par.pp - 1 and chunk == par.vpp - 1
    it: Items = {}
    # Transient bytes on top of the saved ones, at the two moments a chunk can peak: the
    # end of its forward (the loss of the last chunk, offloaded tensors in flight) and a
    # layer's backward (a recompute unit rebuilt, context-parallel KV buffers).
    fwd_end = bwd = inflight = 0
    if first:
        it |= embedding_items(model, par, train)
    if train.recompute_granularity == "full":
        full, bwd = _full_recompute(model, par, train, layers, options)
        it |= full
    elif train.cpu_offloading_num_layers and layers:
        # offload.py: the first N layers' activations on the host (PP 1: this chunk holds
        # every layer), about one of them in flight.
        per_layer = [layer_bytes(model, par, train, model.is_moe_layer(i), options)
                     for i in layers]
        it["layers"], fwd_end = layer_offload_split(per_layer,
                                                    train.cpu_offloading_num_layers)
        bwd = fwd_end
    else:
        it["layers"] = sum(layer_bytes(model, par, train, model.is_moe_layer(i), options)
                           for i in layers)
        if train.offload_modules and layers:
            # offload.py: on the host but for about two layers' (in flight, prefetched).
            moved = [layer_offloaded_bytes(model, par, train, model.is_moe_layer(i),
                                           options) for i in layers]
            it["layers"] -= sum(moved)
            inflight = 2 * max(moved)
            fwd_end = bwd = inflight
    if train.recompute_granularity == "selective" and OP_SAC in train.recompute_modules:
        # Op-level SAC recomputes one block at a time in the backward.
        bwd = max((layer_bytes(model, par, train, model.is_moe_layer(i), options,
                               full=False) for i in layers), default=0)
    if train.te and layers:
        # Context parallelism's ring / gather buffers of one layer's attention backward.
        bwd += te_cp_working_bytes(model, par.cp, par.cp_comm_type, Dims.of(par, train))
    if last:
        it |= head_items(model, par, train, options=options)
        for k in range(model.mtp_num_layers):
            it |= {f"{name}[{k}]": v
                   for name, v in mtp_items(model, par, train, options).items()}
        fwd_end += loss_transient_bytes(model, par, train, options)  # head.py
    # Inside a layer's unfused attention forward the raw scores are alive beside the
    # probabilities the layer saves (attn_unfused.py: baddbmm's output is the softmax's
    # input, a local of the attention's forward until it returns).
    attn = inflight + unfused_scores_bytes(model, par, train) if layers else 0
    working = max(fwd_end, bwd, attn)
    items = tuple((k, v) for k, v in it.items() if v)
    return ChunkActivations(bytes_per_microbatch=sum(v for _, v in items),
                            working_bytes=working, items=items)
