"""The CPU proof end to end at a small scale: measure once (a TP target on its TP ranks),
project, run for real (``scripts/cpu_proof.py --quick``), and check the projection is
the right order of magnitude. The bound is loose on purpose: the machine is shared and a busy neighbour
during a real run shows up as error (the accuracy itself is reported, not asserted, by
``scripts/cpu_proof.py --write`` in docs/cpu-proof.md). MoE over gloo waits on its peer
at every all-to-all, which a loaded machine stretches most: its bound is wider.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("megatron.core")

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
BOUND = {"layers_x4": 5.0, "pp2": 5.0, "dp2": 5.0, "tp2": 5.0, "ep2": 10.0}


def test_projection_tracks_real_runs(tmp_path):
    out = tmp_path / "proof.json"
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "cpu_proof.py"), "--quick",
                          "--iters", "4", "--repeats", "2", "--json", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [r["config"] for r in rows] == list(BOUND)
    for r in rows:
        ratio = r["projected_step_s"] / r["measured_step_s"]
        bound = BOUND[r["config"]]
        assert 1 / bound < ratio < bound, (r["config"], r["projected_step_s"],
                                           r["measured_step_s"])
    assert "config" in res.stdout and "error" in res.stdout
