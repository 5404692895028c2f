"""NeMo AutoModel's FakeBalancedGate routes token t to experts t*k .. t*k+k-1 (mod E):
``compute/routing.consecutive_blocks_hit`` must count the EP ranks and nodes that the
gate's own index expression reaches.

Source line (github.com/NVIDIA-NeMo/Automodel @e45812012456
nemo_automodel/components/moe/layers.py, FakeBalancedGate.forward with noise 0)::

    indices = (torch.arange(n_tokens * a_exp, device=x.device).view(-1, a_exp)
               % available_experts) + self.skip_first_n_experts
"""
from __future__ import annotations

import pytest

from primus_ext.compute.routing import consecutive_blocks_hit, expected_domains_hit, \
    ranks_hit
from primus_ext.presets import model_preset
from primus_ext.spec import ModelSpec

torch = pytest.importorskip("torch")


def _gate_indices(n_tokens: int, a_exp: int, available_experts: int):
    return torch.arange(n_tokens * a_exp).view(-1, a_exp) % available_experts


def _mean_blocks(idx, num_experts: int, blocks: int) -> float:
    block = idx * blocks // num_experts
    return float(torch.tensor([len(set(row.tolist())) for row in block]).float().mean())


# (experts, top-k, EP ranks or nodes): the published AutoModel benchmark layouts
# (Qwen3-30B-A3B and GPT-OSS-20B on EP 8, DeepSeek-V3 on EP 64 over 8 nodes) and shapes
# whose windows straddle a rank boundary.
@pytest.mark.parametrize("experts,topk,blocks", [
    (128, 8, 8), (32, 4, 8), (256, 8, 64), (256, 8, 8), (60, 4, 8), (64, 6, 16),
    (160, 6, 32), (8, 2, 8)])
def test_blocks_hit_matches_the_gate_on_a_microbatch(experts, topk, blocks):
    idx = _gate_indices(4096, topk, experts)  # a 4k-token microbatch on one rank
    assert consecutive_blocks_hit(experts, topk, blocks) == pytest.approx(
        _mean_blocks(idx, experts, blocks), rel=2e-3)


def test_published_layouts_reach_one_rank_or_node():
    qwen = ModelSpec(**model_preset("qwen3_30b_a3b"))
    dsv3 = ModelSpec(**model_preset("deepseek_v3"))
    assert ranks_hit(qwen, 8, consecutive=True) == 1.0
    assert ranks_hit(dsv3, 64, consecutive=True) == 2.0
    assert consecutive_blocks_hit(256, 8, 8) == 1.0  # DeepSeek-V3: one of 8 nodes
    # uniform routing would send each token to several ranks and (group-limited) nodes
    assert ranks_hit(qwen, 8) > 5
    assert expected_domains_hit(256, 8, 8, dsv3.moe_router_num_groups,
                                dsv3.moe_router_group_topk) > 3
