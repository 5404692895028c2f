"""torchtitan's own config registry, read: a config function's model and defaults as
the project's ModelSpec fields and ``Registry`` values (imports torchtitan).

``registry.py`` keeps these values as data so the projection runs without torchtitan;
this module reads them from torchtitan 0.3.0 itself (``torchtitan/models/<module>/
config_registry.py`` -> ``Trainer.Config``; the model dataclasses of
``torchtitan/models/<module>/__init__.py``), for the tests that hold the two equal and
for ``scripts/titan_registry.py``, which prints them.
"""
from __future__ import annotations

import importlib


def trainer_config(module: str, config: str):
    """The ``Trainer.Config`` that ``--module module --config config`` starts from
    (``ConfigManager._load_config``: the config_registry function, called)."""
    mod = importlib.import_module(f"torchtitan.models.{module}.config_registry")
    return getattr(mod, config)()


def _attention_fields(att) -> dict:
    if hasattr(att, "kv_lora_rank"):  # deepseek_v3 model.py Attention (MLA)
        return dict(num_attention_heads=att.n_heads, multi_latent_attention=True,
                    q_lora_rank=att.q_lora_rank or None, kv_lora_rank=att.kv_lora_rank,
                    qk_head_dim=att.qk_nope_head_dim,
                    qk_pos_emb_head_dim=att.qk_rope_head_dim, v_head_dim=att.v_head_dim,
                    add_qkv_bias=False)
    qkv = att.qkv_linear  # common/attention.py GQAttention (FusedQKVLinear)
    out_bias = bool(att.wo.bias)
    return dict(num_attention_heads=att.n_heads,
                num_query_groups=att.n_kv_heads or att.n_heads,
                head_dim=qkv.head_dim, multi_latent_attention=False,
                qk_layernorm=getattr(att, "qk_norm", None) is not None,
                add_bias_linear=out_bias,
                add_qkv_bias=bool(qkv.wqkv.bias) and not out_bias)


def _window_fields(layers) -> dict:
    """gpt_oss: sliding windows on some layers (``Attention.sliding_window_size``),
    full attention on every k-th."""
    sizes = [getattr(L.attention, "sliding_window_size", None) for L in layers]
    if not any(sizes):
        return {}
    full = [i for i, w in enumerate(sizes) if not w]
    every = full[0] + 1 if full else 1
    if full != list(range(every - 1, len(sizes), every)):
        raise ValueError(f"sliding windows on layers {sizes}: not one full layer every k")
    return dict(window_size=next(w for w in sizes if w), window_full_attention_every=every)


def model_fields(model) -> dict:
    """ModelSpec fields of a torchtitan decoder ``Model.Config`` (llama3, qwen3,
    deepseek_v3, gpt_oss): the shape the projection and the memory model read."""
    layers = list(model.layers)
    first = layers[0]
    out = dict(num_layers=len(layers), hidden_size=model.dim, vocab_size=model.vocab_size,
               untie_embeddings_and_output_weights=not getattr(
                   model, "enable_weight_tying", False),
               mtp_num_layers=len(getattr(model, "mtp_layers", None) or ()))
    out.update(_attention_fields(first.attention))
    out.update(_window_fields(layers))
    dense = [L for L in layers if getattr(L, "moe", None) is None]
    moe = [L for L in layers if getattr(L, "moe", None) is not None]
    if dense:
        ff = dense[0].feed_forward
        out["ffn_hidden_size"] = ff.w1.out_features
    out["moe_first_k_dense"] = next((i for i, L in enumerate(layers)
                                     if getattr(L, "moe", None) is not None), 0)
    if moe:
        m = moe[0].moe
        r = m.router
        out.update(num_moe_experts=m.num_experts, moe_router_topk=r.top_k,
                   moe_ffn_hidden_size=m.routed_experts.inner_experts.hidden_dim,
                   moe_router_num_groups=r.num_expert_groups,
                   moe_router_group_topk=r.num_limited_groups)
        shared = getattr(m, "shared_experts", None)
        out["moe_shared_expert_intermediate_size"] = (shared.w1.out_features
                                                      if shared is not None else None)
        out["moe_token_dispatcher"] = type(
            m.routed_experts.token_dispatcher).__qualname__.split(".")[0]
    return out


def registry_values(module: str, config: str) -> dict:
    """A config function's defaults as ``Registry`` fields."""
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC
    cfg = trainer_config(module, config)
    p, t, c = cfg.parallelism, cfg.training, cfg.compile
    ac = cfg.activation_checkpoint
    ac_name = ("full" if isinstance(ac, FullAC.Config) else
               "selective" if isinstance(ac, SelectiveAC.Config) else "none")
    return dict(local_batch_size=t.local_batch_size, seq_len=t.seq_len,
                activation_checkpoint=ac_name, tp=p.tensor_parallel_degree,
                pp=p.pipeline_parallel_degree, ep=p.expert_parallel_degree,
                schedule=p.pipeline_parallel_schedule,
                compile=bool(c.enable and "model" in c.components),
                async_tp=bool(c.enable_async_tensor_parallel),
                cuda_graphs=not t.disable_cuda_graphs)
