"""Busiest-rank expert load from routing vectors, against direct counts of the same
vectors and sampled normal order statistics."""
from __future__ import annotations

import math
import random

import pytest

from primus_ext.project.moe_balance import busiest_rank_factor, expected_max_normal, \
    rank_load_cv


def test_expected_max_normal_matches_sampling():
    rng = random.Random(7)
    for n in (2, 4, 8, 64):
        draws = [max(rng.gauss(0, 1) for _ in range(n)) for _ in range(20000)]
        assert expected_max_normal(n) == pytest.approx(sum(draws) / len(draws), abs=0.03)
    assert expected_max_normal(1) == 0.0
    assert expected_max_normal(2) == pytest.approx(1 / math.sqrt(math.pi))


def _routing(rng, experts: int, tokens: int, skew: list[float]) -> tuple[int, ...]:
    """Tokens per expert of one router call: each token picks one expert with the
    (unnormalised) preference ``skew``."""
    counts = [0] * experts
    for _ in range(tokens):
        counts[rng.choices(range(experts), weights=skew)[0]] += 1
    return tuple(counts)


@pytest.mark.parametrize("ep,per_rank", [(4, 2), (8, 2), (8, 4)])
def test_normal_approximation_from_a_subset_of_ranks(ep, per_rank):
    """A measurement that held two ranks' experts predicts the busiest of ``ep`` ranks:
    compared with counting the busiest rank on the full vectors (random imbalance)."""
    rng = random.Random(ep * 10 + per_rank)
    experts = ep * per_rank
    measured, counted = [], []
    for _ in range(400):
        skew = [rng.uniform(0.5, 1.5) for _ in range(experts)]
        vec = _routing(rng, experts, 64 * experts, skew)
        measured.append(vec[:2 * per_rank])
        ranks = [sum(vec[i:i + per_rank]) for i in range(0, experts, per_rank)]
        counted.append(max(ranks) / (sum(ranks) / ep))
    direct = sum(counted) / len(counted)
    assert busiest_rank_factor(measured, per_rank, ep) == pytest.approx(direct, rel=0.03)


def test_balanced_routing_and_one_rank_cost_nothing():
    even = [(64, 64, 64, 64)] * 10
    assert busiest_rank_factor(even, 2, 2) == 1.0
    skewed = [(100, 20, 70, 66)] * 10
    assert busiest_rank_factor(skewed, 4, 1) == 1.0
    # Two ranks of two experts: 120 vs 136 tokens -> busiest 136 / 128.
    assert busiest_rank_factor(skewed, 2, 2) == pytest.approx(136 / 128)


def test_fewer_measured_experts_than_a_rank_holds_scale_by_sqrt():
    loads = [(100, 20, 70, 66)] * 3
    single = rank_load_cv(loads, 1)
    assert rank_load_cv(loads, 4) == pytest.approx(single / 2)
