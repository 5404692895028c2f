"""Muon's optimizer step, kernel by kernel: what the host issues and the device runs.

megatron-core 0.16.1 optimizer/muon.py ``TensorParallelMuon`` over Emerging-Optimizers
v0.1.0 (the revision Megatron-LM core_v0.16.1's pyproject.toml pins),
``orthogonalized_optimizer.py`` ``OrthogonalizedOptimizer.step`` (lines 141-179) and
``muon_utils.py`` ``newton_schulz`` (lines 108-161). For every Muon weight (memory/muon.py)
the step loops in Python, one tensor at a time:

- ``_apply_weight_decay_inplace`` (mixin.py, decoupled: ``p.add_(p, alpha=-wd*lr)``): 1
  kernel (0 without weight decay); ``momentum_buffer.lerp_``: 1; ``--muon-use-nesterov``
  (off by default) another ``lerp``; the update ``p.add_``: 1.
- ``orthogonalize`` (muon.py lines 136-161): the fused QKV weight (``--muon-split-qkv``,
  on by default) is viewed as (query groups, q+k+v, hidden) and split into its q, k and v
  blocks; with more than one group each block is a strided slice, so ``reshape`` copies
  it (1 kernel each), and ``torch.cat`` joins the results (1). Every block (or the whole
  weight) goes through ``scaled_orthogonalize_fn`` (muon.py lines 67-90):
  ``F.normalize(p=2, dim=(-2, -1))`` (norm, clamp_min, div: 3), ``X.to(bfloat16)`` under
  ``--muon-fp32-matmul-prec medium`` (1; the iterations run as BF16 GEMMs, not TF32),
  ``--muon-num-ns-steps`` (5) quintic iterations of ``A = X X^T``, ``B = b A + c A A``
  (``addmm``), ``X = a X + B X`` (``addmm``): 3 GEMMs each, ``X.to(float32)`` (1), then
  ``orth_grad * scale_factor * extra_scale_factor`` (2). The coefficients are Python
  floats: no kernel. ``--muon-tp-mode blockwise`` (the default) runs each TP shard alone:
  no collective.

Each of these is one Python call, one dispatch and one launch: the host cost of a weight
is its Python and dispatch on the reference host (``data/host/muon.json``, measured by
``scripts/muon_host_profile.py``: seconds per kernel of a plain weight's and of a split
QKV weight's step) over ``host_speed``, plus ``launch_s`` per kernel; the device runs the
same kernels (``kernel_overhead_s`` each) and the GEMMs (``compute/gemm.py``, BF16).

``dist_muon`` (optimizer/layer_wise_optimizer.py ``shard_params``, lines 92-144): every
parameter of the chained optimizers, Muon's and Adam's, sorted by ``numel`` (a stable
sort: Muon's groups first), is handed whole to the data(-context)-parallel ranks in
ping-pong order (expert parameters over expert-DP); a rank orthogonalises only its own,
and the slowest rank sets the pace. ``allgather_params`` (lines 146-182) then flattens
the local parameters (1 kernel), issues one ``all_gather`` per group and copies every
parameter owned elsewhere back into the model (1 kernel each).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from primus_ext.comm.groups import group_span
from primus_ext.compute.gemm import gemm_time_s
from primus_ext.memory.muon import NS_STEPS, _tensors, is_muon_weight
from primus_ext.memory.states import is_local_spec
from primus_ext.spec.run import RunSpec

PROFILE_PATH = Path(__file__).resolve().parent.parent / "data" / "host" / "muon.json"

# Kernels per orthogonalised block outside the iterations: normalize (3), to bf16 (1),
# to fp32 (1), the two scale products (2).
BLOCK_KERNELS = 7
GEMMS_PER_ITERATION = 3
# Per weight outside orthogonalize: weight decay, momentum lerp, update.
WEIGHT_KERNELS = 3


@dataclass(frozen=True, slots=True)
class MuonMatrix:
    name: str
    numel: int
    expert: bool
    blocks: tuple[tuple[int, int], ...]  # (rows, cols) each orthogonalised block
    kernels: int  # kernels of one step on this weight

    def gemms(self, steps: int = NS_STEPS) -> list[tuple[int, int, int]]:
        """(m, n, k) of every GEMM of the iterations, m <= n the short side."""
        out = []
        for r, c in self.blocks:
            s, lg = min(r, c), max(r, c)
            out += [(s, s, lg), (s, s, s), (s, lg, s)] * steps
        return out

    def flops(self, steps: int = NS_STEPS) -> float:
        return sum(2.0 * m * n * k for m, n, k in self.gemms(steps))


def weight_kernels(blocks: int, strided: bool, steps: int = NS_STEPS,
                   nesterov: bool = False, weight_decay: bool = True) -> int:
    """Kernels one Muon step launches on one weight split into ``blocks`` (module
    docstring)."""
    n = WEIGHT_KERNELS - (0 if weight_decay else 1) + (1 if nesterov else 0)
    n += blocks * (BLOCK_KERNELS + GEMMS_PER_ITERATION * steps)
    if blocks > 1:
        n += 1 + (blocks if strided else 0)  # cat; reshape copies of strided blocks
    return n


def muon_matrices(spec: RunSpec, stage: int, steps: int = NS_STEPS) -> list[MuonMatrix]:
    """The Muon weights a rank of this stage holds (all its chunks), with their blocks."""
    m, par = spec.model, spec.parallel
    h = m.hidden_size
    out = []
    for t in _tensors(m, par, stage, is_local_spec(spec.train)):
        if not is_muon_weight(t.name):
            continue
        if t.name.endswith("linear_qkv.weight"):
            d = m.head_dim
            groups = max(m.num_groups // par.tp, 1)
            q = m.num_attention_heads // m.num_groups * d
            blocks = ((groups * q, h), (groups * d, h), (groups * d, h))
            kern = weight_kernels(3, groups > 1, steps)
        else:
            k = h
            if t.name.endswith("linear_q_up_proj.weight"):
                k = m.q_lora_rank or h
            elif t.name.endswith("linear_kv_up_proj.weight"):
                k = m.kv_lora_rank
            blocks = ((max(t.numel // k, 1), k),)
            kern = weight_kernels(1, False, steps)
        out.append(MuonMatrix(t.name, t.numel, t.expert, blocks, kern))
    return out


def _owned(spec: RunSpec, stage: int, mats: list[MuonMatrix]) -> list[list[MuonMatrix]]:
    """dist_muon: the Muon weights each rank owns (module docstring), dense over dp_cp
    and expert over expert-DP; a rank's list joins one dense and one expert share."""
    dp = group_span(spec, "dp_cp").size
    edp = group_span(spec, "edp").size
    muon = {t.name: t for t in mats}
    tensors = _tensors(spec.model, spec.parallel, stage, is_local_spec(spec.train))
    order = [t for t in tensors if t.name in muon] + [t for t in tensors if t.name not in muon]
    order.sort(key=lambda t: t.numel)
    dense, expert = [[] for _ in range(dp)], [[] for _ in range(edp)]
    for ranks, lists, flag in ((dp, dense, False), (edp, expert, True)):
        loop = list(range(ranks)) + list(range(ranks))[::-1]
        i = 0
        for t in order:
            if t.expert != flag:
                continue
            if t.name in muon:
                lists[loop[i % len(loop)]].append(muon[t.name])
            i += 1
    # Rank r of dp_cp is rank r % edp of its expert-DP group (both run over the same
    # data-parallel ranks, experts spread over EP).
    return [dense[r] + expert[r % edp] for r in range(dp)]


