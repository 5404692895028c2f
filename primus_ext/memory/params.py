"""Parameter tensors of a megatron-core GPT model, as groups with their sharding rule.

Each group is one kind of tensor (a weight or a bias) of one module, with the number of
elements in the full (unsharded) model and how megatron-core shards it:

- ``replicated``: every TP rank holds it whole (norms, router, row-parallel biases);
- ``tp``: split over tensor-parallel ranks (column-parallel weights and biases,
  row-parallel weights);
- ``vocab``: split over TP ranks along the padded vocabulary (embedding, output layer);
- ``expert``: routed-expert tensors split over EP (whole experts) and expert-TP;
- ``expert_replicated``: routed-expert row-parallel biases, split over EP only.

Per-rank counts (memory model) and totals (``describe``) both derive from these groups.
"""
from __future__ import annotations

from dataclasses import dataclass

from primus_ext.spec.model import ModelSpec, padded_vocab


@dataclass(frozen=True, slots=True)
class ParamGroup:
    name: str
    num_params: int
    shard: str  # replicated | tp | vocab | expert | expert_replicated


@dataclass(frozen=True, kw_only=True, slots=True)
class ParamCounts:
    num_params: int  # total, without MTP layers (as models are published)
    num_active_params: int  # per token: non-expert params plus top-k of the routed experts
    num_embedding_params: int
    num_mtp_params: int


def _norm(model: ModelSpec, name: str, width: int) -> list[ParamGroup]:
    groups = [ParamGroup(f"{name}.weight", width, "replicated")]
    if model.normalization == "LayerNorm":
        groups.append(ParamGroup(f"{name}.bias", width, "replicated"))
    return groups


def _linear(name: str, n_in: int, n_out: int, bias: bool, kind: str) -> list[ParamGroup]:
    """A column- (``col``) or row-parallel (``row``) linear layer of megatron-core."""
    groups = [ParamGroup(f"{name}.weight", n_in * n_out, "tp")]
    if bias:
        # Column-parallel biases are split with the output; row-parallel ones are whole.
        groups.append(ParamGroup(f"{name}.bias", n_out, "tp" if kind == "col" else "replicated"))
    return groups


def attention_groups(model: ModelSpec) -> list[ParamGroup]:
    h = model.hidden_size
    bias = model.add_bias_linear
    if model.multi_latent_attention:
        return _mla_groups(model)
    q = model.num_attention_heads * model.head_dim
    kv = model.num_groups * model.head_dim
    g = _norm(model, "input_layernorm", h)
    g += _linear("self_attention.linear_qkv", h, q + 2 * kv, bias or model.add_qkv_bias, "col")
    if model.qk_layernorm:
        g += _norm(model, "self_attention.q_layernorm", model.head_dim)
        g += _norm(model, "self_attention.k_layernorm", model.head_dim)
    g += _linear("self_attention.linear_proj", q, h, bias, "row")
    return g


def _mla_groups(model: ModelSpec) -> list[ParamGroup]:
    """Multi-latent attention (DeepSeek-V2 Sec. 2.1; megatron-core MLASelfAttention)."""
    h, heads = model.hidden_size, model.num_attention_heads
    qk = model.qk_head_dim + model.qk_pos_emb_head_dim
    g = _norm(model, "input_layernorm", h)
    if model.q_lora_rank is None:
        g += _linear("self_attention.linear_q_proj", h, heads * qk, False, "col")
    else:
        # Down projections are replicated across TP in megatron-core (not split).
        g.append(ParamGroup("self_attention.linear_q_down_proj.weight",
                            h * model.q_lora_rank, "replicated"))
        g += _norm(model, "self_attention.q_layernorm", model.q_lora_rank)
        g += _linear("self_attention.linear_q_up_proj", model.q_lora_rank, heads * qk,
                     False, "col")
    g.append(ParamGroup("self_attention.linear_kv_down_proj.weight",
                        h * (model.kv_lora_rank + model.qk_pos_emb_head_dim), "replicated"))
    g += _norm(model, "self_attention.kv_layernorm", model.kv_lora_rank)
    g += _linear("self_attention.linear_kv_up_proj", model.kv_lora_rank,
                 heads * (model.qk_head_dim + model.v_head_dim), False, "col")
    g += _linear("self_attention.linear_proj", heads * model.v_head_dim, h,
                 model.add_bias_linear, "row")
    return g


