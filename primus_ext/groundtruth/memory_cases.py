"""The configurations the memory model is checked on against real megatron-core.

Tiny models (2-4 layers, hidden 128) on 2 CPU processes with gloo: every case runs in
the same pair of processes (``memory_runner.run_cases``). Used by
``tests/slow/test_memory_vs_megatron.py`` and ``scripts/memory_table.py``.
"""
from __future__ import annotations

from dataclasses import replace

from primus_ext.groundtruth.memory_runner import Case
from primus_ext.spec import ClusterSpec, HardwareSpec, ModelSpec, ParallelSpec, RunSpec, \
    TrainSpec

# A 2-"GPU" node; only the world size matters to these checks.
_HW = HardwareSpec(name="cpu2", bf16_tflops=0.1, hbm_bytes=24 * 2 ** 30, hbm_gbps=10,
                   gpus_per_node=2, scale_up_domain_gpus=2, scale_up_gbps=2,
                   scale_out_gbps=1)

GPT = ModelSpec(name="tiny_gpt", num_layers=2, hidden_size=128, num_attention_heads=4,
                ffn_hidden_size=512, vocab_size=1000, normalization="LayerNorm",
                activation="gelu", add_bias_linear=True,
                position_embedding_type="learned_absolute", max_position_embeddings=128,
                untie_embeddings_and_output_weights=False, hidden_dropout=0.1,
                attention_dropout=0.1)
LLAMA = ModelSpec(name="tiny_llama", num_layers=2, hidden_size=128, num_attention_heads=8,
                  num_query_groups=2, ffn_hidden_size=320, vocab_size=1000,
                  normalization="RMSNorm", activation="swiglu",
                  position_embedding_type="rope")
MOE = replace(LLAMA, name="tiny_moe", num_query_groups=4, num_moe_experts=4,
              moe_router_topk=2, moe_ffn_hidden_size=192, hidden_dropout=0.1)
QUICK_MOE = replace(MOE, name="tiny_quick_moe", activation="quick_geglu",
                    activation_func_clamp_value=7.0)
MOE_SHARED = replace(MOE, name="tiny_moe_shared", num_layers=3, moe_first_k_dense=1,
                     moe_shared_expert_intermediate_size=160)
MLA = replace(LLAMA, name="tiny_mla", num_query_groups=None, multi_latent_attention=True,
              q_lora_rank=96, kv_lora_rank=64, qk_head_dim=32, qk_pos_emb_head_dim=16,
              v_head_dim=24)


def spec(model: ModelSpec, seq: int = 64, mbs: int = 2, gbs: int | None = None,
         **kw) -> RunSpec:
    train_keys = {"recompute_granularity", "recompute_method", "recompute_num_layers",
                  "recompute_modules", "attention_softmax_in_fp32", "precision",
                  "moe_router_dtype", "moe_router_force_load_balancing"}
    train_kw = {k: kw.pop(k) for k in list(kw) if k in train_keys}
    train_kw.setdefault("attention_softmax_in_fp32", False)
    par = ParallelSpec(**kw)
    dp = 2 // (par.tp * par.pp * par.cp)
    train = TrainSpec(seq_length=seq, micro_batch_size=mbs,
                      global_batch_size=gbs or mbs * dp, attention_backend="unfused",
                      **train_kw)
    return RunSpec(model=model, parallel=par, train=train,
                   cluster=ClusterSpec(hardware=_HW, num_nodes=1))


