"""Fine-grained activation offloading's time (compute/offload_time.py) against megatron-
core's own schedule and Megatron-LM's GPU-measured functional tests.

megatron-core core_v0.16.1 ``pipeline_parallel/fine_grained_activation_offload.py``
issues a group's reload when the backward of the group after it ends and makes the
compute stream wait for it before the group's backward: the reload cannot hide behind
the backward. The forward's copies run on their own stream beside the compute."""
from dataclasses import replace

import pytest

from primus_ext.compute.offload_time import copy_gbps, offload_op
from primus_ext.project.calibration import load_calibration
from primus_ext.project.estimate import project
from primus_ext.published.golden import read_golden


@pytest.fixture(scope="module")
def offloading():
    cases = [c for c in read_golden(timed_only=True)
             if c.spec is not None and c.spec.train.offload_modules]
    assert len(cases) >= 2, "Megatron-LM's CI has two fine-grained offloading cases"
    return cases


def test_reload_is_exposed_whole_and_the_offload_hides_behind_the_forward(offloading):
    spec = offloading[0].spec
    quick = offload_op(spec, True, 0.0, 0.0)
    slow = offload_op(spec, True, 1.0, 1.0)
    copy_s = quick.fwd_bytes / (copy_gbps(spec) * 1e9)
    assert quick.fwd_s == pytest.approx(copy_s) and quick.dgrad_s == pytest.approx(copy_s)
    assert slow.fwd_s == 0.0 and slow.dgrad_s == pytest.approx(copy_s)


def test_the_node_shares_its_host_memory(offloading):
    spec = offloading[0].spec
    hw = spec.cluster.hardware
    assert copy_gbps(spec) == pytest.approx(
        min(hw.host_link_gbps, hw.host_mem_gbps / (2 * spec.cluster.node_size)))
    wide = replace(spec, cluster=replace(spec.cluster, hardware=replace(hw, host_mem_gbps=None)))
    assert copy_gbps(wide) == hw.host_link_gbps


def test_offloading_cases_land_near_the_measured_iteration(offloading):
    """Megatron-LM's CI logged 1.88 s and 1.94 s (now -28 % and -30 %; the golden bound
    is 35 %). Before the reloads were put on the critical path the projection said
    0.88 s (-54 %)."""
    calib = load_calibration("default")
    for c in offloading:
        step = project(c.spec, calibration=calib).step_time_s
        assert abs(step / c.iteration_time_s - 1.0) <= 0.35, (c.case, step)
        plain = replace(c.spec, train=replace(c.spec.train, offload_modules=()))
        assert step > 2 * project(plain, calibration=calib).step_time_s
