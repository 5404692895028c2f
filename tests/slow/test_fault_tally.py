"""scripts/fault_tally.py (issue 15): every bad input and fault of its explicit list and
of a short derandomized fuzz ends "clear" or "survived"."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_fault_tally_leaves_only_clear_and_survived(tmp_path):
    env = {**os.environ, "PRIMUS_EXT_HOME": str(tmp_path), "OMP_NUM_THREADS": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "fault_tally.py"),
                          "--quick"], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=900)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    total = [x for x in run.stdout.splitlines() if x.startswith("total")][0].split()
    assert [int(v) for v in total[3:]] == [0, 0, 0, 0], total  # unclear .. hang
