"""trials.png over several GPU kinds: each candidate keeps its GPU and that GPU's capacity."""
from __future__ import annotations

from primus_ext.emit.trials_plot import plot_trials, trial_point

GIB = 2**30


def _rec(hw: str, cap_gib: float, tps, mem_gib: float) -> dict:
    est = {"peak_memory_bytes": mem_gib * GIB, "device_bytes": cap_gib * GIB}
    if tps is not None:
        est["tokens_per_s_per_gpu"] = tps
    return {"kind": "trial", "candidate": {"hardware": hw, "num_nodes": 1},
            "verdict": "ok" if tps is not None else "oom", "estimate": est}


def test_each_point_carries_its_gpu_and_capacity(tmp_path):
    recs = [_rec("mi355x", 288, 2000.0, 150.0), _rec("mi300x", 192, 1500.0, 150.0),
            _rec("mi300x", 192, None, 250.0)]
    pts = [trial_point(r) for r in recs]
    assert [(p["hardware"], round(p["device_gib"])) for p in pts] == [
        ("mi355x", 288), ("mi300x", 192), ("mi300x", 192)]
    assert [p["fits"] for p in pts] == [True, True, False]
    out = plot_trials(recs, tmp_path / "trials.png")
    assert out.stat().st_size > 1000
