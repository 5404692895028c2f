"""Multirun with the basic sweeper: one projection per combination, illegal ones
recorded with their reason, and summary.csv with a ranked table at the end."""
from __future__ import annotations

import csv
import json

SWEEP = ["-m", "parallel.tp=1,2,4,8", "parallel.pp=1,2,4", "model=llama3_70b",
         "cluster.hardware=h100", "cluster.num_nodes=8"]


def _rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_sweep_writes_summary_and_ranked_table(dirs, run_app):
    cwd, home = dirs
    sweep_dir = cwd.parent / "sweep"
    res = run_app(SWEEP + [f"hydra.sweep.dir={sweep_dir}"], cwd=cwd, home=home)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = _rows(sweep_dir / "summary.csv")
    assert len(rows) == 12
    assert {(r["parallel.tp"], r["parallel.pp"]) for r in rows} == {
        (str(t), str(p)) for t in (1, 2, 4, 8) for p in (1, 2, 4)}
    for r in rows:
        assert r["verdict"] in ("fits", "oom"), r
        assert float(r["tokens_per_s_per_gpu"]) > 0 and float(r["step_time_s"]) > 0
        assert 0 < float(r["mfu"]) < 1 and float(r["peak_memory_gib"]) > 0
        assert "model=llama3_70b" in r["overrides"]
    # ranked: every fitting layout before every one that does not, best first
    verdicts = [r["verdict"] for r in rows]
    assert verdicts == sorted(verdicts, key=lambda v: v != "fits")
    fits = [float(r["tokens_per_s_per_gpu"]) for r in rows if r["verdict"] == "fits"]
    assert fits == sorted(fits, reverse=True)
    assert "ranked by tokens/s/GPU" in res.stdout and "summary.csv" in res.stdout
    # each job's return value is kept beside it
    rec = json.loads((sweep_dir / rows[0]["job"] / "result.json").read_text())
    assert rec["result"]["tokens_per_s_per_gpu"] == float(rows[0]["tokens_per_s_per_gpu"])
    assert not list(cwd.iterdir())  # the sweep dir was given: nothing in cwd


def test_illegal_combinations_are_rows_not_crashes(dirs, run_app):
    cwd, home = dirs
    sweep_dir = cwd.parent / "sweep"
    res = run_app(["-m", "model=llama3_8b", "parallel.tp=2,3", "cluster.num_nodes=1",
                   "train.global_batch_size=64", f"hydra.sweep.dir={sweep_dir}"],
                  cwd=cwd, home=home)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = {r["parallel.tp"]: r for r in _rows(sweep_dir / "summary.csv")}
    assert rows["3"]["verdict"] == "illegal"
    assert "not divisible" in rows["3"]["error"] and "=3" in rows["3"]["error"]
    assert rows["3"]["tokens_per_s_per_gpu"] == ""
    assert rows["2"]["verdict"] in ("fits", "oom") and rows["2"]["rank"] == "1"


def test_default_sweep_dir_is_under_cwd_multirun(dirs, run_app):
    cwd, home = dirs
    res = run_app(["-m", "mode=describe", "model=tiny_dense,tiny_moe"], cwd=cwd, home=home)
    assert res.returncode == 0, res.stderr[-3000:]
    (summary,) = cwd.glob("multirun/*/*/summary.csv")
    assert len(_rows(summary)) == 2
    assert sorted(p.name for p in summary.parent.iterdir()) == [
        "0", "1", "multirun.yaml", "summary.csv"]
    assert not (home / "runs").exists() or not list((home / "runs").iterdir())