PA = ("params", "activations")
CASES: list[Case] = [
    # dense, TP 1 x DP 2: parameters, DDP buffers + distributed optimizer, activations
    Case("gpt dp2 distopt", spec(GPT), PA + ("buffers",)),
    Case("gpt dp2 softmax-fp32", spec(GPT, attention_softmax_in_fp32=True), ("activations",)),
    Case("gpt dp2 selective", spec(GPT, recompute_granularity="selective"), ("activations",)),
    Case("gpt dp2 full uniform 1", spec(GPT, recompute_granularity="full",
                                        recompute_method="uniform", recompute_num_layers=1),
         ("activations",)),
    Case("llama dp2 no-distopt", spec(LLAMA, use_distributed_optimizer=False),
         PA + ("buffers",)),
    Case("llama dp2 distopt buckets", spec(replace(LLAMA, num_layers=3)),
         ("params", "buffers"), {"bucket_size": 30000, "grad_reduce_in_fp32": False}),
    Case("llama dp2 unfused swiglu", spec(LLAMA), ("activations",),
         {"bias_activation_fusion": False}),
    Case("llama dp2 full block 1", spec(replace(LLAMA, num_layers=3),
                                        recompute_granularity="full",
                                        recompute_method="block", recompute_num_layers=1),
         ("activations",)),
    Case("llama dp2 full uniform 2", spec(replace(LLAMA, num_layers=4),
                                          recompute_granularity="full",
                                          recompute_method="uniform",
                                          recompute_num_layers=2), ("activations",)),
    Case("llama dp2 selective", spec(LLAMA, recompute_granularity="selective"),
         ("activations",)),
    Case("llama mha dp2", spec(replace(LLAMA, num_query_groups=None)), ("activations",)),
    Case("llama mha dp2 qk-norm", spec(replace(LLAMA, num_query_groups=None,
                                               qk_layernorm=True)), ("activations",)),
    # tensor and sequence parallelism
    Case("llama tp2", spec(LLAMA, tp=2), PA),
    Case("llama tp2 sp", spec(LLAMA, tp=2, sequence_parallel=True), PA),
    Case("gpt tp2 sp selective", spec(GPT, tp=2, sequence_parallel=True,
                                      recompute_granularity="selective"), PA),
    # pipeline parallelism: placement, tied embedding copy, in-flight microbatches
    Case("llama pp2", spec(replace(LLAMA, num_layers=4), pp=2, gbs=8),
         ("params", "inflight"), {"num_microbatches": 4}),
    Case("gpt pp2 tied", spec(replace(GPT, num_layers=4), pp=2, gbs=8),
         ("params", "buffers", "inflight"), {"num_microbatches": 4}),
    Case("llama pp2 vpp2", spec(replace(LLAMA, num_layers=4), pp=2, vpp=2, gbs=8),
         ("params", "inflight"), {"num_microbatches": 4}),
    # MoE: EP, expert-TP, shared experts, expert DDP buffers
    Case("moe ep2", spec(MOE, ep=2), PA + ("buffers",)),
    Case("moe tp2 sp", spec(MOE, tp=2, sequence_parallel=True), PA),
    Case("moe tp2 sp ep2 etp1", spec(MOE, tp=2, sequence_parallel=True, ep=2, etp=1), PA),
    Case("moe+shared dp2", spec(MOE_SHARED), PA),
    Case("moe dp2 selective moe", spec(MOE, recompute_granularity="selective",
                                       recompute_modules=("core_attn", "moe")),
         ("activations",)),
    # Qwen3-MoE's settings: q/k norms, fp32 routing, forced balance, layernorm recompute
    Case("moe ep2 qk-norm fp32-router", spec(replace(MOE, qk_layernorm=True), ep=2,
                                             moe_router_dtype="fp32",
                                             moe_router_force_load_balancing=True,
                                             recompute_granularity="selective",
                                             recompute_modules=("layernorm",)),
         ("activations",)),
    # ModelZoo's Qwen3-235B lines: the MoE checkpoint's input is the discarded norm output
    Case("moe ep2 qk-norm selective layernorm+moe", spec(
        replace(MOE, qk_layernorm=True), ep=2, recompute_granularity="selective",
        recompute_modules=("layernorm", "moe")), ("activations",)),
    # GPT-OSS's gated unit: megatron-core's quick-GeGLU clamped at 7.0, fused with the
    # routing weights in the experts (weighted_bias_quick_geglu_impl), unfused in a dense
    # MLP
    Case("moe ep2 quick-geglu clamp", spec(QUICK_MOE, ep=2), ("activations",)),
    Case("moe ep2 quick-geglu clamp unfused", spec(QUICK_MOE, ep=2), ("activations",),
         {"bias_activation_fusion": False}),
    Case("llama dp2 quick-geglu clamp", spec(replace(
        LLAMA, activation="quick_geglu", activation_func_clamp_value=7.0)), ("activations",)),
    Case("llama dp2 selective layernorm+mlp", spec(LLAMA, recompute_granularity="selective",
                                                   recompute_modules=("layernorm", "mlp")),
         ("activations",)),
    # multi-token prediction (on the last stage, with its own embedding when pp > 1)
    Case("llama+mtp dp2", spec(replace(LLAMA, mtp_num_layers=1)), PA),
    Case("llama+mtp pp2", spec(replace(LLAMA, num_layers=4, mtp_num_layers=1), pp=2, gbs=4),
         ("params", "buffers")),
    # fp32 training: fp32 grads and optimizer without master copies, 4-byte activations
    Case("gpt dp2 fp32", spec(GPT, precision="fp32"), PA + ("buffers",)),
    # multi-latent attention (local spec: column-parallel down projections)
    Case("mla tp2", spec(MLA, tp=2), PA),
    Case("mla tp2 sp", spec(MLA, tp=2, sequence_parallel=True), PA),
]
