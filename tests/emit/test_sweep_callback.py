"""The sweep-summary callback: jobs collected in-process, or read back from each job's
result.json when a launcher ran them elsewhere (their on_job_end ran there)."""
from __future__ import annotations

import csv

from hydra.core.utils import JobReturn, JobStatus
from hydra.types import RunMode
from omegaconf import OmegaConf

from primus_ext.emit.sweep_callback import SweepSummaryCallback, job_value


def _cfg(sweep_dir, num=0, mode=RunMode.MULTIRUN, target="x.BasicSweeper"):
    return OmegaConf.create({
        "output": "table",
        "hydra": {"mode": mode, "sweep": {"dir": str(sweep_dir)}, "job": {"num": num},
                  "runtime": {"output_dir": str(sweep_dir / str(num))},
                  "sweeper": {"_target_": target}}})


def _ret(value, tp, status=JobStatus.COMPLETED):
    r = JobReturn()
    r.overrides = [f"parallel.tp={tp}"]
    r.status, r.return_value = status, value
    return r


def _est(tps):
    return {"tokens_per_s_per_gpu": tps, "step_time_s": 1.0, "mfu": 0.4,
            "peak_memory_bytes": 2**30, "fits": True}


def test_remote_jobs_are_read_back_from_result_json(tmp_path, capsys):
    remote = SweepSummaryCallback()  # the callbacks of the processes that ran the jobs
    for num, (value, tp) in enumerate([(_est(10.0), 1), (_est(20.0), 2)]):
        remote.on_job_end(_cfg(tmp_path, num), _ret(value, tp))
    local = SweepSummaryCallback()  # the sweep's own process saw no on_job_end
    local.on_multirun_end(_cfg(tmp_path))
    with open(tmp_path / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["parallel.tp"] for r in rows] == ["2", "1"]
    assert "ranked by tokens/s/GPU" in capsys.readouterr().out


def test_failed_job_is_a_row(tmp_path):
    cb = SweepSummaryCallback()
    cb.on_multirun_start(_cfg(tmp_path))
    cb.on_job_end(_cfg(tmp_path, 0), _ret(_est(10.0), 1))
    cb.on_job_end(_cfg(tmp_path, 1), _ret(RuntimeError("boom"), 2, JobStatus.FAILED))
    cb.on_multirun_end(_cfg(tmp_path))
    with open(tmp_path / "summary.csv") as f:
        rows = {r["parallel.tp"]: r for r in csv.DictReader(f)}
    assert rows["2"]["verdict"] == "failed" and "boom" in rows["2"]["error"]
    assert job_value(_ret(_est(1.0), 1)) == _est(1.0)


def test_single_runs_and_the_tuner_sweeper_are_left_alone(tmp_path):
    cb = SweepSummaryCallback()
    cb.on_job_end(_cfg(tmp_path, 0, mode=RunMode.RUN), _ret(_est(10.0), 1))
    assert cb.jobs == [] and not (tmp_path / "0").exists()
    cb.on_job_end(_cfg(tmp_path, 0), _ret(_est(10.0), 1))
    cb.on_multirun_end(_cfg(tmp_path, target="hydra_plugins.primus_ext_tuner.x.S"))
    assert not (tmp_path / "summary.csv").exists()  # the sweeper writes its own
