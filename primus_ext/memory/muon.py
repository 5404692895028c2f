"""Muon's optimizer state and Newton-Schulz work on one rank (``--optimizer muon`` /
``dist_muon``, Megatron-LM core_v0.16.1; megatron-core 0.16.1 optimizer/muon.py
``get_megatron_muon_optimizer`` and optimizer/layer_wise_optimizer.py).

- Which parameters: every 2-D weight that is not the embedding or output layer
  (``len(param.shape) == 2`` and not ``is_embedding_or_output_parameter``: the linear
  layers, the router, the MTP projection, each routed expert's weights) is updated by
  ``TensorParallelMuon``; the rest (embedding, output layer, norms, biases) by Adam in
  the same chained optimizer.
- State: under bf16 ``Float16OptimizerWithFloat16Params`` keeps fp32 master weights of
  both; Muon adds one fp32 ``momentum_buffer`` per element (``muon_init_state_fn``:
  ``torch.zeros_like(p.data)`` of the master), Adam its two moments. fp32 training has
  no master copy (``FP32Optimizer``).
- ``dist_muon``: ``LayerWiseDistributedOptimizer.shard_params`` hands whole parameters,
  sorted by size, to the ranks of the data(-context)-parallel group (expert parameters
  over expert-DP) in a ping-pong order (0..dp-1, dp-1..0, ...); a rank keeps the state of
  its own, and the largest rank's is taken (``dist_muon_bytes``: the embedding, one
  tensor, stays whole on one rank); ``muon`` keeps all.
- Work: Muon orthogonalises each weight's momentum with ``muon_num_ns_steps`` (5)
  Newton-Schulz iterations on the rank's TP shard (``muon_tp_mode`` blockwise); the
  fused QKV weight as its q, k and v blocks (``muon_split_qkv``, on by default), each
  one (query groups x rows, hidden) matrix. One iteration on an m x n matrix (m <= n):
  ``A = X X^T`` (2 m^2 n), ``B = b A + c A A`` (2 m^3), ``X = a X + B X`` (2 m^2 n).
  Its kernels and host time: project/muon_step.py.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from primus_ext.memory.rank_params import chunk_param_tensors
from primus_ext.spec.model import ModelSpec
from primus_ext.spec.parallel import ParallelSpec

MUON_OPTIMIZERS = ("muon", "dist_muon")
NS_STEPS = 5  # Megatron-LM --muon-num-ns-steps default
_MUON_WEIGHT = re.compile(r"(linear_\w+|router|eh_proj)\.weight$")


@dataclass(frozen=True, slots=True)
class MuonShard:
    muon_dense: int  # elements Muon updates on this rank (before dist_muon's split)
    muon_expert: int
    adam_dense: int  # elements Adam updates (embedding, output, norms, biases)
    adam_expert: int
    ns_flops: float  # Newton-Schulz FLOPs of one step over all Muon weights held


def is_muon_weight(name: str) -> bool:
    return bool(_MUON_WEIGHT.search(name)) and "embedding" not in name \
        and not name.startswith("output_layer")


def _ns_flops(m: int, n: int, steps: int) -> float:
    m, n = min(m, n), max(m, n)
    return steps * (4.0 * m * m * n + 2.0 * m ** 3)


def _weight_flops(model: ModelSpec, par: ParallelSpec, name: str, numel: int,
                  steps: int) -> float:
    h = model.hidden_size
    if name.endswith("linear_qkv.weight"):
        d = model.head_dim
        groups = max(model.num_groups // par.tp, 1)
        q = model.num_attention_heads // model.num_groups * d
        # muon.py orthogonalize: each block reshaped to (groups * rows, hidden).
        return _ns_flops(groups * q, h, steps) + 2 * _ns_flops(groups * d, h, steps)
    k = h
    if name.endswith("linear_q_up_proj.weight"):
        k = model.q_lora_rank or h
    elif name.endswith("linear_kv_up_proj.weight"):
        k = model.kv_lora_rank
    return _ns_flops(k, max(numel // k, 1), steps)


@lru_cache(maxsize=1024)
def muon_shard(model: ModelSpec, par: ParallelSpec, stage: int,
               local_spec: bool = False, steps: int = NS_STEPS) -> MuonShard:
    """Muon and Adam elements and Newton-Schulz FLOPs of one rank of a pipeline stage
    (all its chunks), before ``dist_muon`` splits them over data-parallel ranks."""
    md = me = ad = ae = 0
    flops = 0.0
    for t in _tensors(model, par, stage, local_spec):
        if is_muon_weight(t.name):
            if t.expert:
                me += t.numel
            else:
                md += t.numel
            flops += _weight_flops(model, par, t.name, t.numel, steps)
        elif t.expert:
            ae += t.numel
        else:
            ad += t.numel
    return MuonShard(muon_dense=md, muon_expert=me, adam_dense=ad, adam_expert=ae,
                     ns_flops=flops)


def _tensors(model: ModelSpec, par: ParallelSpec, stage: int, local_spec: bool):
    return [t for chunk in range(par.vpp)
            for t in chunk_param_tensors(model, par, stage, chunk, local_spec)]


def muon_optimizer_bytes(shard: MuonShard, optimizer: str, master_bytes: int,
                         dp: int, expert_dp: int, model: ModelSpec | None = None,
                         par: ParallelSpec | None = None, stage: int = 0,
                         local_spec: bool = False) -> int:
    """Master weights plus Muon's momentum / Adam's two moments (fp32) this rank keeps;
    ``dist_muon``: the largest rank's share of whole parameters (``dist_muon_bytes``)."""
    if optimizer == "dist_muon" and model is not None and par is not None:
        return dist_muon_bytes(model, par, stage, local_spec, master_bytes, dp, expert_dp)
    dense = shard.muon_dense * (master_bytes + 4) + shard.adam_dense * (master_bytes + 8)
    expert = shard.muon_expert * (master_bytes + 4) + shard.adam_expert * (master_bytes + 8)
    if optimizer == "dist_muon":
        return -(-dense // dp) + -(-expert // max(expert_dp, 1))
    return dense + expert


@lru_cache(maxsize=1024)
def dist_muon_bytes(model: ModelSpec, par: ParallelSpec, stage: int, local_spec: bool,
                    master_bytes: int, dp: int, expert_dp: int) -> int:
    """The largest optimizer state of a rank under LayerWiseDistributedOptimizer: whole
    parameters sorted by size go to the ranks in ping-pong order, dense over dp, expert
    over expert-DP (shard_params)."""
    def largest(sizes: list[tuple[int, int]], ranks: int) -> int:
        if ranks <= 1:
            return sum(n * b for n, b in sizes)
        loop = list(range(ranks)) + list(range(ranks))[::-1]
        per = [0] * ranks
        for i, (n, b) in enumerate(sorted(sizes, key=lambda x: x[0])):
            per[loop[i % len(loop)]] += n * b
        return max(per)
    dense, expert = [], []
    for t in _tensors(model, par, stage, local_spec):
        b = master_bytes + (4 if is_muon_weight(t.name) else 8)
        (expert if t.expert else dense).append((t.numel, b))
    return largest(dense, dp) + largest(expert, expert_dp)
