"""The busiest expert-parallel rank under a learned router on text, against the
Megatron-MoE-ModelZoo's published forced-balance / dropless pairs.

github.com/yanring/Megatron-MoE-ModelZoo @e8650517d60d best_practice/qwen3/readme.md,
H100 "Long Context" table (Qwen3-235B-A22B, DeepEP, BF16, 32 nodes, TP 4, EP 8): model
TFLOP/s "forced balance" / "dropless" at 16k, 32k, 64k, 128k tokens: 295/237, 335/277,
368/320, 389/357. The same run projected with ``moe_router_force_load_balancing`` on and
off must slow down by the published ratio: the router's skew
(compute/routing.py LEARNED_EXPERT_LOAD_CV) is one constant for all four, and the ratio
falls with the sequence length only because attention's share of the step grows."""
from __future__ import annotations

import dataclasses

import pytest

from primus_ext.compute.routing import learned_rank_cv, random_spread, \
    routing_spread_factor
from primus_ext.compute.ops import Shapes
from primus_ext.project.estimate import project
from primus_ext.published import DEFAULT_PATH, read_runs

PAIRS = {"P103": 295 / 237, "P104": 335 / 277, "P105": 368 / 320, "P106": 389 / 357}


@pytest.fixture(scope="module")
def runs():
    return {r.run_id: r for r in read_runs(DEFAULT_PATH)
            if r.run_id in PAIRS}


@pytest.mark.parametrize("run_id", sorted(PAIRS))
def test_dropless_over_forced_matches_the_published_ratio(runs, run_id):
    spec = runs[run_id].spec
    assert spec.train.moe_router_force_load_balancing  # the row is the forced value
    assert spec.train.moe_routing_data == "real"
    dropless = dataclasses.replace(spec, train=dataclasses.replace(
        spec.train, moe_router_force_load_balancing=False))
    ratio = project(dropless).step_time_s / project(spec).step_time_s
    assert ratio == pytest.approx(PAIRS[run_id], abs=0.03)


def test_mock_data_and_forced_balance_route_at_random(runs):
    spec = runs["P103"].spec
    sh = Shapes(spec)
    m = spec.model
    rand = random_spread(m.num_moe_experts, m.moe_router_topk, sh.ep,
                         sh.ep * sh.etp * sh.sp_tokens)
    assert routing_spread_factor(sh) == pytest.approx(rand)
    mock = dataclasses.replace(spec, train=dataclasses.replace(
        spec.train, moe_router_force_load_balancing=False, moe_routing_data="mock"))
    assert routing_spread_factor(Shapes(mock)) == pytest.approx(rand)


def test_fewer_experts_per_rank_spread_more():
    # A rank's load sums its experts' shares: the fewer experts, the larger its CV.
    assert learned_rank_cv(128, 32) > learned_rank_cv(128, 8) > learned_rank_cv(128, 2)
    assert learned_rank_cv(128, 1) == 0.0
