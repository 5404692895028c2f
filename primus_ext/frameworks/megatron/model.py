"""A megatron-core GPTModel from a RunSpec: process groups, ``TransformerConfig`` and the
model of this rank's pipeline stage or chunk.

Shared by the measurement (``build.py``) and the memory model's ground truth
(``groundtruth/memory_probe.py``), so that the activations a measurement captures are
the ones the memory model is checked against. The config is the local (non-TE) spec with
Megatron-LM's fusion flags, run eagerly (``patches/eager_fusions.py``).
``masked_softmax_fusion`` and ``apply_rope_fusion`` are off: their kernels are CUDA/TE
only, and without them mcore takes the torch path it would take on a GPU too.

megatron.core is imported inside the functions: the caller applies the CPU patches (and
installs the collective tracer) before anything imports it.
"""
from __future__ import annotations

import torch

from primus_ext.spec import RunSpec, padded_vocab


def setup_parallel(spec: RunSpec, seed: int = 1234) -> None:
    """(Re)create megatron-core's process groups for the spec's layout."""
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel
    p = spec.parallel
    if ps.model_parallel_is_initialized():
        ps.destroy_model_parallel()
    ps.initialize_model_parallel(
        tensor_model_parallel_size=p.tp, pipeline_model_parallel_size=p.pp,
        virtual_pipeline_model_parallel_size=p.vpp if p.vpp > 1 else None,
        context_parallel_size=p.cp, expert_model_parallel_size=p.ep,
        expert_tensor_parallel_size=p.etp, order=p.order)
    tensor_parallel.model_parallel_cuda_manual_seed(seed)


_ACTIVATIONS = {"swiglu": torch.nn.functional.silu, "gelu": torch.nn.functional.gelu,
                "relu": torch.nn.functional.relu,
                "squared_relu": lambda x: torch.pow(torch.nn.functional.relu(x), 2)}


def _activation(name: str):
    """The activation function; quick_geglu (GPT-OSS, gated) is megatron-core's own
    quick_gelu, whose identity its fused path checks (mlp.py, moe/experts.py)."""
    if name == "quick_geglu":
        from megatron.core.fusions.fused_bias_geglu import quick_gelu
        return quick_gelu
    return _ACTIVATIONS[name]


def _fusable(m, fusion: bool) -> bool:
    """megatron-core fuses SwiGLU, GeLU with a bias, and quick-GeGLU only with the routing
    weights (weighted_bias_quick_geglu_impl: experts; a dense quick-GeGLU MLP with the
    fusion on raises 'Only support fusion of gelu and swiglu')."""
    if m.activation == "quick_geglu":
        dense = any(not m.is_moe_layer(i) for i in range(m.num_layers)) \
            or bool(m.moe_shared_expert_intermediate_size)
        return fusion and not dense
    return fusion and (m.activation == "swiglu"
                       or (m.activation == "gelu" and m.add_bias_linear))


