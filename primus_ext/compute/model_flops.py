"""Model FLOPs per token by Megatron-LM's formula (``num_floating_point_operations`` in
megatron/training/training.py, the figure its training loop logs as TFLOP/s/GPU).

Each GEMM counts 3x (forward, dgrad, wgrad) and 2 FLOPs per multiply-add; core attention
is counted once for a causal mask (``seq_length / 2`` for QK^T and for PV); SwiGLU has three
h x ffn GEMMs. Sliding windows are not discounted, as in Megatron-LM. MTP layers count as
one more transformer layer plus their eh projection and an extra logits GEMM each.
"""
from __future__ import annotations

from functools import lru_cache

from primus_ext.spec.model import ModelSpec

FORMULA_NAME = "megatron-lm num_floating_point_operations (causal attention halved)"
_FB = 3  # forward + backward (dgrad + wgrad)
_FMA = 2


def attention_flops_per_token(model: ModelSpec, seq_length: int,
                              causal_halved: bool = True) -> float:
    """``causal_halved=False``: core attention counted over the whole sequence, as
    Megatron-LM's formula did before it halved it for the causal mask (core_r0.8.0
    megatron/training/training.py: ``seq_length / hidden_size`` in the attention term)."""
    h, heads = model.hidden_size, model.num_attention_heads
    keys = seq_length / 2 if causal_halved else seq_length
    if model.multi_latent_attention:
        qk = model.qk_head_dim + model.qk_pos_emb_head_dim
        if model.q_lora_rank is None:
            q_term = h * heads * qk
        else:
            q_term = model.q_lora_rank * (h + heads * qk + 1)
        terms = (q_term
                 + model.kv_lora_rank * (h + heads * (model.qk_head_dim + model.v_head_dim) + 1)
                 + h * model.qk_pos_emb_head_dim
                 + heads * model.v_head_dim * h
                 + keys * heads * qk
                 + keys * heads * model.v_head_dim)
        return _FB * _FMA * terms
    q = heads * model.head_dim
    kv = model.num_groups * model.head_dim
    return _FB * _FMA * (h * (q + 2 * kv) + 2 * q * keys + q * h)


def mlp_flops_per_token(model: ModelSpec, layer: int) -> float:
    exp = 3 if model.gated else 2
    h = model.hidden_size
    if not model.is_moe_layer(layer):
        width = model.dense_ffn_size
    else:
        width = model.moe_router_topk * model.expert_ffn_size
        width += model.moe_shared_expert_intermediate_size or 0
    return _FB * _FMA * exp * h * width


def logits_flops_per_token(model: ModelSpec) -> float:
    return _FB * _FMA * model.hidden_size * model.padded_vocab_size


def layer_flops_per_token(model: ModelSpec, layer: int, seq_length: int,
                          causal_halved: bool = True) -> float:
    return (attention_flops_per_token(model, seq_length, causal_halved)
            + mlp_flops_per_token(model, layer))


@lru_cache(maxsize=1024)
def model_flops_per_token(model: ModelSpec, seq_length: int,
                          causal_halved: bool = True) -> float:
    """Training FLOPs per token (forward + backward) of the whole model."""
    total = sum(layer_flops_per_token(model, i, seq_length, causal_halved)
                for i in range(model.num_layers))
    total += logits_flops_per_token(model)
    if model.mtp_num_layers:
        last = model.num_layers - 1
        per_mtp = (layer_flops_per_token(model, last, seq_length, causal_halved)
                   + _FB * _FMA * 2 * model.hidden_size * model.hidden_size
                   + logits_flops_per_token(model))
        total += model.mtp_num_layers * per_mtp
    return total
