"""Sweep summary rows: verdicts, ranking, swept-key columns, CSV round trip."""
from __future__ import annotations

import csv

from primus_ext.emit.sweep_summary import (JobResult, print_summary, summary_rows,
                                           swept_keys, write_summary_csv)

GIB = 2**30


def _est(tps, peak_gib, fits=True):
    return {"step_time_s": 1e6 / tps, "tokens_per_s_per_gpu": tps, "tflops_per_gpu": 300.0,
            "mfu": 0.3, "peak_memory_bytes": peak_gib * GIB, "fits": fits}


JOBS = [
    JobResult(num=0, overrides=("model=m", "parallel.tp=1", "parallel.pp=1"),
              result=_est(1000, 90, fits=False)),
    JobResult(num=1, overrides=("model=m", "parallel.tp=2", "parallel.pp=1"),
              result=_est(1500, 60)),
    JobResult(num=2, overrides=("model=m", "parallel.tp=3", "parallel.pp=1"),
              result={"verdict": "illegal", "error": "heads not divisible by tp=3"}),
    JobResult(num=3, overrides=("model=m", "parallel.tp=4", "parallel.pp=1"),
              result=_est(1400, 40)),
    JobResult(num=4, overrides=("model=m", "parallel.tp=4", "parallel.pp=2"),
              result=RuntimeError("boom")),
]


def test_swept_keys_are_the_varying_ones():
    assert swept_keys(JOBS) == ["parallel.tp", "parallel.pp"]


def test_rank_fits_first_then_oom_then_illegal_and_failed():
    columns, rows = summary_rows(JOBS)
    assert [r["job"] for r in rows] == [1, 3, 0, 2, 4]
    assert [r["verdict"] for r in rows] == ["fits", "fits", "oom", "illegal", "failed"]
    assert [r["rank"] for r in rows] == [1, 2, 3, 4, 5]
    assert columns[:5] == ["rank", "job", "overrides", "parallel.tp", "parallel.pp"]
    assert rows[0]["peak_memory_gib"] == 60
    assert rows[4]["error"] == "RuntimeError: boom"


def test_csv_round_trip(tmp_path):
    path = write_summary_csv(JOBS, tmp_path / "summary.csv")
    with open(path) as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(JOBS)
    assert rows[0]["overrides"] == "model=m parallel.tp=2 parallel.pp=1"
    assert rows[0]["parallel.tp"] == "2" and float(rows[0]["tokens_per_s_per_gpu"]) == 1500
    illegal = next(r for r in rows if r["verdict"] == "illegal")
    assert illegal["tokens_per_s_per_gpu"] == "" and "tp=3" in illegal["error"]


def test_extra_columns_and_table(capsys):
    jobs = [JobResult(num=0, overrides=("parallel.tp=2",), result=_est(1500, 60),
                      extra={"projected_tokens_per_s_per_gpu": 1510.0}),
            JobResult(num=1, overrides=("parallel.tp=4",), result=_est(1400, 40),
                      extra={"projected_tokens_per_s_per_gpu": 1390.0})]
    columns, _ = summary_rows(jobs)
    assert columns[-1] == "projected_tokens_per_s_per_gpu"
    print_summary(jobs, "t", caption="c")
    out = capsys.readouterr().out
    assert "projected_tokens_per_s_per_gpu" in out and "1,510" in out
