"""memory_report: API, JSON shape, totals, never raising, speed-critical caching."""
from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from memory_specs import LLAMA, MOE, preset, run
from primus_ext.memory.options import MemoryOptions
from primus_ext.memory.report import STAGE_KEYS, memory_report


def test_to_dict_has_exactly_the_documented_keys():
    d = memory_report(run(LLAMA, pp=2, gbs=64)).to_dict()
    assert set(d) == {"stages", "peak_bytes", "device_bytes", "fits"}
    assert [set(s) for s in d["stages"]] == [set(STAGE_KEYS)] * 2


def test_totals_add_up_and_are_python_ints():
    rep = memory_report(run(MOE, pp=2, ep=2, gbs=64))
    for s in rep.stages:
        parts = (s.param_bytes, s.grad_bytes, s.optimizer_bytes, s.activation_bytes,
                 s.other_bytes)
        assert s.total_bytes == sum(parts)
        assert all(type(v) is int for v in parts + (s.total_bytes, s.num_params))
        assert s.activation_bytes >= s.activation_bytes_per_microbatch * 0
    assert rep.peak_bytes == max(s.total_bytes for s in rep.stages)
    assert rep.stages[rep.worst_stage].total_bytes == rep.peak_bytes


def test_huge_config_does_not_raise_and_does_not_fit():
    ds = preset("deepseek_v3")
    rep = memory_report(run(ds, nodes=1, gpus=8, seq=32768, mbs=4, gbs=32))
    assert rep.fits is False and rep.peak_bytes > rep.device_bytes
    assert rep.peak_bytes > 2 ** 40  # > 1 TiB, Python ints do not overflow


def test_margin_decides_fits():
    spec = run(LLAMA)
    peak = memory_report(spec).peak_bytes
    hw = replace(spec.cluster.hardware, hbm_bytes=int(peak * 1.03))
    spec = replace(spec, cluster=replace(spec.cluster, hardware=hw))
    assert memory_report(spec, MemoryOptions(margin_fraction=0.02)).fits
    assert not memory_report(spec, MemoryOptions(margin_fraction=0.05)).fits


def test_deepseek_v3_pp16_ep64_on_128_nodes():
    ds = preset("deepseek_v3")
    spec = run(ds, nodes=128, pp=16, ep=64, seq=4096, gbs=8192, backend="flash",
               recompute_granularity="full", recompute_method="uniform",
               recompute_num_layers=1)
    rep = memory_report(spec)
    assert len(rep.stages) == 16
    first = rep.stages[0]
    assert first.num_inflight_microbatches == 16 and rep.stages[-1].num_inflight_microbatches == 1
    # MTP and the output layer make the last stage the heaviest in parameters
    assert rep.stages[-1].num_params == max(s.num_params for s in rep.stages)
    assert rep.stages[-1].num_expert_params > 0


def test_interleaving_reports_chunk_counts():
    rep = memory_report(run(replace(LLAMA, num_layers=8), pp=4, vpp=2, gbs=64))
    s0 = rep.stages[0]
    assert sum(s0.inflight_per_chunk) == (4 - 1) * 2 + (2 - 1) * 4 + 1
    assert s0.num_inflight_microbatches == -(-sum(s0.inflight_per_chunk) // 2)


def test_options_are_validated():
    import pytest
    with pytest.raises(ValueError, match="margin_fraction"):
        MemoryOptions(margin_fraction=1.5)


def test_other_bytes_are_named():
    s = memory_report(run(LLAMA, tp=2, sequence_parallel=True)).stages[0]
    names = dict(s.other)
    assert set(names) == {"cuda_context", "cublas_workspaces", "te_workspaces",
                          "dummy_wgrads", "nccl", "global_memory_buffer", "fragmentation"}
    assert sum(names.values()) == s.other_bytes


def test_allocated_peak_is_the_device_peak_less_the_terms_outside_the_allocator():
    s = memory_report(run(LLAMA, tp=2, sequence_parallel=True)).stages[0]
    other = dict(s.other)
    outside = other["cuda_context"] + other["nccl"] + other["fragmentation"]
    assert outside > 0 and s.allocated_peak_bytes == s.total_bytes - outside
    d = s.to_dict()
    assert d["allocated_peak_bytes"] == s.allocated_peak_bytes
    assert d["other"] == other and d["total_bytes"] == s.total_bytes


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([1, 2, 4]), st.sampled_from([1, 2, 4]),
       st.sampled_from([None, "selective", "full"]))
def test_recompute_never_increases_peak(tp, pp, granularity):
    kw = dict(tp=tp, pp=pp, sequence_parallel=tp > 1, gbs=64, nodes=2)
    base = memory_report(run(LLAMA, **kw)).stages[0].activation_bytes
    extra = {} if granularity != "full" else dict(recompute_method="uniform",
                                                   recompute_num_layers=1)
    rc = memory_report(run(LLAMA, recompute_granularity=granularity, **extra, **kw))
    assert rc.stages[0].activation_bytes <= base
