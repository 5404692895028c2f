"""Spec builders shared by the compute and comm tests (imported by file name)."""
from __future__ import annotations

from primus_ext.presets import hardware_preset
from primus_ext.spec import ClusterSpec, ModelSpec, ParallelSpec, RunSpec, TrainSpec


def llama70b(**kw) -> ModelSpec:
    base = dict(name="llama70b", num_layers=80, hidden_size=8192, num_attention_heads=64,
                num_query_groups=8, ffn_hidden_size=28672, vocab_size=128256)
    base.update(kw)
    return ModelSpec(**base)


def gpt_mha(**kw) -> ModelSpec:
    """GPT-style MHA, GELU MLP of 4h, learned positions (Korthikanti et al. 2022)."""
    base = dict(name="gpt", num_layers=8, hidden_size=2048, num_attention_heads=16,
                ffn_hidden_size=8192, vocab_size=51200, activation="gelu",
                position_embedding_type="learned_absolute")
    base.update(kw)
    return ModelSpec(**base)


def dsv3(**kw) -> ModelSpec:
    base = dict(name="dsv3", num_layers=61, hidden_size=7168, num_attention_heads=128,
                ffn_hidden_size=18432, vocab_size=129280, multi_latent_attention=True,
                q_lora_rank=1536, kv_lora_rank=512, qk_head_dim=128, qk_pos_emb_head_dim=64,
                v_head_dim=128, num_moe_experts=256, moe_router_topk=8,
                moe_ffn_hidden_size=2048, moe_shared_expert_intermediate_size=2048,
                moe_first_k_dense=3, mtp_num_layers=1)
    base.update(kw)
    return ModelSpec(**base)


def mixtral(**kw) -> ModelSpec:
    base = dict(name="mixtral", num_layers=8, hidden_size=4096, num_attention_heads=32,
                num_query_groups=8, ffn_hidden_size=14336, vocab_size=32000,
                num_moe_experts=8, moe_router_topk=2)
    base.update(kw)
    return ModelSpec(**base)


def run(model: ModelSpec, *, hw: str = "h100", nodes: int = 1, gpn: int | None = None,
        hardware=None, train: dict | None = None, **par) -> RunSpec:
    tr = dict(seq_length=4096, micro_batch_size=1, global_batch_size=1024)
    tr.update(train or {})
    return RunSpec(model=model, parallel=ParallelSpec(**par), train=TrainSpec(**tr),
                   cluster=ClusterSpec(hardware=hardware or hardware_preset(hw),
                                       num_nodes=nodes, gpus_per_node=gpn))
