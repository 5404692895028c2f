"""Keys of a Hugging Face ``config.json`` that the projection reads but does not model.

Each is named with the reason it changes neither time nor memory in the projection (or
changes them below what the projection resolves). ``hf_config.py`` lists every key of a
file that is in neither its readers nor these tables as "not read", so a key new to this
project is said, never dropped.
"""
from __future__ import annotations

# Bookkeeping: token ids, library versions, class names, dtype of the stored checkpoint.
METADATA = frozenset({
    "_name_or_path", "architectures", "auto_map", "bos_token_id", "eos_token_id",
    "pad_token_id", "torch_dtype", "dtype", "transformers_version", "use_cache",
    "initializer_range", "output_router_logits", "pretraining_tp", "cache_implementation",
    "tokenizer_class", "model_type", "use_mrope", "image_token_index", "boi_token_index",
    "eoi_token_index", "mm_tokens_per_image", "initializer_factor", "ep_size",
    "use_bidirectional_attention",
})

NOT_MODELLED = {
    "rms_norm_eps": "norm epsilon, numerics only",
    "rope_theta": "RoPE base, numerics only",
    "rope_scaling": "RoPE frequency scaling, numerics only",
    "rope_local_base_freq": "RoPE base of the local layers, numerics only",
    "rope_parameters": "RoPE settings, numerics only",
    "initial_context_length": "the context the RoPE scaling starts from, numerics only",
    "router_aux_loss_coef": "a loss weight",
    "aux_loss_alpha": "a loss weight",
    "seq_aux": "sequence-level balance loss, a loss term",
    "norm_topk_prob": "renormalising the top-k weights, elementwise",
    "scoring_func": "router scoring (softmax or sigmoid), elementwise",
    "topk_method": "router selection method; group-limited routing is read from n_group",
    "routed_scaling_factor": "a scale on the routed output, elementwise",
    "attn_logit_softcapping": "attention soft-capping, elementwise",
    "final_logit_softcapping": "logit soft-capping, elementwise",
    "query_pre_attn_scalar": "attention scale, numerics only",
    "swiglu_limit": "clamped SwiGLU, elementwise",
    "quantization_config": "the stored checkpoint's format; the training precision is "
                           "train.precision",
    "hidden_dropout": "dropout is off in the projected runs unless model.hidden_dropout "
                      "is set",
    "max_window_layers": "read with use_sliding_window",
    "sliding_window_pattern": "read with sliding_window",
    "attention_chunk_size": "chunked attention",
}
