"""Specs shared by the memory tests."""
from __future__ import annotations

from dataclasses import replace

from primus_ext.presets import hardware_preset, model_preset
from primus_ext.spec import ClusterSpec, ModelSpec, ParallelSpec, RunSpec, TrainSpec

H100 = hardware_preset("h100")

# Korthikanti et al.'s setting: LayerNorm, GeLU 4h FFN, biases, dropout, MHA.
GPT = ModelSpec(name="gpt", num_layers=8, hidden_size=1024, num_attention_heads=16,
                vocab_size=50257, normalization="LayerNorm", activation="gelu",
                add_bias_linear=True, position_embedding_type="learned_absolute",
                hidden_dropout=0.1, attention_dropout=0.1)
LLAMA = ModelSpec(name="llama", num_layers=8, hidden_size=1024, num_attention_heads=16,
                  num_query_groups=4, ffn_hidden_size=2816, vocab_size=32000)
MOE = replace(LLAMA, name="moe", num_moe_experts=8, moe_router_topk=2,
              moe_ffn_hidden_size=512, moe_shared_expert_intermediate_size=512,
              moe_first_k_dense=1)


def run(model: ModelSpec, *, nodes: int = 1, gpus: int = 8, seq: int = 2048, mbs: int = 1,
        gbs: int = 64, backend: str = "unfused", **kw) -> RunSpec:
    train_keys = {"recompute_granularity", "recompute_method", "recompute_num_layers",
                  "recompute_modules", "attention_softmax_in_fp32", "precision",
                  "optimizer"}
    train_kw = {k: kw.pop(k) for k in list(kw) if k in train_keys}
    return RunSpec(model=model, parallel=ParallelSpec(**kw),
                   train=TrainSpec(seq_length=seq, micro_batch_size=mbs,
                                   global_batch_size=gbs, attention_backend=backend,
                                   **train_kw),
                   cluster=ClusterSpec(hardware=H100, num_nodes=nodes, gpus_per_node=gpus))


def preset(name: str) -> ModelSpec:
    return ModelSpec(**model_preset(name))
