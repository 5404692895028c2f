"""Spec builders for the measure tests (imported by file name)."""
from __future__ import annotations

from primus_ext.presets import hardware_preset
from primus_ext.spec import ClusterSpec, ModelSpec, ParallelSpec, RunSpec, TrainSpec


def run(model: ModelSpec, hw: str = "h100", nodes: int = 1, gpn: int | None = None,
        train: dict | None = None, **par) -> RunSpec:
    tr = dict(seq_length=4096, micro_batch_size=1, global_batch_size=256)
    tr.update(train or {})
    return RunSpec(model=model, parallel=ParallelSpec(**par), train=TrainSpec(**tr),
                   cluster=ClusterSpec(hardware=hardware_preset(hw), num_nodes=nodes,
                                       gpus_per_node=gpn))


def llama70b(**kw) -> ModelSpec:
    base = dict(name="llama70b", num_layers=80, hidden_size=8192, num_attention_heads=64,
                num_query_groups=8, ffn_hidden_size=28672, vocab_size=128256)
    base.update(kw)
    return ModelSpec(**base)


def mixtral(**kw) -> ModelSpec:
    base = dict(name="mixtral", num_layers=32, hidden_size=4096, num_attention_heads=32,
                num_query_groups=8, ffn_hidden_size=14336, vocab_size=32000,
                num_moe_experts=8, moe_router_topk=2)
    base.update(kw)
    return ModelSpec(**base)


def tiny(**kw) -> ModelSpec:
    base = dict(name="tiny", num_layers=8, hidden_size=256, num_attention_heads=8,
                ffn_hidden_size=1024, vocab_size=1000)
    base.update(kw)
    return ModelSpec(**base)
