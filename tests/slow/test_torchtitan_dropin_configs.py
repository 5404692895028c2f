"""torchtitan's own model configs through the drop-in's default (hybrid) backend.

Each line names a config of torchtitan 0.3.0's registry as a user would
(``launch/torchtitan_train.py --module M --config C ... --project-only``). The measured
run is planned against this machine's budget, reads the generated local dataset
(torchtitan's ``c4`` loader would ask the Hub for ``allenai/c4``), keeps each rank's
shapes in a llama3-style decoder (Qwen3's head dim and q/k norms included) and says
what it leaves out; a run it cannot fit stops with one line and exit code 3.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("torchtitan")

pytestmark = pytest.mark.slow

_spec = importlib.util.spec_from_file_location(
    "hybrid_launch", Path(__file__).with_name("hybrid_launch.py"))
H = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(H)

ROOT = Path(__file__).resolve().parents[2]
LAUNCH = ROOT / "launch" / "torchtitan_train.py"
TARGET = ["--project-only", "--target-nodes", "2", "--target-hardware", "h100"]


def _run(args: list[str]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                        "MASTER_ADDR", "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, str(LAUNCH), *args, *TARGET], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)


def test_qwen3_moe_config_measures_and_says_what_it_left_out(tmp_path):
    out = tmp_path / "p.json"
    res = _run(["--module", "qwen3", "--config", "qwen3_30b_a3b",
                "--parallelism.expert_parallel_degree", "8",
                "--training.disable_cuda_graphs", "--projection-out", str(out)])
    H.skip_if_the_plan_finds_this_cpu_too_slow(res)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "primus-ext: plan: 1 layer(s) per kind" in res.stderr
    assert "model: measured as a llama3-style decoder with the target's per-rank dims, " \
           "without MoE layers (128 experts, top-8" in res.stdout
    assert "(the downscaled torchtitan run)" in res.stdout
    est = json.loads(out.read_text())
    assert est["config"]["framework"] == "torchtitan" and est["tokens_per_s_per_gpu"] > 0


def test_a_config_over_the_budget_stops_with_one_line():
    res = _run(["--module", "llama3", "--config", "llama3_8b", "--measure-memory-gib", "1"])
    assert res.returncode == 3, res.stderr[-3000:]
    assert "Traceback" not in res.stderr
    assert "primus-ext: the measurement does not fit cpu" in res.stderr
    assert "--projection-backend simulate" in res.stderr
