"""The block hooks in a real torchtitan Trainer (one process): every block and the
embedding and output scopes are timed in forward and backward once per microbatch, and
under activation checkpointing the recomputed forward of each block is seen (the hooks
sit on the block inside torchtitan's checkpoint wrapper, whose own hooks fire only for the
first forward)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("torchtitan")

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
MICROBATCHES = 2  # global batch 2 of local batch 1: two accumulated microbatches a step
_DIST = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
         "MASTER_PORT", "TORCHELASTIC_RUN_ID")


def _samples(mode: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in _DIST}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    res = subprocess.run([sys.executable, str(ROOT / "tests/slow/torchtitan_hooks_worker.py"),
                          mode], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    line = next(x for x in res.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


@pytest.mark.parametrize("mode", ["none", "full"])
def test_blocks_timed_once_per_microbatch(mode):
    got = _samples(mode)
    for scope in ("layer.0", "layer.1", "embedding", "output"):
        for phase in ("fwd", "bwd"):
            assert got[f"{scope}|{phase}"] == [MICROBATCHES] * 2, (scope, phase, got)
    recomputed = {k for k in got if k.endswith("|recompute")}
    if mode == "full":
        assert recomputed == {"layer.0|recompute", "layer.1|recompute"}
        assert got["layer.0|recompute"] == [MICROBATCHES] * 2
    else:
        assert not recomputed
