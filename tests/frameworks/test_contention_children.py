"""The contention probe's neighbour processes: a clean environment (no torchrun process
group to join) and no unbounded wait for them (the torchrun hang of the drop-in)."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

from primus_ext.frameworks.megatron.contention import neighbour_env, wait_ready

# What torchrun (torch/distributed/elastic/agent/server/api.py, _set_worker_envs)
# gives a rank: a neighbour that kept these would join the agent's store as a client.
TORCHRUN_ENV = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1", "ROLE_RANK": "0",
                "ROLE_NAME": "default", "ROLE_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": "29500", "TORCHELASTIC_USE_AGENT_STORE": "True",
                "TORCHELASTIC_RUN_ID": "none", "TORCHELASTIC_RESTART_COUNT": "0",
                "TORCHELASTIC_MAX_RESTARTS": "0", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
                "PATH": "/usr/bin", "OMP_NUM_THREADS": "2"}


def test_a_neighbour_inherits_no_process_group_settings():
    env = neighbour_env(TORCHRUN_ENV)
    assert env == {"PATH": "/usr/bin", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
                   "OMP_NUM_THREADS": "1"}


def _child(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)


def test_a_silent_neighbour_times_out_instead_of_hanging():
    p = _child("import time; time.sleep(60)")
    try:
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match="did not start within 1 s"):
            wait_ready([p], timeout_s=1.0)
        assert time.monotonic() - t0 < 30
    finally:
        p.kill()
        p.wait(timeout=30)


def test_a_neighbour_that_dies_is_an_error():
    p = _child("import sys; sys.exit(3)")
    try:
        with pytest.raises(RuntimeError, match="exited before it was ready"):
            wait_ready([p], timeout_s=60.0)
    finally:
        p.wait(timeout=30)


def test_ready_neighbours_pass():
    procs = [_child("print('ready', flush=True)") for _ in range(2)]
    try:
        wait_ready(procs, timeout_s=60.0)
    finally:
        for p in procs:
            p.wait(timeout=30)
