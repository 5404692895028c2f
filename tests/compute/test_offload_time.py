"""Fine-grained activation offloading's time (compute/offload_time.py) against megatron-
core's own schedule and Megatron-LM's GPU-measured functional tests.

megatron-core core_v0.16.1 ``pipeline_parallel/fine_grained_activation_offload.py``
issues a group's reload when the backward of the group after it ends and makes the
compute stream wait for it before the group's backward: the reload cannot hide behind
the backward. The forward's copies run on their own stream beside the compute. Its
saved-tensor hook tags every save afresh, so the unfused attention's probabilities, saved
by the softmax and by the PV bmm (Transformer Engine ``UnfusedDotProductAttention``), are
copied twice."""
from dataclasses import replace

import pytest

from primus_ext.compute.offload_time import offload_op, saves
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
    copy_s = quick.fwd_bytes / (spec.cluster.hardware.host_link_gbps * 1e9)
    assert quick.fwd_s == pytest.approx(copy_s) and quick.dgrad_s == pytest.approx(copy_s)
    assert slow.fwd_s == 0.0 and slow.dgrad_s == pytest.approx(copy_s)


def test_a_tensor_two_ops_save_is_copied_twice():
    probs = ("softmax.output", 100)
    assert saves([probs, ("q", 1)]) == [probs, ("q", 1), probs]
    # A dropout output or a cast back is what the bmm saves then: no second copy.
    for other in ("attn_dropout.output", "softmax.cast"):
        assert saves([probs, (other, 50)]) == [probs, (other, 50)]


def test_the_offloading_cases_copy_the_probabilities_twice(offloading):
    spec = offloading[0].spec  # unfused attention, no dropout, bf16 scores
    assert spec.train.attention_backend == "unfused" and spec.model.attention_dropout == 0
    op = offload_op(spec, True, 0.0, 0.0)
    from primus_ext.memory.activations import layer_items
    from primus_ext.memory.options import DEFAULT_OPTIONS
    from primus_ext.memory.report import resolved_train
    probs = dict(layer_items(spec.model, spec.parallel, resolved_train(spec), True,
                             DEFAULT_OPTIONS))["softmax.output"]
    assert op.fwd_bytes > 2 * probs


def test_offloading_cases_land_near_the_measured_iteration(offloading):
    """Megatron-LM's CI logged 1.88 s and 1.94 s (now -10 % and -12 %). With the reloads
    hidden behind the backward and each save copied once the projection said 0.88 s
    (-54 %)."""
    calib = load_calibration("default")
    for c in offloading:
        step = project(c.spec, calibration=calib).step_time_s
        assert abs(step / c.iteration_time_s - 1.0) <= 0.15, (c.case, step)
        plain = replace(c.spec, train=replace(c.spec.train, offload_modules=()))
        assert step > 2 * project(plain, calibration=calib).step_time_s