def _mlp(model: ModelSpec, name: str, ffn: int) -> list[ParamGroup]:
    h = model.hidden_size
    fc1_out = 2 * ffn if model.gated else ffn
    g = _linear(f"{name}.linear_fc1", h, fc1_out, model.add_bias_linear, "col")
    g += _linear(f"{name}.linear_fc2", ffn, h, model.add_bias_linear, "row")
    return g


def mlp_groups(model: ModelSpec, layer: int) -> list[ParamGroup]:
    h = model.hidden_size
    g = _norm(model, "pre_mlp_layernorm", h)
    if not model.is_moe_layer(layer):
        return g + _mlp(model, "mlp", model.dense_ffn_size)
    e, f = model.num_moe_experts, model.expert_ffn_size
    g.append(ParamGroup("mlp.router.weight", e * h, "replicated"))
    fc1_out = 2 * f if model.gated else f
    g.append(ParamGroup("mlp.experts.linear_fc1.weight", e * h * fc1_out, "expert"))
    g.append(ParamGroup("mlp.experts.linear_fc2.weight", e * f * h, "expert"))
    if model.add_bias_linear:
        g.append(ParamGroup("mlp.experts.linear_fc1.bias", e * fc1_out, "expert"))
        g.append(ParamGroup("mlp.experts.linear_fc2.bias", e * h, "expert_replicated"))
    if model.moe_shared_expert_intermediate_size:
        g += _mlp(model, "mlp.shared_experts", model.moe_shared_expert_intermediate_size)
    return g


def layer_groups(model: ModelSpec, layer: int) -> list[ParamGroup]:
    """All parameter groups of decoder layer ``layer`` (0-based)."""
    return attention_groups(model) + mlp_groups(model, layer)


def embedding_groups(model: ModelSpec, tp: int = 1) -> list[ParamGroup]:
    """Word (and learned position) embeddings, held by the first pipeline stage."""
    v = padded_vocab(model.vocab_size, model.make_vocab_size_divisible_by, tp)
    g = [ParamGroup("embedding.word_embeddings.weight", v * model.hidden_size, "vocab")]
    if model.position_embedding_type == "learned_absolute":
        g.append(ParamGroup("embedding.position_embeddings.weight",
                            model.max_position_embeddings * model.hidden_size, "replicated"))
    return g


def output_groups(model: ModelSpec, tp: int = 1) -> list[ParamGroup]:
    """Final norm and (untied) output layer, held by the last pipeline stage."""
    g = _norm(model, "decoder.final_layernorm", model.hidden_size)
    if model.untie_embeddings_and_output_weights:
        v = padded_vocab(model.vocab_size, model.make_vocab_size_divisible_by, tp)
        g.append(ParamGroup("output_layer.weight", v * model.hidden_size, "vocab"))
    return g


def mtp_groups(model: ModelSpec) -> list[ParamGroup]:
    """One multi-token-prediction block (DeepSeek-V3 Sec. 2.2): enorm, hnorm, eh_proj,
    a transformer layer of the last layer's kind and a final norm; embedding and output
    head are shared with the main model."""
    h = model.hidden_size
    g = _norm(model, "mtp.enorm", h) + _norm(model, "mtp.hnorm", h)
    g.append(ParamGroup("mtp.eh_proj.weight", 2 * h * h, "tp"))
    g += layer_groups(model, model.num_layers - 1)
    g += _norm(model, "mtp.final_layernorm", h)
    return g


def _active(model: ModelSpec, groups: list[ParamGroup]) -> int:
    share = model.moe_router_topk / model.num_moe_experts if model.is_moe else 1.0
    return round(sum(g.num_params * (share if g.shard.startswith("expert") else 1)
                     for g in groups))


def count_params(model: ModelSpec) -> ParamCounts:
    """Total and active parameters of the whole model (vocab padded as with tp=1)."""
    emb = embedding_groups(model) + output_groups(model)
    total = sum(g.num_params for g in emb)
    active = total
    for layer in range(model.num_layers):
        groups = layer_groups(model, layer)
        total += sum(g.num_params for g in groups)
        active += _active(model, groups)
    mtp = model.mtp_num_layers * sum(g.num_params for g in mtp_groups(model))
    return ParamCounts(num_params=total, num_active_params=active,
                       num_embedding_params=sum(g.num_params for g in emb),
                       num_mtp_params=mtp)
