"""The collective tracer: bytes as torch sees them, async ops, coalescing, groups."""
from __future__ import annotations

import socket

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from primus_ext.measure.tracer import CollectiveTracer  # noqa: E402


@pytest.fixture()
def tracer():
    if dist.is_initialized():
        pytest.skip("a process group already exists in this process")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                            world_size=1)
    t = CollectiveTracer()
    t.install()
    t.register_axes({"tp": dist.new_group([0])})
    t.enabled = True
    yield t
    t.uninstall()
    dist.destroy_process_group()


def test_bytes_follow_the_comm_model_convention(tracer):
    x = torch.ones(256, dtype=torch.bfloat16)
    dist.all_reduce(x)
    out = torch.empty(256, dtype=torch.bfloat16)
    dist.all_gather_into_tensor(out, x)
    dist.reduce_scatter_tensor(out, x)
    dist.all_to_all_single(out, x)
    ops = {r.op: r for r in tracer.records}
    assert ops["all_reduce"].in_bytes == 512 and ops["all_reduce"].axis == "world"
    assert ops["all_gather_into_tensor"].out_bytes == 512
    assert ops["reduce_scatter_tensor"].in_bytes == 512
    assert ops["all_to_all_single"].collective == "all_to_all"
    assert all(r.dtype == "bfloat16" for r in tracer.records)


def test_async_ops_are_timed_at_wait_and_coalesced_ones_recorded(tracer):
    x = torch.ones(64)
    work = dist.all_reduce(x, async_op=True)
    work.wait()
    with dist._coalescing_manager(None, async_ops=True) as cm:
        dist.all_reduce(x, async_op=True)
    cm.wait()
    assert [r.op for r in tracer.records] == ["all_reduce", "all_reduce"]
    assert all(r.async_op for r in tracer.records)


def test_scope_and_axis_by_group_identity(tracer):
    tp = dist.new_group([0])
    tracer.register_axes({"ep": tp})
    tracer.scope_fn = lambda: ("layer.3.mlp", "fwd")
    dist.all_reduce(torch.ones(4), group=tp)
    r = tracer.records[-1]
    assert (r.axis, r.scope, r.phase, r.group_size) == ("ep", "layer.3.mlp", "fwd", 1)


def test_disabled_tracer_records_nothing(tracer):
    tracer.enabled = False
    dist.all_reduce(torch.ones(4))
    assert tracer.records == []


def test_size_classes_split_tokens_from_routing_weights():
    from primus_ext.measure.aggregate import _size_classes
    sizes = [262144, 250000, 270000, 1024, 990, 1100]
    assert _size_classes(sizes) == [(990, 1100), (250000, 270000)]
    assert _size_classes([5, 6, 7]) == [(5, 7)]


def test_blocked_time_leaves_out_the_work_between_issue_and_wait(tracer):
    import time
    x = torch.ones(64)
    dist.all_reduce(x)
    work = dist.all_reduce(x, async_op=True)
    time.sleep(0.05)  # what megatron-core overlaps with the call: a GEMM
    work.wait()
    sync, overlapped = tracer.records
    assert sync.blocked_s == sync.seconds
    assert overlapped.seconds - overlapped.blocked_s >= 0.05


def test_layer_collective_seconds_are_the_mean_blocked_time():
    from primus_ext.measure.aggregate import _collectives
    from primus_ext.measure.tracer import CollectiveRecord
    import importlib.util
    import pathlib
    where = importlib.util.spec_from_file_location(
        "measure_specs", pathlib.Path(__file__).with_name("specs.py"))
    S = importlib.util.module_from_spec(where)
    where.loader.exec_module(S)
    spec = S.run(S.tiny(), hw="cpu", gpn=2, tp=2, sequence_parallel=True)

    def rec(secs, blocked, async_op):
        return CollectiveRecord(op="all_gather_into_tensor", collective="all_gather",
                                in_bytes=64, out_bytes=128, group_ranks=(0, 1), axis="tp",
                                seconds=secs, scope="layer.0", phase="bwd",
                                async_op=async_op, blocked_s=blocked)
    records = [rec(0.004, 0.001, True), rec(0.002, 0.002, False), rec(0.009, 0.009, False)]
    seen, comm_s = _collectives(spec, records, {"dense": 1}, samples=1, steps=1)
    assert comm_s["dense"]["tp"]["bwd"] == pytest.approx(0.012)
    (ag,) = seen
    assert ag.count == 3 and ag.seconds == pytest.approx(0.004)
    assert ag.blocked_s == pytest.approx(0.004)
