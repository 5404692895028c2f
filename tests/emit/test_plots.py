"""Each picture is rendered and checked to be a PNG of sensible size; the inputs are a
simulated schedule (the real simulator), a memory report shaped like MemoryReport and
trial records shaped like the tuner's journal."""
from __future__ import annotations

from types import SimpleNamespace as NS

import pytest

from primus_ext.emit.plots import plot_memory, plot_timeline, plot_trials, trial_point
from primus_ext.project.estimate_types import Estimate
from primus_ext.project.schedule import ScheduleInput, simulate

from png_check import assert_picture

GIB = 2**30


def _estimate(schedule="1f1b", p=4, m=8, v=1, record=True) -> Estimate:
    inp = ScheduleInput.uniform(num_stages=p, num_microbatches=m, fwd_s=0.010 / v,
                                bwd_input_s=0.012 / v, bwd_weight_s=0.008 / v,
                                num_chunks=v, p2p_s=0.0005, schedule=schedule)
    tl = simulate(inp, record_events=record)
    step = tl.step_s + 0.02
    bd = {"compute_s": m * 0.025, "recompute_s": m * 0.002, "tp_comm_s": m * 0.003,
          "cp_comm_s": 0.0, "ep_comm_s": 0.0, "dp_comm_s": 0.012, "optimizer_s": 0.008}
    bd["pp_bubble_s"] = max(step - sum(bd.values()), 0.0)
    mem = NS(peak_bytes=60 * GIB, fits=True, device_bytes=80 * GIB, to_dict=dict)
    return Estimate(step_time_s=step, tokens_per_s_per_gpu=3000.0, tflops_per_gpu=400.0,
                    mfu=0.4, flop_formula="megatron", peak_tflops=989.0, breakdown=bd,
                    critical_stage=0, stage_busy_s=tuple(step - 0.001 * s for s in range(p)),
                    num_microbatches=m, schedule=tl.schedule, layout="even",
                    backend="simulate", memory=mem, timeline=tl)


@pytest.mark.parametrize("schedule,p,m,v", [("1f1b", 4, 8, 1), ("interleaved", 4, 8, 2),
                                            ("zb", 4, 8, 1), ("1f1b", 1, 4, 1)])
def test_timeline_png(tmp_path, schedule, p, m, v):
    path = plot_timeline(_estimate(schedule, p, m, v), tmp_path / "sub" / "tl.png")
    assert_picture(path)
    assert not list(path.parent.glob(".*.tmp"))  # written atomically, nothing left over


def test_timeline_needs_events(tmp_path):
    with pytest.raises(ValueError, match="record_timeline=True"):
        plot_timeline(_estimate(record=False), tmp_path / "tl.png")


def _report(pp: int, device_gib: float = 80):
    stages = []
    for s in range(pp):
        parts = dict(param_bytes=(8 + s) * GIB, grad_bytes=(8 + s) * GIB,
                     optimizer_bytes=6 * GIB, activation_bytes=(40 - 2 * s) * GIB,
                     other_bytes=3 * GIB)
        stages.append(NS(stage=s, total_bytes=sum(parts.values()), **parts))
    return NS(stages=stages, device_bytes=device_gib * GIB,
              peak_bytes=max(x.total_bytes for x in stages))


@pytest.mark.parametrize("pp,device_gib", [(4, 80), (16, 40)])
def test_memory_png(tmp_path, pp, device_gib):
    import primus_ext
    spec = primus_ext.compose(["model=llama3_70b", "cluster.num_nodes=8",
                               f"parallel.pp={pp}", "parallel.tp=4"])
    assert_picture(plot_memory(spec, _report(pp, device_gib), tmp_path / "mem.png"))


def _trials(n=40):
    out = []
    for i in range(n):
        mem = 20 + 2.3 * i
        out.append({"index": i, "verdict": "ok" if mem < 80 else "oom",
                    "candidate": {"tp": 2 ** (i % 4), "pp": 1 + i % 3},
                    "estimate": {"tokens_per_s_per_gpu": 800 + 37.0 * ((i * 7) % 40),
                                 "peak_memory_bytes": mem * GIB, "fits": mem < 80}})
    out.append({"verdict": "illegal", "reason": "tp does not divide heads"})
    return out


def test_trials_png(tmp_path):
    trials = _trials()
    path = plot_trials(trials, tmp_path / "trials.png", winner=trials[5],
                       baseline=trials[0], device_gib=80)
    assert_picture(path)


def test_trials_png_empty(tmp_path):
    assert_picture(plot_trials([], tmp_path / "t.png"), min_kib=5)


def test_trial_point_reads_records_and_objects():
    rec = _trials()[3]
    pt = trial_point(rec)
    assert pt["tps"] == rec["estimate"]["tokens_per_s_per_gpu"]
    assert pt["mem_gib"] == pytest.approx(20 + 2.3 * 3)
    assert "tp=8" in pt["label"]
    obj = NS(metrics={"tokens_per_s_per_gpu": 10.0, "peak_memory_gib": 3.0, "fits": False},
             verdict="oom", candidate={"tp": 1})
    assert trial_point(obj)["fits"] is False
    assert trial_point({"verdict": "illegal"}) is None


def test_trials_png_from_tuner_journal_shapes(tmp_path):
    """Journal records as the tuner writes them: projected ones carry figures in
    ``estimate``; memory-rejected ones only a peak; a baseline that did not fit."""
    recs = []
    for i in range(30):
        recs.append({"kind": "trial", "verdict": "ok", "source": "search",
                     "candidate": {"tp": 2, "pp": 1 + i % 4},
                     "estimate": {"tokens_per_s_per_gpu": 1000 + 50 * i,
                                  "peak_memory_bytes": (30 + 2 * i) * GIB,
                                  "device_bytes": 80 * GIB}})
    for i in range(10):
        recs.append({"kind": "trial", "verdict": "oom", "source": "search",
                     "candidate": {"tp": 1, "pp": 1},
                     "estimate": {"peak_memory_bytes": (85 + 40 * i) * GIB,
                                  "device_bytes": 80 * GIB}})
    assert trial_point(recs[-1])["tps"] is None
    path = plot_trials(recs, tmp_path / "trials.png", winner=recs[29], baseline=recs[-1])
    assert_picture(path)
