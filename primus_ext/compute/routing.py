"""Where routed tokens go: the expected spread over expert-parallel ranks and domains.

Pure combinatorics of top-k routing, shared by the op model (compute/layer_ops.py: rows
a rank's experts and permutations handle) and the dispatcher model (comm/moe_comm.py:
bytes a dispatch moves).

- ``expected_domains_hit``: how many of ``K`` groups of consecutive experts (EP ranks,
  or the scale-up domains holding them) a token's ``k`` experts fall in, under uniform
  routing, with or without group-limited routing (megatron-core
  ``moe_router_num_groups`` / ``moe_router_group_topk``). The flex dispatcher
  (DeepEP / HybridEP) sends a token once per destination rank and once per destination
  domain over the network, so these counts size its traffic.
- ``consecutive_blocks_hit``: the same count when a token's ``k`` experts are
  consecutive ids (NeMo AutoModel's ``FakeBalancedGate``, ``train.moe_router_exact_
  balance``): token ``t`` takes experts ``t k .. t k + k - 1`` (mod ``E``), so it
  reaches the fewest ranks a window of ``k`` experts can cover.
- ``routing_spread_factor``: the busiest EP rank's routed rows over the mean. The
  expert compute and the all-to-all of a layer end with the busiest rank.
"""
from __future__ import annotations

from math import comb, gcd, sqrt
from statistics import NormalDist


def expected_max_normal(n: int) -> float:
    """E[max of n iid standard normals] (0 for n <= 1; exact for 2, Blom otherwise)."""
    if n <= 1:
        return 0.0
    if n == 2:
        return 1.0 / sqrt(3.141592653589793)
    return NormalDist().inv_cdf((n - 0.375) / (n + 0.25))


def _p_miss(total: int, avoid: int, draws: int) -> float:
    """P(a uniform draw of ``draws`` of ``total`` items misses ``avoid`` given items)."""
    if draws > total - avoid:
        return 0.0
    return comb(total - avoid, draws) / comb(total, draws)


def expected_domains_hit(num_experts: int, topk: int, num_domains: int,
                         num_groups: int | None = None,
                         group_topk: int | None = None) -> float:
    """Expected number of the ``num_domains`` domains (each holding ``E / K`` consecutive
    experts) that a token's ``topk`` experts fall in, under uniform random logits.

    Without groups the ``k`` experts are a uniform draw from ``E``. With group-limited
    routing (megatron-core moe_utils.group_limited_topk) the ``group_topk`` groups with
    the highest sums of their best ``k / group_topk`` scores are chosen and the top ``k``
    taken among them: every chosen group holds about ``k / group_topk`` of them (it was
    chosen for those), drawn within the group."""
    e, k, kd = num_experts, topk, num_domains
    if kd <= 1:
        return 1.0
    per_dom = e / kd
    if not num_groups or not group_topk or group_topk >= num_groups:
        miss = _p_miss(e, round(per_dom), k)
        return kd * (1.0 - miss)
    g, gk = num_groups, group_topk
    per_grp = e // g
    if g >= kd:  # a domain holds g / K whole groups: hit iff one of them is chosen
        in_dom = g // kd
        return kd * (1.0 - comb(g - in_dom, gk) / comb(g, gk))
    # a group spans K / g domains; a chosen group's share of the k lands inside it
    kk = max(round(k / gk), 1)
    return kd * (gk / g) * (1.0 - _p_miss(per_grp, round(per_dom), kk))


