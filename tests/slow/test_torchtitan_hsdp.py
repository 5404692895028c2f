"""HSDP's replica all-reduce as the simulate model costs it (``project/torchtitan.py``,
``replica_all_reduce_s``) against what torch's FSDP2 issues in a real HSDP run of
torchtitan's llama3 debugmodel (4 processes, gloo, ``tests/slow/torchtitan_hsdp_worker.py``):
per microbatch, one all-reduce per FSDP unit over the ``dp_replicate`` ranks, of the
unit's fp32 reduce-scattered gradient shard."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("torchtitan")

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def test_fsdp2_all_reduces_each_unit_shard_every_microbatch(tmp_path):
    out = tmp_path / "ar.json"
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc-per-node=4", str(ROOT / "tests" / "slow" /
                                                   "torchtitan_hsdp_worker.py"), str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=900,
                         env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, res.stderr[-4000:]
    per_mb = json.loads(out.read_text())
    import primus_ext
    from primus_ext.memory.torchtitan import fsdp_units
    spec = primus_ext.compose([
        "framework=torchtitan", "model=llama3_debugmodel", "cluster.hardware=cpu",
        "cluster.num_nodes=1", "cluster.gpus_per_node=4", "parallel.dp_shard=2",
        "parallel.dp_replicate=2", "train.seq_length=32", "train.micro_batch_size=1",
        "train.global_batch_size=8"])
    expect = sorted(-(-(d + e) // 2) for d, e in fsdp_units(spec, 0))
    assert spec.num_microbatches == len(per_mb) == 2
    for calls in per_mb:  # every microbatch syncs (no PP)
        assert {(g, dt) for g, dt, _ in calls} == {(2, "torch.float32")}
        assert sorted(n for _, _, n in calls) == expect
    # The time model all-reduces exactly these fp32 shards over the 2 replicas, per
    # microbatch.
    import primus_ext.project.torchtitan as tt
    seen = []
    real = tt.collective_s

    def recording(hw, span, coll, nbytes):
        seen.append((span.size, coll, nbytes))
        return real(hw, span, coll, nbytes)

    tt.collective_s = recording
    try:
        secs, exposed = tt.replica_all_reduce_s(spec, (0.0,))
    finally:
        tt.collective_s = real
    assert sorted(seen) == sorted((2, "all_reduce", 4 * n) for n in expect)
    one = sum(real(spec.cluster.hardware, _span_of(spec), "all_reduce", 4 * n)
              for n in expect)
    assert secs[0] == pytest.approx(2 * one) and exposed[0] == pytest.approx(secs[0])


def _span_of(spec):
    from primus_ext.comm.groups import _span, domain_size
    c = spec.cluster
    return _span((("tp", 1), ("cp", 1), ("dp_shard", 2), ("dp_replicate", 2), ("pp", 1)),
                 ("dp_replicate",), c.node_size, domain_size(c), "dp_replicate")
