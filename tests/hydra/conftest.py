"""Helpers to run the primus-ext app in a subprocess of the venv's python."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

_TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                  "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT",
                  "PRIMUS_EXT_RUN_ID", "HYDRA_FULL_ERROR")


def _run_app(args, *, cwd: Path, home: Path, env: dict | None = None, timeout=300):
    """Run ``python -m primus_ext.cli ARGS`` in ``cwd`` with PRIMUS_EXT_HOME=home."""
    full_env = {k: v for k, v in os.environ.items() if k not in _TORCHRUN_VARS}
    full_env.update({"PRIMUS_EXT_HOME": str(home), "COLUMNS": "200", "MPLBACKEND": "Agg"})
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "primus_ext.cli", *args], cwd=cwd,
                          env=full_env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def dirs(tmp_path):
    cwd, home = tmp_path / "cwd", tmp_path / "home"
    cwd.mkdir()
    return cwd, home


@pytest.fixture
def run_app():
    """``run_app(args, cwd=, home=, env=)``: the app in a subprocess (CompletedProcess)."""
    return _run_app
