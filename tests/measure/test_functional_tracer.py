"""The functional-collective dispatch mode records ``_c10d_functional`` ops (what DTensor
tensor parallelism issues) with their bytes, group and the time to their wait, in a real
one-process gloo group."""
from __future__ import annotations

import socket

import pytest

torch = pytest.importorskip("torch")


@pytest.fixture()
def group(monkeypatch):
    import torch.distributed as dist
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for k, v in dict(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0",
                     WORLD_SIZE="1").items():
        monkeypatch.setenv(k, v)
    dist.init_process_group("gloo")
    yield dist.group.WORLD
    dist.destroy_process_group()


def test_functional_collectives_are_recorded(group):
    import torch.distributed._functional_collectives as funcol

    from primus_ext.measure.functional_tracer import FunctionalCollectiveMode
    from primus_ext.measure.tracer import CollectiveTracer
    tracer = CollectiveTracer()
    tracer.register_axes({"tp": group})
    tracer.scope_fn = lambda: ("layer.0", "fwd")
    x = torch.ones(64, 32, dtype=torch.bfloat16)
    with FunctionalCollectiveMode(tracer):
        float(funcol.all_reduce(x, "sum", group).sum())  # not recorded: tracer disabled
        tracer.enabled = True
        y = funcol.all_gather_tensor(x, 0, group)
        z = funcol.reduce_scatter_tensor(y, "sum", 0, group)
        float(z.sum())  # forces the waits
        tracer.enabled = False
    kinds = [(r.op, r.collective, r.axis, r.scope, r.phase) for r in tracer.records]
    assert kinds == [
        ("_c10d_functional.all_gather_into_tensor", "all_gather", "tp", "layer.0", "fwd"),
        ("_c10d_functional.reduce_scatter_tensor", "reduce_scatter", "tp", "layer.0", "fwd")]
    ag, rs = tracer.records
    assert ag.in_bytes == ag.out_bytes == 64 * 32 * 2  # group of one: output = input
    assert rs.in_bytes == 64 * 32 * 2 and ag.dtype == "bfloat16"
    assert ag.group_ranks == (0,) and all(r.seconds > 0 for r in tracer.records)
