"""Group spans from the rank order, node size and scale-up domain."""
from __future__ import annotations

import pytest

from primus_ext.comm.groups import domain_size, group_span, pp_boundary_crosses_domain
from primus_ext.presets import hardware_preset
from primus_ext.spec import ClusterSpec, ModelSpec, ParallelSpec, RunSpec, TrainSpec

MOE = ModelSpec(name="moe", num_layers=16, hidden_size=4096, num_attention_heads=32,
                num_query_groups=8, num_moe_experts=64, moe_router_topk=4)


def spec(hw="h100", nodes=4, gpn=None, model=MOE, gbs=4096, **par) -> RunSpec:
    return RunSpec(model=model, parallel=ParallelSpec(**par),
                   train=TrainSpec(global_batch_size=gbs),
                   cluster=ClusterSpec(hardware=hardware_preset(hw), num_nodes=nodes,
                                       gpus_per_node=gpn))


def test_tp8_stays_in_node_and_dp_crosses_nodes():
    s = spec(tp=8, sequence_parallel=True, nodes=4)
    tp = group_span(s, "tp")
    assert (tp.size, tp.num_nodes, tp.num_domains, tp.ranks_per_domain) == (8, 1, 1, 8)
    dp = group_span(s, "dp")
    assert (dp.size, dp.num_nodes, dp.ranks_per_node) == (4, 4, 1)


def test_order_changes_which_axis_is_contiguous():
    s = spec(tp=2, sequence_parallel=True, nodes=2, order="tp-dp-cp-ep-pp", cp=2)
    assert group_span(s, "dp").num_nodes == 1  # stride 2: ranks 0,2,4,6
    assert group_span(s, "cp").num_nodes == 2  # stride 2*4 = 8
    default = spec(tp=2, sequence_parallel=True, nodes=2, cp=2)
    assert group_span(default, "cp").num_nodes == 1
    assert group_span(default, "dp").num_nodes == 2


def test_dp_cp_group_is_the_gradient_group():
    s = spec(tp=4, cp=2, sequence_parallel=True, nodes=4)
    g = group_span(s, "dp_cp")
    assert g.size == s.dp * 2 and g.num_nodes == 4 and g.ranks_per_node == 2


def test_expert_groups_use_the_expert_layout():
    s = spec(tp=2, ep=8, etp=1, sequence_parallel=True, nodes=4)
    ep = group_span(s, "ep")
    assert (ep.size, ep.num_nodes) == (8, 1)  # etp=1: ep ranks are contiguous
    edp = group_span(s, "edp")
    assert edp.size == s.expert_dp == 4 and edp.num_nodes == 4
    assert group_span(s, "etp").size == 1
    wide = spec(tp=1, ep=32, nodes=4)
    ep = group_span(wide, "ep")
    assert (ep.num_domains, ep.ranks_per_domain) == (4, 8)


def test_gb200_nvl72_keeps_a_16_rank_group_in_the_domain():
    s = spec("gb200", nodes=36, gbs=4608, tp=4, ep=16, etp=1, sequence_parallel=True)
    assert domain_size(s.cluster) == 72
    ep = group_span(s, "ep")
    assert ep.size == 16 and ep.num_nodes == 4 and ep.num_domains == 1
    tp16 = group_span(spec("gb200", nodes=36, gbs=4608, tp=16, sequence_parallel=True,
                           model=ModelSpec(name="d", num_layers=4, hidden_size=4096,
                                           num_attention_heads=32, num_query_groups=16)),
                      "tp")
    assert tp16.num_nodes == 4 and tp16.intra_domain


def test_small_nodes_shrink_the_domain():
    assert domain_size(spec(nodes=8, gpn=4).cluster) == 4
    assert domain_size(spec("mi300x", nodes=2).cluster) == 8


@pytest.mark.parametrize("tp,pp,nodes,expected", [(8, 4, 4, (True, True, True)),
                                                  (2, 4, 1, (False, False, False)),
                                                  (4, 4, 2, (False, True, False))])
def test_pp_boundaries(tp, pp, nodes, expected):
    model = ModelSpec(name="d", num_layers=8, hidden_size=1024, num_attention_heads=8)
    s = RunSpec(model=model, parallel=ParallelSpec(tp=tp, pp=pp),
                train=TrainSpec(global_batch_size=1024),
                cluster=ClusterSpec(hardware=hardware_preset("h100"), num_nodes=nodes))
    assert pp_boundary_crosses_domain(s) == expected


def test_unknown_axis_is_a_clear_error():
    with pytest.raises(ValueError, match="group axis 'xx'"):
        group_span(spec(), "xx")
