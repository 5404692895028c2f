"""The downscaler keeps every rank's shapes and fits the local devices."""
from __future__ import annotations

import importlib.util
import pathlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from primus_ext.measure.downscale import downscale, layer_counts
from primus_ext.project.profile import rank_shapes
from primus_ext.presets.overrides import apply_overrides, spec_overrides

_spec = importlib.util.spec_from_file_location(
    "measure_specs", pathlib.Path(__file__).with_name("specs.py"))
S = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(S)


def _same_except(a: dict, b: dict, keys: set) -> bool:
    return all(a[k] == b[k] for k in a if k not in keys)


def test_llama70b_tp8_pp4_on_two_devices_keeps_rank_shapes():
    target = S.run(S.llama70b(), nodes=8, tp=8, pp=4, sequence_parallel=True)
    d = downscale(target, 2, "cpu")
    p = d.spec.parallel
    assert (p.tp, p.pp, p.ep, d.world_size) == (2, 1, 1, 2)
    assert d.spec.model.num_layers == 2
    assert d.spec.cluster.hardware.name == "cpu"
    # Same heads, groups, FFN and vocab per rank; only the SP token count differs.
    assert _same_except(rank_shapes(target), rank_shapes(d.spec), {"sp_tokens"})
    assert rank_shapes(d.spec)["sp_tokens"] == 4096 // 2
    assert any(r.startswith("sp_tokens") for r in d.rules)
    assert any(r.startswith("pp:") for r in d.rules)


def test_single_device_drops_sp():
    target = S.run(S.llama70b(), nodes=8, tp=8, sequence_parallel=True)
    d = downscale(target, 1, "cpu")
    assert d.spec.parallel.tp == 1 and not d.spec.parallel.sequence_parallel
    assert _same_except(rank_shapes(target), rank_shapes(d.spec), {"sp_tokens"})


def test_moe_keeps_experts_per_rank_and_layer_kinds():
    target = S.run(S.mixtral(moe_first_k_dense=1), nodes=4, ep=8, tp=2,
                   sequence_parallel=True)
    d = downscale(target, 2, "cpu")
    m, p = d.spec.model, d.spec.parallel
    assert p.ep * p.expert_tp <= 2 and p.expert_tp == 2  # expert TP = TP, as in the target
    # One expert per rank in the target; top-2 routing needs a real choice here.
    assert m.num_moe_experts // p.ep == 4
    assert any(r.startswith("experts_topk") for r in d.rules)
    dense, moe = layer_counts(d.spec)
    assert dense == 1 and moe == 2


def test_moe_expert_parallel_measured_when_it_fits():
    target = S.run(S.mixtral(num_moe_experts=16), nodes=2, ep=8, etp=1)
    d = downscale(target, 2, "cpu")
    assert (d.spec.parallel.ep, d.spec.parallel.expert_tp) == (2, 1)
    assert rank_shapes(d.spec)["experts"] == rank_shapes(target)["experts"] == 2


def test_experts_raised_above_topk():
    target = S.run(S.mixtral(num_moe_experts=64, moe_router_topk=8), nodes=8, ep=64)
    d = downscale(target, 1, "cpu")
    assert d.spec.model.num_moe_experts == 16
    assert any(r.startswith("experts_topk") for r in d.rules)
    # Two experts per rank, top-2 of four in the target: four measured, not two.
    target = S.run(S.mixtral(num_moe_experts=4), hw="cpu", gpn=2, ep=2,
                   train={"seq_length": 256, "global_batch_size": 16})
    assert downscale(target, 1, "cpu").spec.model.num_moe_experts == 4


@pytest.mark.parametrize("modules,kept", [(("moe_act", "layernorm"), ("layernorm",)),
                                           (("moe_act",), None)])
def test_moe_act_recompute_left_out_of_the_sequential_experts(modules, kept):
    """ModelZoo's Qwen3-30B line recomputes moe_act; megatron-core's TransformerConfig
    refuses it without a grouped GEMM, which the measured (SequentialMLP) model lacks."""
    from primus_ext.frameworks.megatron.model import transformer_config
    target = S.run(S.mixtral(num_moe_experts=16), nodes=2, ep=8,
                   train={"recompute_granularity": "selective",
                          "recompute_modules": modules})
    d = downscale(target, 1, "cpu")
    t = d.spec.train
    assert any(r.startswith("recompute_moe_act") for r in d.rules)
    if kept is None:
        assert t.recompute_granularity is None
    else:
        assert (t.recompute_granularity, t.recompute_modules) == ("selective", kept)
    with pytest.raises(ValueError, match="moe_act"):
        transformer_config(target)
    assert transformer_config(d.spec).recompute_modules == list(kept or ["core_attn"])


def test_overrides_rebuild_the_downscaled_spec_from_any_base():
    target = S.run(S.llama70b(), nodes=8, tp=8, pp=4, sequence_parallel=True)
    d = downscale(target, 2, "cpu")
    other = S.run(S.tiny(), hw="cpu", gpn=2)
    assert apply_overrides(other, spec_overrides(target) + list(d.overrides)) == d.spec


def test_spec_overrides_round_trip_through_compose():
    from primus_ext import compose
    target = S.run(S.mixtral(), nodes=4, ep=8, tp=2, sequence_parallel=True,
                   train={"recompute_granularity": "selective"})
    assert compose(spec_overrides(target)) == target


@settings(max_examples=30, deadline=None)
@given(tp=st.sampled_from([1, 2, 4, 8]), pp=st.sampled_from([1, 2, 4]),
       local=st.sampled_from([1, 2, 4, 8]))
def test_downscaled_world_fits_the_local_devices(tp, pp, local):
    target = S.run(S.llama70b(), nodes=8, tp=tp, pp=pp, sequence_parallel=tp > 1)
    d = downscale(target, local, "cpu")
    assert d.world_size <= local
    assert d.spec.parallel.pp == 1
    assert rank_shapes(d.spec)["heads"] == rank_shapes(target)["heads"]
    assert rank_shapes(d.spec)["ffn"] == rank_shapes(target)["ffn"]


def test_rejects_no_devices():
    with pytest.raises(ValueError, match="local_world"):
        downscale(S.run(S.tiny(), hw="cpu"), 0, "cpu")
