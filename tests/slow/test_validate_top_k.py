"""hydra.sweeper.validate_top_k=2 trains for real: the top two candidates of a tiny
Llama-style model on this CPU (cluster.hardware=cpu: 2 processes, gloo, one thread each)
go through Hydra's submitit_local launcher as jobs that run their recipe's own Megatron-LM
line for 4 iterations (mode=train); their measured iteration times stand beside the
projections, with the error, in the table, optimization_results.yaml and summary.csv."""
from __future__ import annotations

import csv
import importlib.util
import os
import subprocess
import sys

import pytest
import yaml

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("hydra_plugins.hydra_submitit_launcher") is None,
    reason="hydra-submitit-launcher not installed (pip install primus-ext[launchers])")


def test_validate_top_k_trains_the_top_two_and_reports_measured_steps(tmp_path):
    cwd, home, sweep = tmp_path / "cwd", tmp_path / "home", tmp_path / "sweep"
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env.update(PRIMUS_EXT_HOME=str(home), COLUMNS="200", MPLBACKEND="Agg",
               OMP_NUM_THREADS="1")
    args = ["-m", "hydra/sweeper=primus_tuner", "hydra/launcher=submitit_local",
            "model=llama3_debugmodel", "model.num_layers=2", "cluster.hardware=cpu",
            "cluster.num_nodes=1", "train.seq_length=128", "train.global_batch_size=4",
            "parallel.tp=1,2", "parallel.pp=1", "parallel.cp=1",
            "train.micro_batch_size=1", "train.recompute_granularity=null",
            "tune.space.sharding=[distributed_optimizer]", "tune.progress=false",
            "hydra.sweeper.validate_top_k=2", f"hydra.sweep.dir={sweep}"]
    res = subprocess.run([sys.executable, "-m", "primus_ext.cli", *args], cwd=cwd, env=env,
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    results = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    launched = [t for t in results["top"] if "job" in t]
    assert len(launched) == 2
    for entry in launched:
        job, proj = entry["job"], entry["projected"]
        assert job["verdict"] == "measured", job
        assert job["step_time_s"] > 0 and proj["step_time_s"] > 0
        assert job["step_time_s"] != pytest.approx(proj["step_time_s"], rel=1e-6)
    with open(sweep / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2
    for r in rows:
        print(f"rank {r['tuner_rank']} {r['layout']}: measured step "
              f"{float(r['step_time_s']):.3f} s, projected "
              f"{float(r['projected_step_time_s']):.3f} s")
    assert "job step s" in res.stdout and "job/proj." in res.stdout
