"""Megatron-LM's --check-weight-hash-across-dp-replicas-interval (project/weight_hash.py):
read from the golden Muon case's own launch line (Megatron-LM functional test
gpt3_moe_mcore_te_ep8_resume_torch_dist_muon sets it to 1), its host time against the
parameters the rank holds, and the emitted line carrying it."""
from __future__ import annotations

import dataclasses

import pytest

from primus_ext.memory.rank_params import stage_params
from primus_ext.project.host_step import step_host
from primus_ext.project.weight_hash import reference_hash, weight_hash_s


@pytest.fixture(scope="module")
def spec():
    from primus_ext.published.golden import as_runs, read_golden
    return next(r.spec for r in as_runs(read_golden())
                if r.run_id == "gpt3_moe_mcore_te_ep8_resume_torch_dist_muon")


def test_the_golden_line_sets_it(spec):
    assert spec.train.check_weight_hash_interval == 1


def test_host_time_follows_the_parameters_hashed(spec):
    hw = spec.cluster.hardware
    s = weight_hash_s(spec, 0)
    per_tensor, per_element = reference_hash()
    n = stage_params(spec.model, spec.parallel, 0).num_params
    # At least the SHA-1 of every element held over host_speed, plus the BF16 copy.
    floor = n * per_element / hw.host_speed + 2 * n / (hw.host_link_gbps * 1e9)
    assert floor < s < floor * 1.2
    every10 = dataclasses.replace(spec, train=dataclasses.replace(
        spec.train, check_weight_hash_interval=10))
    assert weight_hash_s(every10, 0) == pytest.approx(s / 10)
    off = dataclasses.replace(spec, train=dataclasses.replace(
        spec.train, check_weight_hash_interval=None))
    assert weight_hash_s(off, 0) == 0.0
    assert step_host(spec, 0).other_s - step_host(off, 0).other_s == pytest.approx(s)


def test_bad_interval_is_refused(spec):
    with pytest.raises(ValueError, match="check_weight_hash_interval"):
        dataclasses.replace(spec.train, check_weight_hash_interval=0)


def test_emitted_line_carries_it(spec):
    from primus_ext.frameworks.megatron.flags import megatron_argv
    argv = megatron_argv(spec)
    i = argv.index("--check-weight-hash-across-dp-replicas-interval")
    assert str(argv[i + 1]) == "1"