def transformer_config(spec: RunSpec, bias_activation_fusion: bool = True, **overrides):
    """megatron-core TransformerConfig (MLATransformerConfig for MLA) of a spec.

    ``bias_activation_fusion`` follows Megatron-LM's flags: on for SwiGLU
    (``--bias-swiglu-fusion``), for GeLU with biases (``--bias-gelu-fusion``) and for
    quick-GeGLU experts, off otherwise (``_fusable``)."""
    from megatron.core.transformer.transformer_config import (MLATransformerConfig,
                                                              TransformerConfig)
    m, p, t = spec.model, spec.parallel, spec.train
    dtype = torch.float32 if t.precision == "fp32" else torch.bfloat16
    kw = dict(
        num_layers=m.num_layers, hidden_size=m.hidden_size,
        num_attention_heads=m.num_attention_heads, ffn_hidden_size=m.dense_ffn_size,
        num_query_groups=m.num_groups, kv_channels=m.head_dim,
        normalization=m.normalization, gated_linear_unit=m.gated,
        activation_func=_activation(m.activation), add_bias_linear=m.add_bias_linear,
        activation_func_clamp_value=m.activation_func_clamp_value,
        # MLA always has its q/kv latent norms (DeepSeek-V2/V3; params.py counts them);
        # mcore builds them only with qk_layernorm=True.
        add_qkv_bias=m.add_qkv_bias, qk_layernorm=m.qk_layernorm or m.multi_latent_attention,
        hidden_dropout=m.hidden_dropout, attention_dropout=m.attention_dropout,
        tensor_model_parallel_size=p.tp, pipeline_model_parallel_size=p.pp,
        virtual_pipeline_model_parallel_size=p.vpp if p.vpp > 1 else None,
        context_parallel_size=p.cp, expert_model_parallel_size=p.ep,
        expert_tensor_parallel_size=p.expert_tp, sequence_parallel=p.sequence_parallel,
        bf16=dtype == torch.bfloat16, params_dtype=dtype, pipeline_dtype=dtype,
        use_cpu_initialization=True, perform_initialization=True,
        recompute_granularity=t.recompute_granularity, recompute_method=t.recompute_method,
        recompute_num_layers=t.recompute_num_layers,
        attention_softmax_in_fp32=t.attention_softmax_in_fp32,
        masked_softmax_fusion=False,
        bias_activation_fusion=_fusable(m, bias_activation_fusion),
        bias_dropout_fusion=True, apply_rope_fusion=False,
        gradient_accumulation_fusion=False, persist_layer_norm=False,
        moe_token_dispatcher_type=measured_dispatcher(p.moe_token_dispatcher_type),
    )
    if t.recompute_granularity == "selective":
        kw["recompute_modules"] = list(t.recompute_modules)
    if m.is_moe:
        pattern = [1 if m.is_moe_layer(i) else 0 for i in range(m.num_layers)]
        kw.update(num_moe_experts=m.num_moe_experts, moe_router_topk=m.moe_router_topk,
                  moe_ffn_hidden_size=m.expert_ffn_size, moe_layer_freq=pattern,
                  moe_shared_expert_intermediate_size=m.moe_shared_expert_intermediate_size,
                  moe_grouped_gemm=False, moe_aux_loss_coeff=0.0,
                  moe_router_dtype=t.moe_router_dtype,
                  moe_router_force_load_balancing=t.moe_router_force_load_balancing)
    if m.mtp_num_layers:
        kw["mtp_num_layers"] = m.mtp_num_layers
    if m.multi_latent_attention:
        kw.update(q_lora_rank=m.q_lora_rank, kv_lora_rank=m.kv_lora_rank,
                  qk_head_dim=m.qk_head_dim, qk_pos_emb_head_dim=m.qk_pos_emb_head_dim,
                  v_head_dim=m.v_head_dim, rope_type="rope")
        kw.pop("kv_channels")
        kw.update(overrides)
        return MLATransformerConfig(**kw)
    kw.update(overrides)
    return TransformerConfig(**kw)


def measured_dispatcher(dispatcher: str) -> str:
    """The MoE token dispatcher the megatron-core model is built with: the spec's, except
    ``flex`` (DeepEP / HybridEP kernels, GPU only), which is measured with ``alltoall``."""
    return "alltoall" if dispatcher == "flex" else dispatcher


def build_model(spec: RunSpec, config, vp_stage: int | None = None):
    """GPTModel (Float16Module-wrapped for bf16) for this rank's pipeline stage/chunk."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import (get_gpt_decoder_block_spec,
                                                          get_gpt_layer_local_spec,
                                                          get_gpt_mtp_block_spec)
    from megatron.core import parallel_state as ps
    from megatron.core.transformer.module import Float16Module
    m = spec.model
    if m.is_moe:
        layer_spec = get_gpt_decoder_block_spec(config, use_transformer_engine=False,
                                                vp_stage=vp_stage)
    else:
        layer_spec = get_gpt_layer_local_spec(qk_layernorm=config.qk_layernorm,
                                              multi_latent_attention=m.multi_latent_attention)
    mtp_spec = None
    if m.mtp_num_layers:
        last = layer_spec.layer_specs[-1] if hasattr(layer_spec, "layer_specs") else layer_spec
        mtp_spec = get_gpt_mtp_block_spec(config, last, use_transformer_engine=False,
                                          vp_stage=vp_stage)
    pre = ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage)
    post = ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage)
    model = GPTModel(
        config=config, transformer_layer_spec=layer_spec,
        vocab_size=padded_vocab(m.vocab_size, m.make_vocab_size_divisible_by,
                                spec.parallel.tp),
        max_sequence_length=max(m.max_position_embeddings, spec.train.seq_length),
        pre_process=pre, post_process=post,
        share_embeddings_and_output_weights=not m.untie_embeddings_and_output_weights,
        position_embedding_type=m.position_embedding_type, mtp_block_spec=mtp_spec,
        vp_stage=vp_stage)
    if config.bf16:
        model = Float16Module(config, model)
    return model
