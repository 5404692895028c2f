"""The drop-in as a user runs it: ``torchrun --nproc-per-node 1 launch/pretrain_gpt.py
<flags> --project-only`` on a CPU finishes (the contention probe's neighbour used to
inherit torchrun's agent-store settings and wait forever), writes its profile into the
run directory rather than the working directory, and its FLOPs self-check matches."""
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
TINY = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
        "--seq-length", "64", "--max-position-embeddings", "64", "--micro-batch-size", "1",
        "--global-batch-size", "4", "--bf16", "--swiglu", "--normalization", "RMSNorm",
        "--position-embedding-type", "rope", "--disable-bias-linear", "--mock-data",
        "--tokenizer-type", "NullTokenizer", "--vocab-size", "255", "--lr", "1e-4"]


def test_torchrun_project_only_finishes_on_a_cpu(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT", "MASTER_ADDR")}
    env.update(PRIMUS_EXT_HOME=str(tmp_path / "home"), OMP_NUM_THREADS="1",
               PYTHONPATH=str(ROOT), COLUMNS="200")
    torchrun = Path(sys.executable).with_name("torchrun")
    out = tmp_path / "projection.json"
    res = subprocess.run(
        [str(torchrun), "--nproc-per-node", "1", str(ROOT / "launch" / "pretrain_gpt.py"),
         *TINY, "--project-only", "--target-hardware", "cpu", "--target-nodes", "1",
         "--target-gpus-per-node", "2", "--measure-warmup", "1", "--measure-repeats", "1",
         "--projection-out", str(out)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert not (tmp_path / "primus_ext_profile.json").exists()
    profiles = list((tmp_path / "home" / "runs").glob("*/primus_ext_profile.json"))
    assert len(profiles) == 1 and f"profile written to {profiles[0]}" in res.stdout
    flops = [x for x in res.stdout.splitlines() if "FLOPs" in x and "captured" in x]
    assert flops and all(x.rstrip().endswith("match") for x in flops), flops
    est = json.loads(out.read_text())
    assert est["config"]["model"]["num_layers"] == 2 and est["step_time_s"] > 0
    assert est["config"]["model"]["vocab_size"] == 256  # NullTokenizer: 255 + EOD
