"""scripts/gpu_check.sh end to end with this CPU as the device (SHAPE=tiny): for a dense
and a MoE line, the drop-in's hybrid measurement and projection, a real training of the
same line, and the table of projected against real step time and memory -- the command
a GPU machine runs first, so it works the first time one is there."""
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


def test_gpu_check_runs_on_a_cpu(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT", "MASTER_ADDR",
                        "LOCAL_WORLD_SIZE")}
    env.update(OUT=str(tmp_path), PYTHON=sys.executable, OMP_NUM_THREADS="1",
               CUDA_VISIBLE_DEVICES="", SHAPE="tiny")
    res = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh")], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    # Progress on stderr: the plan with its memory, build, steps layer by layer, projection.
    for step in ("plan: ", "build: ", "layer 1 of ", "projection: "):
        assert step in res.stderr, step
    table = (tmp_path / "compare.txt").read_text()
    for case in ("dense", "moe"):
        proj = json.loads((tmp_path / f"{case}.projection.json").read_text())
        real = json.loads((tmp_path / f"{case}.timings.json").read_text())
        row = next(x for x in table.splitlines() if x.startswith(case + " "))
        assert f"{proj['step_time_s']:.4f}" in row and f"{real['median_step_s']:.4f}" in row
        m = proj["measurement"]
        assert m["times_stand_in"] and m["plan"] and "optimizer step" in " ".join(
            m["measured"])
        # Measured on this CPU and projected for it: the same wiring as on a GPU. A
        # wrong microbatch count or layer count would be off by integer factors; the
        # loaded shared CPU is noisy, so only a factor of 2 is asserted.
        ratio = proj["step_time_s"] / real["median_step_s"]
        assert 0.5 < ratio < 2.0, (case, proj["step_time_s"], real["median_step_s"])
