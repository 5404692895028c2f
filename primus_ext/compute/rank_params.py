"""Parameters one rank holds, split into dense (reduced over data x context parallel) and
expert (reduced over expert-data parallel), per layer and per pipeline stage.

Built on the parameter groups of memory/params.py and their sharding rules: ``tp`` and
``vocab`` tensors split over TP, routed-expert tensors over ``ep * etp`` (their
row-parallel biases over ``ep``), the rest replicated.
"""
from __future__ import annotations

from functools import lru_cache

from primus_ext.memory.rank_params import chunk_param_tensors, stage_params
from primus_ext.memory.params import ParamGroup, embedding_groups, layer_groups, \
    mtp_groups, output_groups
from primus_ext.spec.model import ModelSpec
from primus_ext.spec.parallel import ParallelSpec
from primus_ext.spec.run import RunSpec


def _split(groups: list[ParamGroup], par: ParallelSpec) -> tuple[float, float]:
    dense = expert = 0.0
    for g in groups:
        if g.shard == "tp":
            dense += g.num_params / par.tp
        elif g.shard == "vocab":
            dense += g.num_params / par.tp  # groups built with the TP-padded vocab
        elif g.shard == "expert":
            expert += g.num_params / (par.ep * par.expert_tp)
        elif g.shard == "expert_replicated":
            expert += g.num_params / par.ep
        else:
            dense += g.num_params
    return dense, expert


@lru_cache(maxsize=4096)
def layer_params_on_rank(model: ModelSpec, par: ParallelSpec, layer: int
                         ) -> tuple[float, float]:
    """(dense, expert) parameters of decoder layer ``layer`` on one rank."""
    return _split(layer_groups(model, layer), par)


@lru_cache(maxsize=1024)
def embedding_params_on_rank(model: ModelSpec, par: ParallelSpec) -> float:
    return _split(embedding_groups(model, par.tp), par)[0]


@lru_cache(maxsize=1024)
def output_params_on_rank(model: ModelSpec, par: ParallelSpec) -> float:
    """Final norm and output layer (the tied embedding counts on the first stage)."""
    return _split(output_groups(model, par.tp), par)[0]


@lru_cache(maxsize=1024)
def mtp_params_on_rank(model: ModelSpec, par: ParallelSpec) -> tuple[float, float]:
    d, e = _split(mtp_groups(model), par)
    return d * model.mtp_num_layers, e * model.mtp_num_layers


def chunk_param_counts(spec: RunSpec, stage: int, chunk: int) -> tuple[float, float]:
    """(dense, expert) parameters of one model chunk (virtual stage) on one rank, as the
    memory model places them (verified against megatron-core's own tensors): decoder
    layers, the embedding on chunk 0 of stage 0, output layer, MTP and shared embedding
    copies on the last chunk. megatron-core wraps every chunk in its own DDP instance,
    so each chunk has its own gradient buckets."""
    local = spec.train.attention_backend == "unfused"
    dense = expert = 0
    for t in chunk_param_tensors(spec.model, spec.parallel, stage, chunk, local):
        if t.expert:
            expert += t.numel
        else:
            dense += t.numel
    return float(dense), float(expert)


def stage_param_counts(spec: RunSpec, stage: int) -> tuple[float, float]:
    """(dense, expert) parameters on one rank of pipeline stage ``stage`` (all chunks)."""
    sp = stage_params(spec.model, spec.parallel, stage,
                      spec.train.attention_backend == "unfused")
    return float(sp.num_dense_params), float(sp.num_expert_params)
