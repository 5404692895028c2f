"""Parameter tensors one rank holds, per pipeline stage and virtual chunk.

Built from the groups of ``params.py`` and their sharding rules, as megatron-core places
and shards them (GPTModel with the local or TE spec):

- decoder layers from ``spec.layout`` (virtual stage ``chunk * pp + stage``);
- the embedding on the first virtual stage; the final norm, MTP blocks and the output
  layer on the last;
- tied embeddings with pp > 1: the last stage holds its own copy of the word embedding
  as ``output_layer.weight`` (``shared_embedding``, kept in sync by an all-reduce over
  the embedding group); with MTP and pp > 1 the last stage also builds an embedding;
- vocab padded as Megatron pads it (``padded_vocab(vocab, divisible_by, tp)``), then
  split over TP; routed experts split over EP (whole experts) and expert-TP, one tensor
  per local expert (SequentialMLP and TE's GroupedLinear both keep per-expert weights);
- MLA down projections: replicated over TP with the TE spec (``TELinear``
  ``parallel_mode="duplicated"``, what ``params.py`` records), column-parallel (split over
  TP) with the local spec (``local_spec=True``: attention_backend=unfused).

The order is megatron-core's registration order (``named_parameters``), which the DDP
buffer layout (bucket boundaries, alignment padding) depends on.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from primus_ext.memory.params import (ParamGroup, embedding_groups, layer_groups,
                                      mtp_groups, output_groups)
from primus_ext.spec.layout import PipelineLayout, pipeline_layout
from primus_ext.spec.model import ModelSpec
from primus_ext.spec.parallel import ParallelSpec


@dataclass(frozen=True, slots=True)
class ParamTensor:
    name: str
    numel: int  # elements on this rank
    expert: bool = False  # reduced over expert-data-parallel (mcore: allreduce=False)
    shared_embedding: bool = False  # own DDP bucket under the distributed optimizer


# Registration order inside a decoder layer (megatron-core 0.14-0.19): Attention builds
# core_attention and linear_proj before SelfAttention adds linear_qkv and the q/k norms.
_LAYER_ORDER = (
    ("input_layernorm", 0), ("self_attention.linear_proj", 1),
    ("self_attention.linear_qkv", 2), ("self_attention.linear_q_proj", 2),
    ("self_attention.linear_q_down_proj", 2), ("self_attention.linear_q_up_proj", 3),
    ("self_attention.linear_kv_down_proj", 4), ("self_attention.linear_kv_up_proj", 5),
    ("self_attention.q_layernorm", 6), ("self_attention.k_layernorm", 7),
    ("self_attention.kv_layernorm", 7), ("pre_mlp_layernorm", 8), ("mlp.linear_fc1", 9),
    ("mlp.linear_fc2", 10), ("mlp.router", 9), ("mlp.experts", 10),
    ("mlp.shared_experts.linear_fc1", 11), ("mlp.shared_experts.linear_fc2", 12),
)


def _order_key(name: str) -> int:
    for prefix, key in _LAYER_ORDER:
        if name.startswith(prefix):
            return key
    return 99


def _per_rank(g: ParamGroup, par: ParallelSpec, local_spec: bool = False) -> int:
    if g.shard in ("tp", "vocab") or (local_spec and "down_proj" in g.name):
        return g.num_params // par.tp
    return g.num_params


def _layer_tensors(model: ModelSpec, par: ParallelSpec, groups: list[ParamGroup],
                   prefix: str, local_spec: bool = False) -> list[ParamTensor]:
    out: list[ParamTensor] = []
    expert_groups = [g for g in groups if g.shard.startswith("expert")]
    for g in sorted(groups, key=lambda g: _order_key(g.name)):
        if g.shard.startswith("expert"):
            if g is expert_groups[0]:
                out.extend(_expert_tensors(model, par, expert_groups, prefix))
            continue
        out.append(ParamTensor(prefix + g.name, _per_rank(g, par, local_spec)))
    return out


def _expert_tensors(model: ModelSpec, par: ParallelSpec, groups: list[ParamGroup],
                    prefix: str) -> list[ParamTensor]:
    """Routed experts: num_experts / ep local experts, each with its own tensors."""
    e = model.num_moe_experts
    local = e // par.ep
    out = []
    for i in range(local):
        for g in groups:
            per_expert = g.num_params // e
            n = per_expert // par.expert_tp if g.shard == "expert" else per_expert
            name = g.name.replace("mlp.experts.", f"mlp.experts.local_experts.{i}.")
            out.append(ParamTensor(prefix + name, n, expert=par.ep > 1))
    return out


@lru_cache(maxsize=1024)
def _layer_template(model: ModelSpec, par: ParallelSpec, moe_layer: int,
                    local_spec: bool) -> tuple[ParamTensor, ...]:
    """Tensors of one decoder layer (names without the layer prefix); layers of one kind
    (dense or MoE) are identical, so this is computed once per kind."""
    return tuple(_layer_tensors(model, par, layer_groups(model, moe_layer), "", local_spec))


def _decoder_layer(model: ModelSpec, par: ParallelSpec, layer: int,
                   local_spec: bool) -> list[ParamTensor]:
    moe = model.is_moe_layer(layer)
    kind = next(i for i in range(model.num_layers) if model.is_moe_layer(i) == moe)
    prefix = f"decoder.layers.{layer}."
    return [ParamTensor(prefix + t.name, t.numel, t.expert, t.shared_embedding)
            for t in _layer_template(model, par, kind, local_spec)]


def _mtp_tensors(model: ModelSpec, par: ParallelSpec, local_spec: bool) -> list[ParamTensor]:
    groups = mtp_groups(model)
    head = [g for g in groups if g.name.startswith("mtp.") and "final_layernorm" not in g.name]
    tail = [g for g in groups if g.name.startswith("mtp.final_layernorm")]
    layer = [g for g in groups if not g.name.startswith("mtp.")]
    out = []
    for k in range(model.mtp_num_layers):
        p = f"mtp.layers.{k}."
        out += [ParamTensor(p + g.name[4:], _per_rank(g, par)) for g in head]
        out += _layer_tensors(model, par, layer, p + "transformer_layer.", local_spec)
        out += [ParamTensor(p + g.name[4:], _per_rank(g, par)) for g in tail]
    return out


@lru_cache(maxsize=1024)
def chunk_param_tensors(model: ModelSpec, par: ParallelSpec, stage: int, chunk: int,
                        local_spec: bool = False) -> tuple[ParamTensor, ...]:
    """Parameter tensors of one rank's model chunk, in registration order."""
    layout: PipelineLayout = pipeline_layout(model.num_layers, par)
    first = stage == 0 and chunk == 0
    last = stage == par.pp - 1 and chunk == par.vpp - 1
    tied = not model.untie_embeddings_and_output_weights
    mtp_here = last and model.mtp_num_layers > 0
    out: list[ParamTensor] = []
    if first or mtp_here:
        for g in embedding_groups(model, par.tp):
            shared = g.name.endswith("word_embeddings.weight") and par.pp > 1 and (
                tied or model.mtp_num_layers > 0)
            out.append(ParamTensor(g.name, _per_rank(g, par), shared_embedding=shared))
    start = layout.first_layer(stage, chunk)
    for layer in range(start, start + layout.num_layers(stage, chunk)):
        out += _decoder_layer(model, par, layer, local_spec)
    if last:
        groups = output_groups(model, par.tp)
        norms = [g for g in groups if g.shard == "replicated"]
        out += [ParamTensor(g.name, g.num_params) for g in norms]
        if mtp_here:
            out += _mtp_tensors(model, par, local_spec)
        heads = [g for g in groups if g.shard == "vocab"]
        out += [ParamTensor(g.name, _per_rank(g, par)) for g in heads]
        if tied and par.pp > 1 and not first:
            # mcore allocates the output weight on the last stage and keeps it equal to
            # the first stage's word embedding (all-reduce of their grads).
            emb = embedding_groups(model, par.tp)[0]
            out.append(ParamTensor("output_layer.weight", _per_rank(emb, par),
                                   shared_embedding=True))
    return tuple(out)


@dataclass(frozen=True, kw_only=True, slots=True)
class StageParams:
    num_params: int
    num_expert_params: int

    @property
    def num_dense_params(self) -> int:
        return self.num_params - self.num_expert_params


@lru_cache(maxsize=1024)
def stage_params(model: ModelSpec, par: ParallelSpec, stage: int,
                 local_spec: bool = False) -> StageParams:
    """Parameter elements one rank of pipeline stage ``stage`` holds (all its chunks)."""
    total = expert = 0
    for chunk in range(par.vpp):
        for t in chunk_param_tensors(model, par, stage, chunk, local_spec):
            total += t.numel
            if t.expert:
                expert += t.numel
    return StageParams(num_params=total, num_expert_params=expert)
