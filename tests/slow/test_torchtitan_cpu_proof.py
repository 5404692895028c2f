"""The torchtitan CPU proof end to end at a small scale (``scripts/cpu_proof_torchtitan.py
--quick``): measure in one process, project, train torchtitan's Trainer for real; the
projection must be the right order of magnitude. The bound is loose on purpose: the
machine is shared and a busy neighbour during a real run shows up as error (the accuracy
itself is reported by ``--write`` in docs/cpu-proof-torchtitan.md, not asserted).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("torchtitan")

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
BOUND = {"fsdp2": 5.0, "tp2": 10.0, "pp2": 5.0}


def test_projection_tracks_real_torchtitan_runs(tmp_path):
    out = tmp_path / "proof.json"
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "cpu_proof_torchtitan.py"),
                          "--quick", "--iters", "5", "--repeats", "2", "--json", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [r["config"] for r in rows] == list(BOUND)
    for r in rows:
        ratio = r["projected_step_s"] / r["measured_step_s"]
        assert 1 / BOUND[r["config"]] < ratio < BOUND[r["config"]], (
            r["config"], r["projected_step_s"], r["measured_step_s"])