def consecutive_blocks_hit(num_experts: int, topk: int, num_blocks: int) -> float:
    """Distinct blocks (of ``num_blocks``, each holding ``E / num_blocks`` consecutive
    experts) that a token's experts fall in, averaged over the tokens, when token ``t``
    is routed to experts ``(t k + j) mod E``, ``j < k``.

    NeMo AutoModel's ``FakeBalancedGate`` with ``noise`` 0 (``components/moe/layers.py``,
    github.com/NVIDIA-NeMo/Automodel @e45812012456, the same since @f0dbc51c6):
    ``indices = torch.arange(n_tokens * a_exp).view(-1, a_exp) % available_experts``.
    The window starts at a multiple of ``g = gcd(k, E)``; the ``E / g`` starts occur
    equally often over a rank's tokens, so the mean over them is exact."""
    e, k, nb = num_experts, topk, num_blocks
    if nb <= 1 or e <= 0 or k <= 0:
        return 1.0
    starts = range(0, e, gcd(k, e))
    hit = sum(len({((s + j) % e) * nb // e for j in range(min(k, e))}) for s in starts)
    return hit / len(starts)


def ranks_hit(model, ep: int, consecutive: bool = False) -> float:
    """Expected distinct EP ranks (of ``ep``, each holding ``E / ep`` consecutive experts)
    a token is sent to; ``consecutive``: each token's experts are consecutive ids
    (``consecutive_blocks_hit``), else uniform routing."""
    if consecutive:
        return consecutive_blocks_hit(model.num_moe_experts, model.moe_router_topk, ep)
    return expected_domains_hit(model.num_moe_experts, model.moe_router_topk, ep,
                                model.moe_router_num_groups, model.moe_router_group_topk)


def random_spread(num_experts: int, topk: int, ep: int, tokens: float) -> float:
    """Busiest of ``ep`` ranks over the mean under uniform random routing of ``tokens``
    tokens (the EP group's).

    megatron-core's benchmark mode (``moe_router_force_load_balancing``,
    ``moe_utils.RandomSTE``) replaces the router logits with standard normals, so each
    token picks ``k`` distinct experts uniformly. A rank holding ``E / ep`` experts
    receives from each token a hypergeometric count (mean ``k / ep``, variance ``k p (1 -
    p) (E - k) / (E - 1)``, ``p = 1 / ep``); the ranks' loads sum to ``N k`` (correlation
    ``-1 / (ep - 1)``), so the busiest is ``1 + cv * sqrt(ep / (ep - 1)) * E[max of ep
    standard normals]`` (for two ranks ``cv * sqrt(2 / pi)``, exact)."""
    if ep <= 1 or tokens <= 0 or num_experts <= 1:
        return 1.0
    e, k = num_experts, topk
    p = 1.0 / ep
    mean = tokens * k * p
    var = tokens * k * p * (1 - p) * (e - k) / (e - 1)
    return 1.0 + sqrt(var) / mean * sqrt(ep / (ep - 1)) * expected_max_normal(ep)


# Coefficient of variation of one expert's share of a micro-batch's routed tokens under a
# learned top-k router on text (per expert; the skew is systematic: the same experts are
# popular in every micro-batch). From the Megatron-MoE-ModelZoo Qwen3-235B-A22B
# long-context table (github.com/yanring/Megatron-MoE-ModelZoo @e8650517d60d
# best_practice/qwen3/readme.md, H100, EP 8, TP 4, CP 1-8, 16k-128k tokens): model TFLOP/s
# "forced balance" / "dropless" 295/237, 335/277, 368/320, 389/357. Each ratio is the
# step-time slope of the busiest-rank factor times its excess over 1; the projector's
# slopes of those four runs (0.60, 0.51, 0.37, 0.24) give a busiest factor of 1.40 +-
# 0.02 at every CP degree (the skew does not depend on how many sequences the EP group
# holds), which for 16 of 128 experts per rank of 8 is this per-expert CV
# (tests/compute/test_routing_imbalance.py holds the four ratios).
LEARNED_EXPERT_LOAD_CV = 1.11


def learned_rank_cv(num_experts: int, ep: int) -> float:
    """CV of an EP rank's load when each of its ``E / ep`` experts carries a share with
    CV ``LEARNED_EXPERT_LOAD_CV`` (independent experts, drawn without replacement from
    the ``E``)."""
    m = num_experts / ep
    if ep <= 1 or m >= num_experts:
        return 0.0
    return LEARNED_EXPERT_LOAD_CV * sqrt((num_experts - m) / (m * (num_experts - 1)))


def routing_spread_factor(sh) -> float:
    """Busiest EP rank's routed rows over the mean (``sh``: compute/ops.Shapes).

    - token dropping (``moe_expert_capacity_factor``) caps every expert at its capacity
      (exactly, when padded; at the mean for factors up to 1): 1;
    - exact balance (``train.moe_router_exact_balance``: every expert the same number of
      tokens): 1;
    - forced balancing (``moe_router_force_load_balancing``) or mock data
      (``train.moe_routing_data='mock'``: random token ids, routed at random): uniform
      random routing over the group's ``ep * etp * sp_tokens`` tokens (``random_spread``);
    - Sinkhorn balancing (``moe_router_load_balancing_type='sinkhorn'``, megatron-core
      ``TopKRouter.sinkhorn_load_balancing``): the top-k is taken on ``moe_utils.sinkhorn``
      of each micro-batch's logits, whose column scaling equalises every expert's mass
      over the micro-batch and so cancels any per-expert skew of the router; what is left
      is the draw, at most uniform random routing's (``random_spread``;
      tests/compute/test_layer_ops.py runs megatron-core's own sinkhorn on skewed logits);
    - aux-loss-free balancing (``--moe-router-enable-expert-bias``, ``parallel.
      moe_router_terms`` 'expert_bias'): every step megatron-core moves each expert's
      routing bias by ``moe_router_bias_update_rate`` toward the mean load
      (``moe_utils.get_updated_expert_bias``), which takes out a systematic skew, and the
      learned skew is systematic (``LEARNED_EXPERT_LOAD_CV``: the same at every CP
      degree): the random spread is left (tests/compute/test_layer_ops.py runs
      megatron-core's own bias updates on a skewed router);
    - a learned router on text with a balancing loss only (aux, sequence or global aux
      loss, or none): the random spread and the router's own skew (``learned_rank_cv``)
      add in quadrature before the busiest of ``ep`` is taken."""
    m, t = sh.model, sh.train
    if sh.ep <= 1 or m.moe_expert_capacity_factor is not None or t.moe_router_exact_balance:
        return 1.0
    e, k, ep = m.num_moe_experts, m.moe_router_topk, sh.ep
    rand = random_spread(e, k, ep, ep * sh.etp * sh.sp_tokens) - 1.0
    if (t.moe_router_force_load_balancing or t.moe_routing_data == "mock"
            or sh.par.moe_router_load_balancing_type == "sinkhorn"
            or "expert_bias" in sh.par.moe_router_terms):
        return 1.0 + rand
    scale = sqrt(ep / (ep - 1)) * expected_max_normal(ep)
    cv = sqrt((rand / scale) ** 2 + learned_rank_cv(e, ep) ** 2)
    return 1.0 + cv * scale
