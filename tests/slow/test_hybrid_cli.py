"""mode=measure writes a profile; mode=project backend=profile projects from it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("megatron.core")

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
COMMON = ["model=tiny_dense", "cluster.hardware=cpu", "train.seq_length=128",
          "train.global_batch_size=4", "train.attention_backend=unfused"]


def _app(args, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE",
                                                            "LOCAL_RANK", "MASTER_PORT")}
    env.update(PRIMUS_EXT_HOME=str(tmp_path / "home"), OMP_NUM_THREADS="1", COLUMNS="200",
               PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "primus_ext.cli", *args], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)


def test_measure_then_project(tmp_path):
    prof = tmp_path / "p.json"
    res = _app(["mode=measure", *COMMON, f"profile={prof}", "+measure.repeats=2",
                "+measure.warmup=1", "+measure.contention=false"], tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert prof.is_file() and "profile written to" in res.stdout
    res = _app(["mode=project", "backend=profile", f"profile={prof}", *COMMON,
                "model.num_layers=8", "output=json"], tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    est = json.loads(res.stdout)
    assert est["backend"].startswith("profile:") and est["step_time_s"] > 0
    assert any("measured layer times" in n for n in est["notes"])


def test_bad_measure_option_is_one_clear_error(tmp_path):
    res = _app(["mode=measure", *COMMON, "+measure.repeatz=2"], tmp_path)
    assert res.returncode == 2 and "measure.repeatz is not a measure option" in res.stderr


def test_torchtitan_target_is_measured_with_torchtitan(tmp_path):
    """framework=torchtitan measures torchtitan's own Trainer (its notes say so), not a
    megatron-core model of the same shape, and refuses megatron-core-only options."""
    pytest.importorskip("torchtitan")
    prof = tmp_path / "t.json"
    titan = ["mode=measure", "framework=torchtitan", "model=llama3_debugmodel",
             "cluster.hardware=cpu", "cluster.gpus_per_node=1", "train.seq_length=256",
             "train.global_batch_size=8", f"profile={prof}"]
    res = _app(titan + ["+measure.repeats=1", "+measure.warmup=0",
                        "+measure.contention=false"], tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    notes = json.loads(prof.read_text())["notes"]
    assert "framework: torchtitan" in notes
    res = _app(titan + ["+measure.microbench=false"], tmp_path)
    assert res.returncode == 2
    assert "measure.microbench is not a measure option of a torchtitan run" in res.stderr