@dataclass(frozen=True, slots=True)
class MuonStep:
    host_s: float  # host seconds of the Muon weights' loop
    device_s: float  # device seconds of its kernels and GEMMs
    kernels: int
    flops: float
    gather_kernels: int  # dist_muon: flatten plus copies back of others' parameters
    gather_collectives: int


@lru_cache(maxsize=1)
def reference_python_per_kernel() -> tuple[float, float]:
    """Reference-host Python and dispatch seconds per kernel of a plain weight's step
    and of a split QKV weight's step (data/host/muon.json)."""
    d = json.loads(PROFILE_PATH.read_text())
    return tuple(d[k]["seconds"] / d[k]["kernels"] for k in ("plain", "split_qkv"))


def python_s(t: MuonMatrix) -> float:
    plain, split = reference_python_per_kernel()
    return t.kernels * (split if len(t.blocks) > 1 else plain)


def _cost(spec: RunSpec, mats: list[MuonMatrix], steps: int) -> tuple[float, float]:
    hw = spec.cluster.hardware
    kernels = sum(t.kernels for t in mats)
    host = (sum(python_s(t) for t in mats) / hw.host_speed + kernels * hw.launch_s
            if hw.host_clock else 0.0)
    gemm = sum(gemm_time_s(hw, m, n, k) for t in mats for m, n, k in t.gemms(steps))
    gemms = sum(len(t.gemms(steps)) for t in mats)
    device = gemm + (kernels - gemms) * hw.kernel_overhead_s
    return host, device


def muon_step(spec: RunSpec, stage: int, steps: int = NS_STEPS) -> MuonStep:
    """The Muon weights' step on the slowest rank of this stage (module docstring)."""
    mats = muon_matrices(spec, stage, steps)
    hw = spec.cluster.hardware
    if spec.train.optimizer != "dist_muon" or group_span(spec, "dp_cp").size == 1:
        host, device = _cost(spec, mats, steps)
        return MuonStep(host, device, sum(t.kernels for t in mats),
                        sum(t.flops(steps) for t in mats), 0, 0)
    shares = _owned(spec, stage, mats)
    costs = [_cost(spec, s, steps) for s in shares]
    r = max(range(len(shares)), key=lambda i: max(costs[i]))
    own = shares[r]
    held = len(_tensors(spec.model, spec.parallel, stage, is_local_spec(spec.train)))
    groups = 1 + (1 if group_span(spec, "edp").size > 1 and any(t.expert for t in mats)
                  else 0)
    # The flatten of the rank's own tensors per group, and a copy of every tensor
    # another rank owns (about all but a 1/dp share of those held).
    copies = groups + held - -(-held // group_span(spec, "dp_cp").size)
    host, device = costs[r]
    if hw.host_clock:
        host += copies * (reference_python_per_kernel()[0] / hw.host_speed + hw.launch_s) \
            + groups * hw.collective_host_s
    device += copies * hw.kernel_overhead_s
    return MuonStep(host, device, sum(t.kernels for t in own),
                    sum(t.flops(steps) for t in own), copies, groups)
